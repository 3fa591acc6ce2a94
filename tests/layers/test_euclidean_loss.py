"""EuclideanLoss: hand-checked loss, signed gradients for both bottoms scaled by the loss weight,
shape checks, gradient checks, CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import ShapeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def run(a, b, weight=1.0, propagate=(True, True), dtype=np.float64):
    layer = make_layer("type: 'EuclideanLoss'", dtype)
    bottom, top = blobs([a, b], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = weight
    layer.backward(top, list(propagate), bottom)
    return layer, bottom, top


def test_hand_checked(mode):
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    b = np.array([[0.0, 0.0], [3.0, 1.0]])
    # squares 1 + 4 + 0 + 9 = 14, / num 2 / 2 = 3.5
    _, bottom, top = run(a, b, weight=2.0)
    assert top[0].shape == ()
    np.testing.assert_allclose(top[0].data, 3.5)
    np.testing.assert_allclose(bottom[0].diff, 2.0 * (a - b) / 2)
    np.testing.assert_allclose(bottom[1].diff, -2.0 * (a - b) / 2)


def test_loss_weight_reported_by_forward():
    a, b = np.ones((3, 2)), np.zeros((3, 2))
    layer = make_layer("type: 'EuclideanLoss' loss_weight: 4")
    bottom, top = blobs([a, b]), empty_blobs(1)
    layer.setup(bottom, top)
    assert layer.forward(bottom, top) == pytest.approx(4 * 6 / 3 / 2)


@pytest.mark.parametrize("shape_a,shape_b", [((4, 3, 2), (4, 6)), ((5,), (5,))])
def test_numpy_reference_and_flattened_target(mode, shape_a, shape_b):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(shape_a), rng.standard_normal(shape_b)
    _, bottom, top = run(a, b, weight=0.5)
    d = a - b.reshape(a.shape)
    np.testing.assert_allclose(top[0].data, (d**2).sum() / a.shape[0] / 2, rtol=1e-13)
    np.testing.assert_allclose(bottom[1].diff, -0.5 * d.reshape(shape_b) / a.shape[0], rtol=1e-13)


def test_propagate_down_only_second():
    a, b = np.ones((2, 2)), np.zeros((2, 2))
    layer = make_layer("type: 'EuclideanLoss'")
    bottom, top = blobs([a, b]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    bottom[0].diff[...] = 9
    layer.backward(top, [False, True], bottom)
    assert np.all(bottom[0].diff == 9)
    np.testing.assert_allclose(bottom[1].diff, -0.5)
    assert layer.allow_force_backward(0) and layer.allow_force_backward(1)


@pytest.mark.parametrize("shapes", [[(2, 3), (3, 3)], [(2, 3), (2, 4)]])
def test_shape_mismatch_is_clear(shapes):
    layer = make_layer("type: 'EuclideanLoss'")
    with pytest.raises(ShapeError, match="EuclideanLoss"):
        layer.setup(blobs([np.zeros(s) for s in shapes]), empty_blobs(1))


def test_gradient(mode):
    rng = np.random.default_rng(1)
    layer = make_layer("type: 'EuclideanLoss'")
    GradientChecker(1e-3, 1e-4).check(layer, blobs([rng.standard_normal((3, 2, 2)), rng.standard_normal((3, 4))]),
                                      empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(5, 3, 4), (3, 100003)])  # the second spans many reduction blocks
def test_cpu_gpu_agree(dtype, shape):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal(shape), rng.standard_normal(shape)
    tol = 2e-5 if dtype == np.float32 else 1e-11
    assert_cpu_gpu_agree("type: 'EuclideanLoss'", [a, b], dtype=dtype, rtol=tol, atol=tol)
