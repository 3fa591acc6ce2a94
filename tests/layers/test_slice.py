"""Slice: axis / slice_dim, slice_point or equal split, backward concatenation, errors."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(5)
X = RNG.standard_normal((4, 6, 2, 3))


@pytest.mark.parametrize("params,ntop,axis,points", [
    ("", 3, 1, [2, 4]),
    ("slice_point: 1 slice_point: 5", 3, 1, [1, 5]),
    ("axis: 0 slice_point: 3", 2, 0, [3]),
    ("slice_dim: 3", 3, 3, [1, 2]),
    ("axis: -2", 2, 2, [1]),
    ("axis: 2", 1, 2, []),
])
def test_forward_backward(mode, params, ntop, axis, points):
    layer, bottom, top = run_layer(f'type: "Slice" slice_param {{ {params} }}', [X], ntop=ntop)
    parts = np.split(X, points, axis=axis)
    assert len(top) == len(parts)
    for t, p in zip(top, parts):
        np.testing.assert_array_equal(t.cpu_data(), p)
    np.testing.assert_array_equal(bottom[0].cpu_diff(), np.concatenate([t.cpu_diff() for t in top], axis=axis))


@pytest.mark.parametrize("params,ntop,match", [
    ("", 4, "equal parts"),
    ("slice_point: 2", 3, "slice_point values for 3 tops"),
    ("slice_point: 3 slice_point: 2", 3, "increasing"),
    ("slice_point: 7", 2, "beyond"),
    ("axis: 1 slice_dim: 1", 2, "not both"),
])
def test_errors(params, ntop, match):
    with pytest.raises(caffe.NetError, match=match):
        run_layer(f'type: "Slice" slice_param {{ {params} }}', [X], ntop=ntop)


def test_gradient(mode):
    layer = make_layer('type: "Slice" slice_param { slice_point: 1 slice_point: 4 }')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([X[:2, :, :1]]), empty_blobs(3))


@pytest.mark.gpu
@pytest.mark.parametrize("params,ntop", [("", 3), ("axis: 3 slice_point: 1", 2), ("axis: 0 slice_point: 1 slice_point: 3", 3)])
def test_cpu_gpu_agree(params, ntop):
    assert_cpu_gpu_agree(f'type: "Slice" slice_param {{ {params} }}', [X], ntop=ntop)
