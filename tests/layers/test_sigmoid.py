"""Sigmoid layer: forward vs numpy, stability, in place, gradients, CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer

TEXT = "type: 'Sigmoid'"


def reference(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (7,), (3, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_matches_numpy(mode, shape, dtype):
    x = np.random.default_rng(0).standard_normal(shape) * 3
    layer, bottom, top = make_layer(TEXT, dtype), blobs([x], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape == shape
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(top[0].data, reference(x.astype(dtype)), rtol=tol, atol=tol)


def test_known_values_and_no_overflow():
    x = np.array([0.0, 100.0, -100.0, np.log(3.0)])
    layer, bottom, top = make_layer(TEXT), blobs([x]), empty_blobs(1)
    with np.errstate(over="raise"):
        layer.setup(bottom, top)
        layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, [0.5, 1.0, 0.0, 0.75], atol=1e-14)


def test_backward_formula_in_place(mode):
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    layer, (b,) = make_layer(TEXT), blobs([x])
    layer.setup([b], [b])
    layer.forward([b], [b])
    y = reference(x)
    np.testing.assert_allclose(b.data, y, rtol=1e-13)
    b.diff[...] = dy
    layer.backward([b], [True], [b])
    np.testing.assert_allclose(b.diff, dy * y * (1 - y), rtol=1e-12)


def test_gradient(mode):
    x = np.random.default_rng(2).standard_normal((2, 3, 2, 2))
    GradientChecker(1e-3, 1e-4).check(make_layer(TEXT), blobs([x]), empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_gpu_agree(dtype):
    x = np.random.default_rng(3).standard_normal((4, 5, 3)) * 4
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert_cpu_gpu_agree(TEXT, [x], dtype=dtype, rtol=tol, atol=tol)
