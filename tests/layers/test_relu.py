"""ReLU layer: forward vs numpy, leaky slope, in place, gradients, CPU/GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def _x(shape=(2, 3, 4), seed=0):
    x = np.random.default_rng(seed).standard_normal(shape)
    x[np.abs(x) < 0.05] = 0.5  # keep away from the kink for gradient checks
    return x


@pytest.mark.parametrize("slope", [0.0, 0.1, -0.5])
def test_forward(mode, slope):
    x = _x()
    layer = make_layer(f'type: "ReLU" relu_param {{ negative_slope: {slope} }}')
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    slope = float(np.float32(slope))  # negative_slope is a float field in caffe.proto
    expected = np.where(x > 0, x, slope * x)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-15)


@pytest.mark.parametrize("slope", [0.0, 0.2])
def test_gradient(mode, slope):
    layer = make_layer(f'type: "ReLU" relu_param {{ negative_slope: {slope} }}')
    bottom, top = blobs([_x((2, 3, 2), 1)]), empty_blobs(1)
    GradientChecker(1e-3, 1e-4, kink=0.0, kink_range=0.01).check(layer, bottom, top)


@pytest.mark.parametrize("slope", [0.0, 0.3])
def test_in_place_forward_and_backward(mode, slope):
    x = _x()
    dy = np.random.default_rng(2).standard_normal(x.shape)
    layer = make_layer(f'type: "ReLU" relu_param {{ negative_slope: {slope} }}')
    (blob,) = blobs([x])
    layer.setup([blob], [blob])
    layer.forward([blob], [blob])
    np.testing.assert_allclose(blob.data, np.where(x > 0, x, slope * x))
    blob.diff[...] = dy
    layer.backward([blob], [True], [blob])
    np.testing.assert_allclose(blob.diff, np.where(x > 0, dy, slope * dy))


def test_backward_values_and_propagate_down():
    x = np.array([-2.0, 0.0, 3.0])
    layer = make_layer('type: "ReLU"')
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = [1.0, 2.0, 3.0]
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, [0.0, 0.0, 3.0])  # gradient 0 at x = 0
    bottom[0].diff[...] = 9
    layer.backward(top, [False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 9)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("slope", [0.0, 0.25])
def test_cpu_gpu_agree(dtype, slope):
    x = _x((3, 5, 7), 4)
    x.flat[:3] = [0.0, -0.0, 2.0]  # the kink itself: dx is 0 (slope 0) or slope * dy on both devices
    tol = {"rtol": 1e-6, "atol": 1e-7} if dtype == np.float32 else {}
    assert_cpu_gpu_agree(f'type: "ReLU" relu_param {{ negative_slope: {slope} }}', [x], dtype=dtype, **tol)


def test_backward_is_a_product_with_the_mask(mode):
    """Caffe's dy * (x > 0): an inf or NaN top diff gives NaN where x <= 0, not 0."""
    layer = make_layer('type: "ReLU"')
    bottom, top = blobs([np.array([-1.0, 0.0, 2.0, 3.0])]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = [np.inf, np.nan, np.inf, 1.0]
    with np.errstate(invalid="ignore"):
        layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, [np.nan, np.nan, np.inf, 1.0])
