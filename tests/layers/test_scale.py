"""Scale layer: learned or bottom-1 scale, optional bias, gradients, CPU/GPU agreement."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(1)
X = RNG.standard_normal((2, 3, 4, 2))


def bshape(x, v, axis):
    shape = [1] * x.ndim
    shape[axis : axis + v.ndim] = v.shape
    return v.reshape(shape)


def test_default_filler_is_one_and_bias_zero():
    layer, _, top = run_layer('type: "Scale" scale_param { bias_term: true }', [X])
    assert len(layer.blobs) == 2
    assert np.all(layer.blobs[0].cpu_data() == 1) and np.all(layer.blobs[1].cpu_data() == 0)
    np.testing.assert_allclose(top[0].cpu_data(), X)


@pytest.mark.parametrize("params,axis,sshape", [
    ("", 1, (3,)), ("axis: 1 num_axes: 2", 1, (3, 4)), ("axis: 2 num_axes: -1", 2, (4, 2)), ("num_axes: 0", 0, ()),
])
def test_param_scale_with_bias(params, axis, sshape):
    text = (f'type: "Scale" scale_param {{ {params} bias_term: true filler {{ type: "gaussian" }} '
            'bias_filler { type: "gaussian" } }')
    layer, bottom, top = run_layer(text, [X])
    s, b = layer.blobs[0].cpu_data(), layer.blobs[1].cpu_data()
    assert s.shape == sshape and b.shape == sshape
    np.testing.assert_allclose(top[0].cpu_data(), X * bshape(X, s, axis) + bshape(X, b, axis))
    dy = top[0].cpu_diff()
    red = tuple(i for i in range(X.ndim) if not axis <= i < axis + len(sshape))
    np.testing.assert_allclose(bottom[0].cpu_diff(), dy * bshape(X, s, axis))
    np.testing.assert_allclose(layer.blobs[0].cpu_diff(), 0.25 + (dy * X).sum(axis=red).reshape(sshape))
    np.testing.assert_allclose(layer.blobs[1].cpu_diff(), 0.25 + dy.sum(axis=red).reshape(sshape))


def test_bottom_scale():
    s = RNG.standard_normal((2, 3))
    layer, bottom, top = run_layer('type: "Scale" scale_param { axis: 0 bias_term: true }', [X, s])
    assert len(layer.blobs) == 1 and layer.blobs[0].shape == (2, 3)  # only the bias is a param
    np.testing.assert_allclose(top[0].cpu_data(), X * s[:, :, None, None])
    dy = top[0].cpu_diff()
    np.testing.assert_allclose(bottom[1].cpu_diff(), (dy * X).sum(axis=(2, 3)))  # assigned
    np.testing.assert_allclose(bottom[0].cpu_diff(), dy * s[:, :, None, None])


def test_in_place_keeps_input_for_scale_gradient(mode):
    layer = make_layer('type: "Scale" scale_param { filler { type: "uniform" min: 1 max: 2 } }')
    (b,) = blobs([X])
    layer.setup([b], [b])
    layer.forward([b], [b])
    s = layer.blobs[0].cpu_data().copy()
    np.testing.assert_allclose(b.cpu_data(), X * s[None, :, None, None])
    b.mutable_cpu_diff()[...] = 1.0
    layer.backward([b], [True], [b])
    np.testing.assert_allclose(layer.blobs[0].cpu_diff(), X.sum(axis=(0, 2, 3)))
    np.testing.assert_allclose(b.cpu_diff(), np.broadcast_to(s[None, :, None, None], X.shape))


def test_wrong_bottom_shape():
    with pytest.raises(caffe.NetError, match="does not match"):
        run_layer('type: "Scale"', [X, np.ones((4,))])


@pytest.mark.parametrize("text,arrays", [
    ('type: "Scale" scale_param { filler { type: "gaussian" } bias_term: true bias_filler { type: "gaussian" } }', [X]),
    ('type: "Scale" scale_param { axis: 0 num_axes: -1 filler { type: "gaussian" } }', [X]),
    ('type: "Scale" scale_param { bias_term: true }', [X, RNG.standard_normal((3, 4))]),
])
def test_gradient(mode, text, arrays):
    layer = make_layer(text)
    GradientChecker(1e-3, 1e-5).check(layer, blobs(arrays), empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("text,arrays", [
    ('type: "Scale" scale_param { filler { type: "gaussian" } bias_term: true bias_filler { type: "gaussian" } }', [X]),
    ('type: "Scale" scale_param { num_axes: 0 filler { type: "gaussian" } }', [X]),
    ('type: "Scale" scale_param { axis: 2 bias_term: true bias_filler { type: "gaussian" } }',
     [X, RNG.standard_normal((4, 2))]),
    ('type: "Scale" scale_param { axis: 0 }', [X, RNG.standard_normal((2, 3))]),  # inner 8: 128-bit passes
])
def test_cpu_gpu_agree(text, arrays):
    assert_cpu_gpu_agree(text, arrays)


BIG = RNG.standard_normal((16, 3, 32, 36))  # many reduction chunks per channel
ODD = RNG.standard_normal((5, 3, 7, 3))  # inner not a multiple of 4


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("x", [BIG, ODD], ids=["big", "odd"])
@pytest.mark.parametrize("propagate", [[True], [False]])  # fused dx, or the gradients alone
def test_cpu_gpu_agree_one_pass_backward(dtype, x, propagate):
    tol = {"rtol": 2e-4, "atol": 1e-3} if dtype == np.float32 else {"rtol": 1e-9, "atol": 1e-9}
    text = 'type: "Scale" scale_param { filler { type: "gaussian" } bias_term: true bias_filler { type: "gaussian" } }'
    assert_cpu_gpu_agree(text, [x], propagate=propagate, dtype=dtype, **tol)


@pytest.mark.gpu
def test_cpu_gpu_agree_bottom_scale_not_propagated():
    assert_cpu_gpu_agree('type: "Scale" scale_param { bias_term: true }', [ODD, RNG.standard_normal(3)],
                         propagate=[True, False])
