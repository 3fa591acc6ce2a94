"""ContrastiveLoss (current and legacy): losses and gradients against a loop, margin cases,
gradient checks, CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def naive(a, b, y, margin, legacy):
    """(loss, grad_a) with Caffe's 1e-4 in the non-legacy dissimilar gradient."""
    n = a.shape[0]
    a2, b2 = a.reshape(n, -1), b.reshape(n, -1)
    loss, grad = 0.0, np.zeros_like(a2)
    for i in range(n):
        d = a2[i] - b2[i]
        dsq = float(d @ d)
        if int(y[i]):
            loss += dsq
            grad[i] = d / n
        elif legacy:
            loss += max(margin - dsq, 0.0)
            grad[i] = -d / n if margin - dsq > 0 else 0
        else:
            dist = np.sqrt(dsq)
            loss += max(margin - dist, 0.0) ** 2
            grad[i] = -(margin - dist) / (dist + 1e-4) * d / n if margin - dist > 0 else 0
    return loss / n / 2, grad.reshape(a.shape)


def text(margin=1.0, legacy=False):
    return (f"type: 'ContrastiveLoss' contrastive_loss_param {{ margin: {margin} "
            f"legacy_version: {'true' if legacy else 'false'} }}")


def run(a, b, y, margin=1.0, legacy=False, weight=1.0, dtype=np.float64):
    layer = make_layer(text(margin, legacy), dtype)
    bottom, top = blobs([a, b, y], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = weight
    layer.backward(top, [True, True, False], bottom)
    return layer, bottom, top


def _data(seed=0, n=6, c=3):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-0.6, 0.6, (n, c, 1, 1))
    b = rng.uniform(-0.6, 0.6, (n, c, 1, 1))
    y = (rng.uniform(size=(n, 1, 1, 1)) > 0.5).astype(float)
    y[0], y[1] = 1, 0
    return a, b, y


def test_hand_checked(mode):
    a = np.array([[3.0, 0.0], [0.3, 0.0], [2.0, 0.0]])
    b = np.zeros((3, 2))
    y = np.array([1.0, 0.0, 0.0])
    # similar d²=9; dissimilar d=0.3 inside margin 1: (0.7)²; dissimilar d=2 outside: 0
    _, bottom, top = run(a, b, y)
    np.testing.assert_allclose(top[0].data, (9 + 0.49) / 6, rtol=1e-14)
    expected = np.array([[3.0, 0.0], [-0.7 / (0.3 + 1e-4) * 0.3, 0.0], [0.0, 0.0]]) / 3
    np.testing.assert_allclose(bottom[0].diff, expected, rtol=1e-12)
    np.testing.assert_allclose(bottom[1].diff, -expected, rtol=1e-12)


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("margin", [1.0, 0.3])
def test_random_against_loop(mode, legacy, margin):
    a, b, y = _data()
    _, bottom, top = run(a, b, y, margin, legacy, weight=0.5)
    loss, grad = naive(a, b, y.ravel(), float(np.float32(margin)), legacy)  # proto margin is a float
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, 0.5 * grad, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(bottom[1].diff, -0.5 * grad, rtol=1e-12, atol=1e-15)


def test_two_axis_features_and_shape_errors():
    a, b, y = _data(1)
    _, _, top = run(a.reshape(6, 3), b.reshape(6, 3), y.ravel())
    np.testing.assert_allclose(top[0].data, naive(a, b, y.ravel(), 1.0, False)[0], rtol=1e-12)
    layer = make_layer(text())
    with pytest.raises(ShapeError, match="expected features"):
        layer.setup(blobs([np.zeros((2, 3, 2, 1)), np.zeros((2, 3, 2, 1)), np.zeros(2)]), empty_blobs(1))
    with pytest.raises(ShapeError, match="expected features"):
        make_layer(text()).setup(blobs([np.zeros((2, 3)), np.zeros((2, 4)), np.zeros(2)]), empty_blobs(1))


def test_labels_get_no_gradient():
    layer = make_layer(text())
    assert layer.allow_force_backward(0) and layer.allow_force_backward(1) and not layer.allow_force_backward(2)
    a, b, y = _data()
    layer, bottom, top = run(a, b, y)
    with pytest.raises(NetError, match=r"cannot backpropagate to label inputs \(bottom 2\)"):
        layer.backward(top, [True, True, True], bottom)


@pytest.mark.parametrize("legacy", [False, True])
def test_gradient(mode, legacy):
    a, b, y = _data(2, n=5, c=2)
    layer = make_layer(text(legacy=legacy))
    # the non-legacy gradient carries Caffe's +1e-4 in a denominator: ~1e-4/d relative error
    threshold = 1e-4 if legacy else 2e-3
    GradientChecker(1e-4, threshold).check(layer, blobs([a, b, y]), empty_blobs(1), check_bottom=[0, 1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("legacy", [False, True])
def test_cpu_gpu_agree(dtype, legacy):
    a, b, y = _data(3, n=9, c=4)
    tol = 2e-5 if dtype == np.float32 else 1e-11
    assert_cpu_gpu_agree(text(1.0, legacy), [a, b, y], propagate=[True, True, False], dtype=dtype, rtol=tol, atol=tol)
