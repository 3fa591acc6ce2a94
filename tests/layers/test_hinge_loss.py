"""HingeLoss (L1, L2): losses and gradients against a loop, label checks, gradient checks,
CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def naive(x, labels, norm):
    n = x.shape[0]
    s = x.reshape(n, -1)
    loss, grad = 0.0, np.zeros_like(s)
    for i in range(n):
        for j in range(s.shape[1]):
            sign = -1.0 if j == int(labels[i]) else 1.0
            d = max(0.0, 1 + sign * s[i, j])
            if norm == "L1":
                loss += d
                grad[i, j] = sign * (1.0 if d > 0 else 0.0) / n
            else:
                loss += d * d
                grad[i, j] = 2 * sign * d / n
    return loss / n, grad.reshape(x.shape)


def run(norm, x, labels, weight=1.0, dtype=np.float64):
    layer = make_layer(f"type: 'HingeLoss' hinge_loss_param {{ norm: {norm} }}", dtype)
    bottom, top = blobs([x, labels], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = weight
    layer.backward(top, [True, False], bottom)
    return layer, bottom, top


def test_hand_checked(mode):
    x = np.array([[2.0, 0.5, -3.0], [0.0, 0.0, 0.0]])
    labels = np.array([0.0, 2.0])
    # row 0: d = [max(0, 1-2), 1.5, 0]; row 1: d = [1, 1, 1]
    _, bottom, top = run("L1", x, labels)
    np.testing.assert_allclose(top[0].data, (1.5 + 3) / 2, rtol=1e-14)
    np.testing.assert_allclose(bottom[0].diff, [[0, 0.5, 0], [0.5, 0.5, -0.5]], rtol=1e-14)
    _, bottom, top = run("L2", x, labels, weight=3.0)
    np.testing.assert_allclose(top[0].data, (2.25 + 3) / 2, rtol=1e-14)
    np.testing.assert_allclose(bottom[0].diff, 3 * np.array([[0, 1.5, 0], [1, 1, -1]]), rtol=1e-14)


def test_default_norm_is_l1():
    layer = make_layer("type: 'HingeLoss'")
    bottom, top = blobs([np.array([[0.3, -0.2]]), np.array([1.0])]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, 1.3 + 1.2, rtol=1e-14)


@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_random_against_loop(mode, norm):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 2, 1)) * 2
    labels = rng.integers(0, 6, (4, 1, 1, 1)).astype(float)
    _, bottom, top = run(norm, x, labels, weight=0.5)
    loss, grad = naive(x, labels.ravel(), norm)
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, 0.5 * grad, rtol=1e-12)


def test_label_checks(mode):
    layer = make_layer("type: 'HingeLoss'")
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    with pytest.raises(ShapeError, match="one value per sample"):
        layer.setup(blobs([np.ones((2, 3)), np.zeros((2, 2))]), empty_blobs(1))
    layer = make_layer("type: 'HingeLoss'")
    bottom, top = blobs([np.ones((2, 3)), np.array([0.0, -1.0])]), empty_blobs(1)
    layer.setup(bottom, top)
    with pytest.raises(NetError, match=r"label -1 out of range"):
        layer.forward(bottom, top)
    layer, bottom, top = run("L1", np.ones((2, 3)), np.zeros(2))
    with pytest.raises(NetError, match="cannot backpropagate to label"):
        layer.backward(top, [True, True], bottom)


@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_gradient(mode, norm):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4))
    labels = np.array([0.0, 3.0, 1.0])
    layer = make_layer(f"type: 'HingeLoss' hinge_loss_param {{ norm: {norm} }}")
    # kinks where 1 ± x = 0: skip scores within 0.01 of ±1
    x[np.abs(np.abs(x) - 1) < 0.01] += 0.05
    GradientChecker(1e-4, 1e-4).check(layer, blobs([x, labels]), empty_blobs(1), check_bottom=[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm", ["L1", "L2"])
@pytest.mark.parametrize("shape", [(6, 5), (40, 3000)])  # the second spans many reduction blocks
def test_cpu_gpu_agree(dtype, norm, shape):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape) * 2
    labels = rng.integers(0, shape[1], shape[0]).astype(float)
    tol = 2e-5 if dtype == np.float32 else 1e-11
    assert_cpu_gpu_agree(f"type: 'HingeLoss' hinge_loss_param {{ norm: {norm} }}", [x, labels],
                         propagate=[True, False], dtype=dtype, rtol=tol, atol=tol)
