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


# -- vectorized per-channel maps, multi-input sums, row copies ------------------------------------
# Shapes (outer, dim, inner): 128-bit units (inner % 4 == 0), odd inner, one element, rows (inner 1).
SHAPES = [(2, 3, 8), (3, 5, 7), (1, 1, 1), (4, 6, 1), (2, 3, 4097)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("terms", ["s", "b", "sb"])
@pytest.mark.parametrize("in_place", [False, True])
def test_channel_affine(dtype, shape, terms, in_place):
    outer, dim, inner = shape
    x, s, b = data(dtype, outer * dim * inner, 20), data(dtype, dim, 21), data(dtype, dim, 22)
    X, S, B = Dev(x), Dev(s), Dev(b)
    Y = X if in_place else Dev(np.zeros_like(x))
    gm.channel_affine(outer, dim, inner, X.ptr, S.ptr if "s" in terms else None, B.ptr if "b" in terms else None,
                      Y.ptr, dtype)
    v = x.reshape(shape)
    expected = (v * s[None, :, None] if "s" in terms else v) + (b[None, :, None] if "b" in terms else 0)
    np.testing.assert_allclose(Y.get().reshape(shape), expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_channel_affine_misaligned_pointer_falls_back_to_scalar(dtype):
    x = data(dtype, 1 + 2 * 3 * 8, 23)
    s = data(dtype, 3, 24)
    X, S = Dev(x), Dev(s)
    isz = np.dtype(dtype).itemsize
    gm.channel_affine(2, 3, 8, X.ptr + isz, S.ptr, None, X.ptr + isz, dtype)  # one element off
    out = X.get()
    assert out[0] == x[0]
    np.testing.assert_allclose(out[1:].reshape(2, 3, 8), x[1:].reshape(2, 3, 8) * s[None, :, None], **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 8, N, 40000])
@pytest.mark.parametrize("k", [1, 2, 4, 5, 9])
def test_weighted_sum(dtype, n, k):
    xs = [data(dtype, n, 30 + j) for j in range(k)]
    coeffs = [0.5 * j - 1.25 for j in range(k)]
    devs = [Dev(x) for x in xs]
    Y = devs[0]  # the output aliases the first input
    gm.weighted_sum(n, [d.ptr for d in devs], coeffs, Y.ptr, dtype)
    expected = sum(c * x.astype(np.float64) for c, x in zip(coeffs, xs))
    np.testing.assert_allclose(Y.get(), expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "cols", "src_stride", "dst_stride", "dst_off"),
                         [(3, 8, 8, 24, 8), (3, 5, 5, 12, 7), (1, 1, 1, 1, 0), (4, 12, 16, 12, 0)])
def test_copy_rows(dtype, rows, cols, src_stride, dst_stride, dst_off):
    src = data(dtype, rows * src_stride, 40)
    dst = data(dtype, dst_off + rows * dst_stride, 41)
    S, D = Dev(src), Dev(dst)
    isz = np.dtype(dtype).itemsize
    gm.copy_rows(rows, cols, S.ptr, src_stride, D.ptr + dst_off * isz, dst_stride, dtype)
    expected = dst.copy()
    for r in range(rows):
        expected[dst_off + r * dst_stride: dst_off + r * dst_stride + cols] = src[r * src_stride: r * src_stride + cols]
    np.testing.assert_array_equal(D.get(), expected)


# -- two-level per-channel reductions at odd and large sizes ----------------------------------------
RSHAPES = [(1, 1, 1), (1, 3, 1), (3, 2, 5), (2, 3, 4), (5, 2, 1003), (16, 3, 12544), (2, 700, 9)]


def _rtol(dtype):
    return {"rtol": 2e-4, "atol": 2e-3} if dtype == np.float32 else {"rtol": 1e-11, "atol": 1e-10}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", RSHAPES)
def test_channel_sum_odd_and_large(dtype, shape):
    x = data(dtype, int(np.prod(shape)), 50).reshape(shape)
    X, OUT = Dev(x), Dev(np.full(shape[1], np.nan, dtype))
    gm.channel_sum(*shape, X.ptr, OUT.ptr, dtype, beta=0.0)
    np.testing.assert_allclose(OUT.get(), x.astype(np.float64).sum(axis=(0, 2)), **_rtol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", RSHAPES)
@pytest.mark.parametrize("variant", ["plain", "shift", "fused_dx"])
def test_channel_dot(dtype, shape, variant):
    outer, dim, inner = shape
    a, b = data(dtype, outer * dim * inner, 51).reshape(shape), data(dtype, outer * dim * inner, 52).reshape(shape)
    shift, q = data(dtype, dim, 53), data(dtype, dim, 54)
    s0, d0 = data(dtype, dim, 55), data(dtype, dim, 56)
    A, B, SH, Q, SUM, DOT = Dev(a), Dev(b), Dev(shift), Dev(q), Dev(s0), Dev(d0)
    extra = {"shift": SH.ptr} if variant == "shift" else {"q": Q.ptr, "y": A.ptr} if variant == "fused_dx" else {}
    gm.channel_dot(outer, dim, inner, A.ptr, B.ptr, dtype, sum_a=SUM.ptr, dot=DOT.ptr, alpha=0.5,
                   beta_sum=1.0, beta_dot=-2.0, **extra)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if variant == "shift":
        b64 = b64 - shift[None, :, None]
    np.testing.assert_allclose(SUM.get(), 0.5 * a64.sum(axis=(0, 2)) + s0, **_rtol(dtype))
    np.testing.assert_allclose(DOT.get(), 0.5 * (a64 * b64).sum(axis=(0, 2)) - 2.0 * d0, **_rtol(dtype))
    if variant == "fused_dx":  # y = a * q[c], written over a
        np.testing.assert_allclose(A.get(), a * q[None, :, None], **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_channel_dot_single_output(dtype):
    shape = (3, 4, 6)
    a, b = data(dtype, 72, 57).reshape(shape), data(dtype, 72, 58).reshape(shape)
    A, B, DOT = Dev(a), Dev(b), Dev(np.full(4, np.nan, dtype))
    gm.channel_dot(*shape, A.ptr, B.ptr, dtype, dot=DOT.ptr)
    np.testing.assert_allclose(DOT.get(), (a.astype(np.float64) * b).sum(axis=(0, 2)), **_rtol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", RSHAPES)
def test_channel_moments(dtype, shape):
    x = (data(dtype, int(np.prod(shape)), 59) * dtype(3) + dtype(20)).reshape(shape)  # mean far from 0
    X, MEAN, VAR = Dev(x), Dev(np.zeros(shape[1], dtype)), Dev(np.zeros(shape[1], dtype))
    gm.channel_moments(*shape, X.ptr, MEAN.ptr, VAR.ptr, dtype)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(MEAN.get(), x64.mean(axis=(0, 2)), **_rtol(dtype))
    np.testing.assert_allclose(VAR.get(), x64.var(axis=(0, 2)), **_rtol(dtype))


def test_channel_affine_relu_needs_a_bias_alone():
    """The fused ReLU exists only after a bias alone; other combinations are refused, not run with
    a stand-in pointer."""
    for s, b in ((None, None), (1, 1), (1, None)):
        with pytest.raises(ValueError, match="bias alone"):
            gm.channel_affine(1, 1, 1, 1, s, b, 1, np.float32, relu=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5, 7), (4, 16, 64), (2, 3, 1)])
@pytest.mark.parametrize("in_place", [True, False])
def test_relu_backward_channel_sum(dtype, shape, in_place):
    outer, dim, inner = shape
    rng = np.random.default_rng(5)
    dy = rng.standard_normal(shape).astype(dtype)
    y = np.maximum(rng.standard_normal(shape), 0).astype(dtype)
    out0 = rng.standard_normal(dim).astype(dtype)
    d_dy, d_y, d_out = Dev(dy), Dev(y), Dev(out0)
    d_dx = d_dy if in_place else Dev(np.zeros(shape, dtype))
    gm.relu_backward_channel_sum(outer, dim, inner, d_dy.ptr, d_y.ptr, d_dx.ptr, d_out.ptr, dtype, beta=1.0)
    dx = dy * (y > 0)
    np.testing.assert_array_equal(d_dx.get(), dx)
    np.testing.assert_allclose(d_out.get(), out0 + dx.sum(axis=(0, 2)), **tol(dtype))
