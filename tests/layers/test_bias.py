"""Bias layer: learned or bottom-1 bias over axis/num_axes, gradients, CPU/GPU agreement."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4, 2))


def expect(x, b, axis):
    shape = [1] * x.ndim
    shape[axis : axis + b.ndim] = b.shape
    return x + b.reshape(shape)


@pytest.mark.parametrize(
    "params,axis,bshape",
    [("", 1, (3,)), ("axis: 0 num_axes: 2", 0, (2, 3)), ("axis: -2 num_axes: -1", 2, (4, 2)), ("num_axes: 0", 0, ())],
)
def test_param_bias_forward(params, axis, bshape):
    text = f'type: "Bias" bias_param {{ {params} filler {{ type: "gaussian" }} }}'
    layer, bottom, top = run_layer(text, [X])
    assert layer.blobs[0].shape == bshape
    np.testing.assert_allclose(top[0].cpu_data(), expect(X, layer.blobs[0].cpu_data(), axis))
    np.testing.assert_allclose(bottom[0].cpu_diff(), top[0].cpu_diff())
    dy = top[0].cpu_diff()
    red = tuple(i for i in range(X.ndim) if not axis <= i < axis + len(bshape))
    np.testing.assert_allclose(layer.blobs[0].cpu_diff(), 0.25 + dy.sum(axis=red).reshape(bshape))


def test_default_filler_is_zero():
    layer, _, top = run_layer('type: "Bias"', [X])
    assert np.all(layer.blobs[0].cpu_data() == 0)
    np.testing.assert_allclose(top[0].cpu_data(), X)


def test_bottom_bias_forward_backward():
    b = RNG.standard_normal((3, 4))
    layer, bottom, top = run_layer('type: "Bias"', [X, b])
    assert layer.blobs == []
    np.testing.assert_allclose(top[0].cpu_data(), expect(X, b, 1))
    # a bottom bias gradient is assigned, not accumulated
    np.testing.assert_allclose(bottom[1].cpu_diff(), top[0].cpu_diff().sum(axis=(0, 3)))


def test_shape_mismatch_errors():
    with pytest.raises(caffe.NetError, match="does not match"):
        run_layer('type: "Bias"', [X, np.zeros((4,))])
    with pytest.raises(caffe.NetError, match="exceeds"):
        run_layer('type: "Bias" bias_param { axis: 3 num_axes: 2 }', [X])


@pytest.mark.parametrize("text,arrays", [
    ('type: "Bias" bias_param { filler { type: "gaussian" } }', [X]),
    ('type: "Bias" bias_param { axis: 2 num_axes: -1 filler { type: "gaussian" } }', [X]),
    ('type: "Bias"', [X, RNG.standard_normal((3, 4))]),
])
def test_gradient(mode, text, arrays):
    layer = make_layer(text)
    bottom, top = blobs(arrays), empty_blobs(1)
    GradientChecker(1e-3, 1e-5).check(layer, bottom, top)


def test_in_place(mode):
    layer = make_layer('type: "Bias" bias_param { filler { type: "gaussian" } }')
    (b,) = blobs([X])
    layer.setup([b], [b])
    layer.forward([b], [b])
    np.testing.assert_allclose(b.cpu_data(), expect(X, layer.blobs[0].cpu_data(), 1))
    b.mutable_cpu_diff()[...] = 1.0
    layer.backward([b], [True], [b])
    np.testing.assert_allclose(b.cpu_diff(), 1.0)
    np.testing.assert_allclose(layer.blobs[0].cpu_diff(), X.size / 3)


@pytest.mark.gpu
@pytest.mark.parametrize("text,arrays", [
    ('type: "Bias" bias_param { filler { type: "gaussian" } }', [X]),
    ('type: "Bias" bias_param { axis: 0 num_axes: 0 filler { type: "gaussian" } }', [X]),
    ('type: "Bias" bias_param { axis: 1 }', [X, RNG.standard_normal((3, 4, 2))]),
    ('type: "Bias" bias_param { filler { type: "gaussian" } }', [RNG.standard_normal((16, 3, 32, 36))]),
    ('type: "Bias" bias_param { filler { type: "gaussian" } }', [RNG.standard_normal((5, 3, 7, 3))]),
    ('type: "Bias" bias_param { axis: 0 num_axes: 2 }', [X, RNG.standard_normal((2, 3))]),
])
def test_cpu_gpu_agree(text, arrays):
    assert_cpu_gpu_agree(text, arrays)
