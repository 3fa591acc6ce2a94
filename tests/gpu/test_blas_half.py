"""cuBLAS's mixed-precision routines behind ``blas`` for float16 and bfloat16 (uint16 bit patterns):
gemm (all transposes), strided-batched gemm, gemv (both orientations), axpy, scal, dot, asum,
against float64 numpy on the half-rounded operands.

Bound per element: ``u*|exact| + 2*k*2**-24*A + u*|beta*c|`` with ``u`` the format's unit roundoff
(2**-11 fp16, 2**-8 bf16), ``k`` the contraction length, ``A`` the same product of the absolute
values: fp32 products of half values are exact, fp32 accumulation is off by about k*2**-24 of A, and
the result is rounded to the storage type once (``beta*c`` enters the fp32 sum exactly).
``dot`` / ``asum`` return the fp32 sum itself (no rounding to the storage type).
"""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite import precision
from pycaffe_lite.gpu import backend, blas
from pycaffe_lite.schema import caffe_pb2

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_mode")]

FORMATS = {"fp16": (np.float16, caffe_pb2.FLOAT16, 2.0**-11), "bf16": (np.uint16, caffe_pb2.BFLOAT16, 2.0**-8)}


class Dev:
    """Half storage of float values on the device; ``values`` are the rounded values (float64)."""

    def __init__(self, a: np.ndarray, fmt: str) -> None:
        _, t, _ = FORMATS[fmt]
        self.t = t
        self.bits = np.ascontiguousarray(precision.from_float32(np.asarray(a, np.float32), t))
        self.values = precision.to_float32(self.bits, t).astype(np.float64)
        self.mem = backend.alloc(max(self.bits.nbytes, 2))
        backend.memcpy_htod(int(self.mem), self.bits)

    @property
    def ptr(self) -> int:
        return int(self.mem)

    def get(self) -> np.ndarray:
        out = np.empty_like(self.bits)
        backend.memcpy_dtoh(out, self.ptr)
        return precision.to_float32(out, self.t).astype(np.float64)


def _check(got, exact, bound, k, u, extra=0.0, what=""):
    tol = u * np.abs(exact) + 2 * k * 2.0**-24 * bound + u * np.abs(extra) + 1e-6
    err = np.abs(got - exact)
    assert np.all(err <= tol), f"{what}: worst error {np.max(err - tol):.3g} beyond the bound"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize(("m", "n", "k"), [(3, 5, 4), (1, 7, 2), (6, 1, 3), (33, 65, 300), (128, 64, 1000)])
def test_gemm_all_transposes(fmt, trans_a, trans_b, m, n, k):
    dtype, _, u = FORMATS[fmt]
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a = Dev(rng.standard_normal((k, m) if trans_a else (m, k)), fmt)
    b = Dev(rng.standard_normal((n, k) if trans_b else (k, n)), fmt)
    c = Dev(rng.standard_normal((m, n)), fmt)
    alpha, beta = 0.75, -0.5
    opa = a.values.T if trans_a else a.values
    opb = b.values.T if trans_b else b.values
    exact = alpha * opa @ opb + beta * c.values
    bound = abs(alpha) * np.abs(opa) @ np.abs(opb) + abs(beta) * np.abs(c.values)
    blas.gemm(trans_a, trans_b, m, n, k, alpha, a.ptr, b.ptr, beta, c.ptr, dtype)
    _check(c.get(), exact, bound, k, u, what=f"gemm {fmt}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_gemm_strided_batched(fmt):
    dtype, _, u = FORMATS[fmt]
    rng = np.random.default_rng(1)
    batch, m, n, k = 3, 20, 30, 70
    a = Dev(rng.standard_normal((batch, m, k)), fmt)
    b = Dev(rng.standard_normal((batch, n, k)), fmt)
    c = Dev(rng.standard_normal((batch, m, n)), fmt)
    exact = np.einsum("bmk,bnk->bmn", a.values, b.values) + c.values
    bound = np.einsum("bmk,bnk->bmn", np.abs(a.values), np.abs(b.values)) + np.abs(c.values)
    blas.gemm_strided_batched(False, True, m, n, k, 1.0, a.ptr, m * k, b.ptr, n * k, 1.0, c.ptr, m * n, batch, dtype)
    _check(c.get(), exact, bound, k, u, what=f"gemm_strided_batched {fmt}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("trans", [False, True])
def test_gemv(fmt, trans):
    dtype, _, u = FORMATS[fmt]
    rng = np.random.default_rng(2)
    m, n = 37, 300
    a = Dev(rng.standard_normal((m, n)), fmt)
    x = Dev(rng.standard_normal(m if trans else n), fmt)
    y = Dev(rng.standard_normal(n if trans else m), fmt)
    op = a.values.T if trans else a.values
    exact = 2.0 * op @ x.values + 0.5 * y.values
    bound = 2.0 * np.abs(op) @ np.abs(x.values) + 0.5 * np.abs(y.values)
    blas.gemv(trans, m, n, 2.0, a.ptr, x.ptr, 0.5, y.ptr, dtype)
    _check(y.get(), exact, bound, m if trans else n, u, what=f"gemv {fmt}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_level1(fmt):
    dtype, _, u = FORMATS[fmt]
    rng = np.random.default_rng(3)
    n = 5000
    x, y = Dev(rng.standard_normal(n), fmt), Dev(rng.standard_normal(n), fmt)
    blas.axpy(n, 0.3, x.ptr, y.ptr, dtype)
    _check(y.get(), 0.3 * x.values + y.values, 0.3 * np.abs(x.values) + np.abs(y.values), 1, u, what="axpy")
    z = Dev(rng.standard_normal(n), fmt)
    blas.scal(n, -1.7, z.ptr, dtype)
    _check(z.get(), -1.7 * z.values, 1.7 * np.abs(z.values), 1, u, what="scal")
    w = Dev(rng.standard_normal(n), fmt)
    got = blas.dot(n, x.ptr, w.ptr, dtype)
    assert abs(got - x.values @ w.values) <= 2 * n * 2.0**-24 * (np.abs(x.values) @ np.abs(w.values))
    assert abs(blas.asum(n, w.ptr, dtype) - np.abs(w.values).sum()) <= 2 * n * 2.0**-24 * np.abs(w.values).sum()

