"""Crop: shape from bottom 1, offsets (none, one, per axis), scatter backward, errors."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(4)
X = RNG.standard_normal((2, 3, 5, 6))


@pytest.mark.parametrize("params,ref_shape,window", [
    ("", (2, 3, 3, 4), (slice(None), slice(None), slice(0, 3), slice(0, 4))),
    ("offset: 1", (2, 3, 3, 4), (slice(None), slice(None), slice(1, 4), slice(1, 5))),
    ("offset: 2 offset: 1", (2, 3, 3, 4), (slice(None), slice(None), slice(2, 5), slice(1, 5))),
    ("axis: 1 offset: 1 offset: 0 offset: 2", (7, 2, 4, 3), (slice(None), slice(1, 3), slice(0, 4), slice(2, 5))),
    ("axis: -1 offset: 3", (1, 1, 1, 2), (slice(None), slice(None), slice(None), slice(3, 5))),
])
def test_forward_backward(mode, params, ref_shape, window):
    ref = np.zeros(ref_shape)
    layer, bottom, top = run_layer(f'type: "Crop" crop_param {{ {params} }}', [X, ref], propagate=[True, False])
    np.testing.assert_array_equal(top[0].cpu_data(), X[window])
    expect = np.zeros_like(X)
    expect[window] = top[0].cpu_diff()
    np.testing.assert_array_equal(bottom[0].cpu_diff(), expect)


def test_errors():
    with pytest.raises(caffe.NetError, match="offset"):
        run_layer('type: "Crop" crop_param { offset: 1 offset: 1 offset: 1 }', [X, np.zeros((2, 3, 2, 2))])
    with pytest.raises(caffe.NetError, match="does not fit"):
        run_layer('type: "Crop" crop_param { offset: 3 }', [X, np.zeros((2, 3, 3, 3))])
    with pytest.raises(caffe.NetError, match="same number of axes"):
        run_layer('type: "Crop"', [X, np.zeros((2, 3, 3))])


def test_no_gradient_to_shape_bottom():
    assert make_layer('type: "Crop"').allow_force_backward(1) is False


def test_gradient(mode):
    layer = make_layer('type: "Crop" crop_param { offset: 1 offset: 2 }')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([X[:, :2], np.zeros((2, 2, 3, 3))]), empty_blobs(1), check_bottom=[0])


@pytest.mark.gpu
@pytest.mark.parametrize("params,ref_shape", [("offset: 1", (2, 3, 3, 4)), ("axis: 1 offset: 1 offset: 0 offset: 2", (2, 2, 4, 3))])
def test_cpu_gpu_agree(params, ref_shape):
    assert_cpu_gpu_agree(f'type: "Crop" crop_param {{ {params} }}', [X, np.zeros(ref_shape)], propagate=[True, False])
