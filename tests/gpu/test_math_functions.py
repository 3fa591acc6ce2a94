"""pycaffe_lite.gpu.math_functions: every element-wise helper and reduction against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_mode")]

DTYPES = [np.float32, np.float64]
N = 1031  # not a multiple of the block size


def tol(dtype) -> dict:
    return {"rtol": 1e-5, "atol": 1e-6} if np.dtype(dtype) == np.float32 else {"rtol": 1e-12, "atol": 1e-13}


class Dev:
    def __init__(self, a: np.ndarray) -> None:
        self.a = np.ascontiguousarray(a)
        self.mem = backend.alloc(max(self.a.nbytes, 1))
        backend.memcpy_htod(int(self.mem), self.a)

    @property
    def ptr(self) -> int:
        return int(self.mem)

    def get(self) -> np.ndarray:
        out = np.empty_like(self.a)
        backend.memcpy_dtoh(out, self.ptr)
        return out


def data(dtype, n=N, seed=0, positive=False):
    x = np.random.default_rng(seed).standard_normal(n).astype(dtype)
    return np.abs(x) + dtype(0.1) if positive else x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [0.0, 2.5, -1.0])
def test_set(dtype, value):
    y = Dev(data(dtype))
    gm.set(N - 3, value, y.ptr, dtype)
    out = y.get()
    np.testing.assert_array_equal(out[: N - 3], np.full(N - 3, value, dtype))
    np.testing.assert_array_equal(out[N - 3:], y.a[N - 3:])  # only n elements written


@pytest.mark.parametrize("dtype", DTYPES)
def test_copy_and_self_copy(dtype):
    x, y = Dev(data(dtype, seed=1)), Dev(np.zeros(N, dtype))
    gm.copy(N, x.ptr, y.ptr, dtype)
    np.testing.assert_array_equal(y.get(), x.a)
    gm.copy(N, y.ptr, y.ptr, dtype)
    np.testing.assert_array_equal(y.get(), x.a)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("name", "fn"), [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                                          ("div", np.divide)])
def test_binary(dtype, name, fn):
    a, b = data(dtype, seed=2), data(dtype, seed=3, positive=True)
    A, B, Y = Dev(a), Dev(b), Dev(np.zeros(N, dtype))
    getattr(gm, name)(N, A.ptr, B.ptr, Y.ptr, dtype)
    np.testing.assert_allclose(Y.get(), fn(a, b), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_in_place(dtype):
    a, b = data(dtype, seed=4), data(dtype, seed=5)
    A, B = Dev(a), Dev(b)
    gm.mul(N, A.ptr, B.ptr, A.ptr, dtype)
    np.testing.assert_allclose(A.get(), a * b, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_scalar_scale_axpby(dtype):
    x, y = data(dtype, seed=6), data(dtype, seed=7)
    X, Y, Z = Dev(x), Dev(y), Dev(np.zeros(N, dtype))
    gm.add_scalar(N, 1.25, Y.ptr, dtype)
    np.testing.assert_allclose(Y.get(), y + dtype(1.25), **tol(dtype))
    gm.scale(N, -3.0, X.ptr, Z.ptr, dtype)
    np.testing.assert_allclose(Z.get(), -3.0 * x, **tol(dtype))
    gm.axpby(N, 0.5, X.ptr, 2.0, Y.ptr, dtype)
    np.testing.assert_allclose(Y.get(), 0.5 * x + 2.0 * (y + dtype(1.25)), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha", [2.0, 0.5, -1.0, 3.0])
def test_powx(dtype, alpha):
    a = data(dtype, seed=8, positive=True)
    A, Y = Dev(a), Dev(np.zeros(N, dtype))
    gm.powx(N, A.ptr, alpha, Y.ptr, dtype)
    np.testing.assert_allclose(Y.get(), np.power(a, dtype(alpha)), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("name", "fn", "positive"), [
    ("exp", np.exp, False), ("log", np.log, True), ("abs", np.abs, False), ("sqrt", np.sqrt, True),
    ("sign", np.sign, False)])
def test_unary(dtype, name, fn, positive):
    a = data(dtype, seed=9, positive=positive)
    if name == "sign":
        a[:5] = 0  # sign(0) == 0
    A, Y = Dev(a), Dev(np.zeros(N, dtype))
    getattr(gm, name)(N, A.ptr, Y.ptr, dtype)
    np.testing.assert_allclose(Y.get(), fn(a), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_bias(dtype):
    rows, cols = 7, 13
    y, bias = data(dtype, rows * cols, 10).reshape(rows, cols), data(dtype, cols, 11)
    Y, B = Dev(y), Dev(bias)
    gm.add_bias(rows, cols, B.ptr, Y.ptr, dtype)
    np.testing.assert_allclose(Y.get(), y + bias[None, :], **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num", "channels", "spatial"), [(2, 3, 5), (1, 4, 1), (3, 1, 17)])
def test_add_channel_bias(dtype, num, channels, spatial):
    y = data(dtype, num * channels * spatial, 12).reshape(num, channels, spatial)
    bias = data(dtype, channels, 13)
    Y, B = Dev(y), Dev(bias)
    gm.add_channel_bias(num, channels, spatial, B.ptr, Y.ptr, dtype)
    np.testing.assert_allclose(Y.get(), y + bias[None, :, None], **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num", "channels", "spatial"), [(2, 3, 5), (4, 2, 300), (1, 1, 1), (3, 7, 1)])
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
def test_channel_sum(dtype, num, channels, spatial, beta):
    x = data(dtype, num * channels * spatial, 14).reshape(num, channels, spatial)
    out0 = data(dtype, channels, 15)
    if beta == 0.0:
        out0[:] = np.nan  # BLAS semantics: beta == 0 overwrites whatever the output held
    X, OUT = Dev(x), Dev(out0)
    gm.channel_sum(num, channels, spatial, X.ptr, OUT.ptr, dtype, beta=beta)
    expected = x.astype(np.float64).sum(axis=(0, 2))
    if beta != 0.0:
        expected = expected + beta * out0.astype(np.float64)
    np.testing.assert_allclose(OUT.get(), expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta", [0.0, 1.0, -2.0])
def test_sum_rows_into(dtype, beta):
    rows, cols = 9, 6
    x, y = data(dtype, rows * cols, 16).reshape(rows, cols), data(dtype, cols, 17)
    if beta == 0.0:
        y[:] = np.nan  # overwritten, as BLAS does for beta == 0
    X, Y = Dev(x), Dev(y)
    gm.sum_rows_into(rows, cols, X.ptr, Y.ptr, dtype, beta)
    expected = x.sum(axis=0) + (beta * y if beta else 0)
    np.testing.assert_allclose(Y.get(), expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_rows_into_more_rows_than_cached_ones(dtype):
    rows, cols = 3000, 2  # larger than the first ones vector (1024): it must grow
    gm.ones_vector(10, dtype)
    x = data(dtype, rows * cols, 18).reshape(rows, cols)
    X, Y = Dev(x), Dev(np.zeros(cols, dtype))
    gm.sum_rows_into(rows, cols, X.ptr, Y.ptr, dtype, 0.0)
    np.testing.assert_allclose(Y.get(), x.sum(axis=0), rtol=1e-4 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ones_vector(dtype):
    ptr = gm.ones_vector(2000, dtype)
    out = np.empty(2000, dtype)
    backend.memcpy_dtoh(out, ptr)
    np.testing.assert_array_equal(out, np.ones(2000, dtype))
    assert gm.ones_vector(5, dtype) == ptr  # cached: a shorter request reuses it


def test_zero_sized_calls_do_nothing():
    Y = Dev(np.arange(4, dtype=np.float32))
    gm.set(0, 5.0, Y.ptr, np.float32)
    gm.add(0, Y.ptr, Y.ptr, Y.ptr, np.float32)
    gm.channel_sum(0, 0, 3, Y.ptr, Y.ptr, np.float32)
    np.testing.assert_array_equal(Y.get(), np.arange(4, dtype=np.float32))
