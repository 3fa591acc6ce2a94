"""Axpy: a * x + y with a per (num, channel), gradients to all three, in place on y, errors."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(4)
A = RNG.standard_normal((2, 3, 1, 1))
X = RNG.standard_normal((2, 3, 4, 5))
Y = RNG.standard_normal((2, 3, 4, 5))


@pytest.mark.parametrize("ashape", [(2, 3, 1, 1), (2, 3)])
def test_forward_backward(mode, ashape):
    a = A.reshape(ashape)
    layer, bottom, top = run_layer('type: "Axpy"', [a, X, Y])
    out = np.empty_like(X)
    for n in range(2):
        for c in range(3):
            out[n, c] = A[n, c, 0, 0] * X[n, c] + Y[n, c]
    np.testing.assert_allclose(top[0].cpu_data(), out, rtol=1e-14)
    dy = top[0].cpu_diff()
    da = np.array([[np.vdot(dy[n, c], X[n, c]) for c in range(3)] for n in range(2)])
    np.testing.assert_allclose(bottom[0].cpu_diff().reshape(2, 3), da, rtol=1e-12)
    np.testing.assert_allclose(bottom[1].cpu_diff(), A * dy, rtol=1e-14)
    np.testing.assert_array_equal(bottom[2].cpu_diff(), dy)


def test_in_place_on_y(mode):
    layer = make_layer('type: "Axpy"')
    a, x, y = blobs([A, X, Y])
    layer.setup([a, x, y], [y])
    layer.forward([a, x, y], [y])
    np.testing.assert_allclose(y.cpu_data(), A * X + Y, rtol=1e-14)
    y.mutable_cpu_diff()[...] = 1.5
    layer.backward([y], [True, True, True], [a, x, y])
    np.testing.assert_allclose(x.cpu_diff(), A * 1.5 * np.ones_like(X))
    np.testing.assert_array_equal(y.cpu_diff(), 1.5)


def test_errors():
    with pytest.raises(caffe.NetError, match="one shape"):
        run_layer('type: "Axpy"', [A, X, Y[:, :, :2]])
    with pytest.raises(caffe.NetError, match=r"must have shape \(2, 3\)"):
        run_layer('type: "Axpy"', [A[:, :2], X, Y])
    with pytest.raises(caffe.NetError, match="bottom"):
        run_layer('type: "Axpy"', [X, Y])


def test_gradient(mode):
    layer = make_layer('type: "Axpy"')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([A, X[:, :, :2, :3], Y[:, :, :2, :3]]), empty_blobs(1))


@pytest.mark.gpu
def test_cpu_gpu_agree():
    assert_cpu_gpu_agree('type: "Axpy"', [A, X, Y])
    big = RNG.standard_normal((2, 3, 33, 17))
    assert_cpu_gpu_agree('type: "Axpy"', [A, big, big * 0.5], rtol=1e-12)


# A warp per row (1x1 .. 14x14 planes, S <= 1024) and a block per row (33x40); every subset of
# gradients; float32 too.
@pytest.mark.gpu
@pytest.mark.parametrize("spatial", [(1, 1), (3, 5), (14, 14), (33, 40)])
@pytest.mark.parametrize("propagate", [[True, True, True], [True, False, False], [False, True, True],
                                       [False, False, True], [True, True, False]])
def test_cpu_gpu_agree_plane_sizes(spatial, propagate):
    a = RNG.standard_normal((3, 5, 1, 1))
    x, y = RNG.standard_normal((3, 5) + spatial), RNG.standard_normal((3, 5) + spatial)
    assert_cpu_gpu_agree('type: "Axpy"', [a, x, y], propagate=propagate, rtol=1e-12)
    assert_cpu_gpu_agree('type: "Axpy"', [a, x, y], propagate=propagate, dtype=np.float32, rtol=1e-5, atol=1e-5)

