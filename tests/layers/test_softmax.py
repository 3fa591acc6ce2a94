"""Softmax layer: forward vs numpy on several axes, stability, backward formula, gradients,
CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import ShapeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def naive_softmax(x, axis):
    """Loop over every position except ``axis``; float64."""
    x = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        v = x[idx]
        e = np.exp(v - v.max())
        out[idx] = e / e.sum()
    return np.moveaxis(out, -1, axis)


CASES = [((2, 5), 1), ((2, 3, 2, 4), 1), ((2, 3, 4), 2), ((2, 3, 4), -1), ((4, 3), 0), ((3, 2, 2, 2), 3)]


@pytest.mark.parametrize("shape,axis", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_matches_naive(mode, shape, axis, dtype):
    x = np.random.default_rng(0).standard_normal(shape) * 3
    layer = make_layer(f"type: 'Softmax' softmax_param {{ axis: {axis} }}", dtype)
    bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape == shape
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(top[0].data, naive_softmax(x.astype(dtype), axis), rtol=tol, atol=tol)
    np.testing.assert_allclose(top[0].data.sum(axis=axis), 1.0, rtol=tol)


def test_hand_checked_and_stable(mode):
    # softmax([0, ln 2, ln 5]) = [1, 2, 5] / 8; adding 1000 must not overflow
    x = np.array([[0.0, np.log(2), np.log(5)], [1000.0, 1000 + np.log(2), 1000 + np.log(5)]])
    layer, bottom, top = make_layer("type: 'Softmax'"), blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, [[1 / 8, 2 / 8, 5 / 8]] * 2, rtol=1e-12)


def test_backward_formula(mode):
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 4, 3))
    layer, bottom, top = make_layer("type: 'Softmax'"), blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    y = naive_softmax(x, 1)
    expected = (dy - (dy * y).sum(axis=1, keepdims=True)) * y
    np.testing.assert_allclose(bottom[0].diff, expected, rtol=1e-11, atol=1e-14)


def test_bad_axis_raises():
    layer = make_layer("type: 'Softmax' softmax_param { axis: 3 }")
    with pytest.raises(ShapeError, match="axis 3"):
        layer.setup(blobs([np.zeros((2, 3))]), empty_blobs(1))


@pytest.mark.parametrize("shape,axis", [((2, 4), 1), ((2, 3, 2, 2), 1), ((2, 3, 3), 2), ((3, 2), 0), ((2, 45), 1)])
def test_gradient(mode, shape, axis):
    x = np.random.default_rng(2).standard_normal(shape)
    layer = make_layer(f"type: 'Softmax' softmax_param {{ axis: {axis} }}")
    GradientChecker(1e-3, 1e-4).check(layer, blobs([x]), empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axis", [((5, 10), 1), ((2, 3, 4, 5), 1), ((2, 3, 4), 2), ((3, 4), 0),
                                        ((3, 1000), 1), ((2, 37), 1), ((4, 1), 1), ((2, 3, 70), -1)])
def test_cpu_gpu_agree(dtype, shape, axis):
    x = np.random.default_rng(3).standard_normal(shape) * 5
    tol = 2e-5 if dtype == np.float32 else 1e-11
    assert_cpu_gpu_agree(f"type: 'Softmax' softmax_param {{ axis: {axis} }}", [x], dtype=dtype, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 3, 4), (3, 40)])  # per position; one warp per row (inner 1)
def test_gpu_in_place(gpu_mode, shape):
    x, dy = np.random.default_rng(4).standard_normal(shape), np.ones(shape)
    layer, (b,) = make_layer("type: 'Softmax'"), blobs([x])
    layer.setup([b], [b])
    layer.forward([b], [b])
    y = naive_softmax(x, 1)
    np.testing.assert_allclose(b.data, y, rtol=1e-12)
    b.diff[...] = dy
    layer.backward([b], [True], [b])
    np.testing.assert_allclose(b.diff, 0.0, atol=1e-14)  # constant dy: no gradient through softmax
