"""MultinomialLogisticLoss: losses and gradients against a loop, the 1e-20 clamp, label checks,
gradient checks, CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer

THRESHOLD = float(np.float32(1e-20))


def naive(prob, labels):
    n = prob.shape[0]
    p = prob.reshape(n, -1)
    loss, grad = 0.0, np.zeros_like(p)
    for i in range(n):
        q = max(p[i, int(labels[i])], THRESHOLD)
        loss -= np.log(q)
        grad[i, int(labels[i])] = -1 / q / n
    return loss / n, grad.reshape(prob.shape)


def run(prob, labels, weight=1.0, dtype=np.float64):
    layer = make_layer("type: 'MultinomialLogisticLoss'", dtype)
    bottom, top = blobs([prob, labels], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = weight
    layer.backward(top, [True, False], bottom)
    return layer, bottom, top


def test_hand_checked(mode):
    prob = np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]])
    _, bottom, top = run(prob, np.array([0.0, 2.0]), weight=2.0)
    np.testing.assert_allclose(top[0].data, -(np.log(0.5) + np.log(0.8)) / 2, rtol=1e-14)
    np.testing.assert_allclose(bottom[0].diff, [[-2 / 0.5 / 2, 0, 0], [0, 0, -2 / 0.8 / 2]], rtol=1e-14)


def test_random_4d_and_clamp(mode):
    rng = np.random.default_rng(0)
    prob = rng.uniform(0, 1, (4, 3, 2, 1))
    labels = rng.integers(0, 6, (4, 1, 1, 1)).astype(float)
    prob.reshape(4, 6)[1, int(labels[1, 0, 0, 0])] = 0.0  # clamped at 1e-20
    _, bottom, top = run(prob, labels)
    loss, grad = naive(prob, labels.ravel())
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, grad, rtol=1e-12)
    assert np.isfinite(top[0].data)


def test_label_checks(mode):
    layer = make_layer("type: 'MultinomialLogisticLoss'")
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    with pytest.raises(ShapeError, match="one value per sample"):
        layer.setup(blobs([np.ones((2, 3)), np.zeros((2, 3))]), empty_blobs(1))
    layer = make_layer("type: 'MultinomialLogisticLoss'")
    bottom, top = blobs([np.ones((2, 3)), np.array([0.0, 3.0])]), empty_blobs(1)
    layer.setup(bottom, top)
    with pytest.raises(NetError, match=r"label 3 out of range.*\[0, 3\)"):
        layer.forward(bottom, top)
    layer, bottom, top = run(np.ones((2, 3)) / 3, np.zeros(2))
    with pytest.raises(NetError, match="cannot backpropagate to label"):
        layer.backward(top, [True, True], bottom)


def test_gradient(mode):
    rng = np.random.default_rng(1)
    prob = rng.uniform(0.2, 1, (3, 4))
    labels = np.array([0.0, 3.0, 1.0])
    layer = make_layer("type: 'MultinomialLogisticLoss'")
    GradientChecker(1e-4, 1e-4).check(layer, blobs([prob, labels]), empty_blobs(1), check_bottom=[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_gpu_agree(dtype):
    rng = np.random.default_rng(2)
    prob = rng.uniform(0, 1, (5, 7))
    labels = rng.integers(0, 7, 5).astype(float)
    prob[2, int(labels[2])] = 0
    tol = 2e-5 if dtype == np.float32 else 1e-11
    assert_cpu_gpu_agree("type: 'MultinomialLogisticLoss'", [prob, labels], propagate=[True, False], dtype=dtype,
                         rtol=tol, atol=tol)
