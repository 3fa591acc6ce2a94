"""blas's half-precision plumbing without a GPU: a fake cuBLAS library interprets the arguments of
``cublasGemmEx`` / ``cublasGemmStridedBatchedEx`` / ``cublasAxpyEx`` / ``cublasScalEx`` as cuBLAS
documents them (column-major operands with their leading dimensions and transposes, host scalars,
type codes) on numpy buffers standing for device memory, so the row-major adapter (``gemm``'s
operand swap, ``gemv`` as a one-column GEMM, strides) is checked against numpy. The values are not
rounded here; rounding is the GPU tests' (tests/gpu/test_blas_half.py)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from pycaffe_lite.errors import CudaError
from pycaffe_lite.gpu import blas

DTYPES = [np.float16, np.uint16]


class FakeMemory:
    """Device pointers -> flat float64 buffers."""

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}
        self.next = 1 << 20

    def put(self, a: np.ndarray) -> int:
        ptr = self.next
        self.next += 1 << 20
        self.buffers[ptr] = np.array(a, dtype=np.float64).ravel().copy()
        return ptr

    def view(self, ptr) -> np.ndarray:
        if isinstance(ptr, np.ndarray):  # already a view (one matrix of a batch)
            return ptr
        ptr = ptr.value if isinstance(ptr, ctypes.c_void_p) else int(ptr)
        for base, buf in self.buffers.items():
            if base <= ptr < base + (1 << 20):
                return buf[ptr - base:]
        raise AssertionError(f"unknown device pointer {ptr}")


def _scalar(ref) -> float:
    return float(ref._obj.value)  # a ctypes.byref(c_float)


def _colmajor(buf: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    assert ld >= max(1, rows), (rows, ld)
    return np.stack([buf[j * ld: j * ld + rows] for j in range(cols)], axis=1)


class FakeLib:
    def __init__(self, mem: FakeMemory, types: list) -> None:
        self.mem, self.types = mem, types

    def _gemm(self, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo):
        assert compute == blas.CUBLAS_COMPUTE_32F and algo == blas.CUBLAS_GEMM_DEFAULT
        assert isinstance(alpha._obj, ctypes.c_float) and isinstance(beta._obj, ctypes.c_float)
        self.types.append((at, bt, ct))
        a = _colmajor(self.mem.view(A), k if ta else m, m if ta else k, lda)
        b = _colmajor(self.mem.view(B), n if tb else k, k if tb else n, ldb)
        c_buf = self.mem.view(C)
        c = _colmajor(c_buf, m, n, ldc)
        out = _scalar(alpha) * (a.T if ta else a) @ (b.T if tb else b) + _scalar(beta) * c
        for j in range(n):
            c_buf[j * ldc: j * ldc + m] = out[:, j]
        return 0

    def cublasGemmEx(self, h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo):
        return self._gemm(ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo)

    def cublasGemmStridedBatchedEx(self, h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct,
                                   ldc, sc, batch, compute, algo):
        for i in range(batch):
            self._gemm(ta, tb, m, n, k, alpha, self.mem.view(A)[i * sa:], at, lda, self.mem.view(B)[i * sb:], bt,
                       ldb, beta, self.mem.view(C)[i * sc:], ct, ldc, compute, algo)
        return 0

    def cublasAxpyEx(self, h, n, alpha, alpha_type, x, xt, incx, y, yt, incy, exec_type):
        assert alpha_type == exec_type == blas.CUDA_R_32F and incx == incy == 1
        self.types.append((xt, yt))
        self.mem.view(y)[:n] += _scalar(alpha) * self.mem.view(x)[:n]
        return 0

    def cublasScalEx(self, h, n, alpha, alpha_type, x, xt, incx, exec_type):
        assert alpha_type == exec_type == blas.CUDA_R_32F and incx == 1
        self.types.append((xt,))
        self.mem.view(x)[:n] *= _scalar(alpha)
        return 0


class FakeHandle:
    handle = ctypes.c_void_p(1)

    def __init__(self, lib) -> None:
        self.lib = lib

    def check(self, status, what) -> None:
        assert status == 0, what


@pytest.fixture
def fake(monkeypatch):
    mem, types = FakeMemory(), []
    monkeypatch.setattr(blas, "handle", lambda: FakeHandle(FakeLib(mem, types)))
    return mem, types


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_row_major_adapter(fake, dtype, trans_a, trans_b):
    mem, types = fake
    rng = np.random.default_rng(0)
    m, n, k = 5, 7, 3
    a = rng.standard_normal((k, m) if trans_a else (m, k))
    b = rng.standard_normal((n, k) if trans_b else (k, n))
    c = rng.standard_normal((m, n))
    pa, pb, pc = mem.put(a), mem.put(b), mem.put(c)
    blas.gemm(trans_a, trans_b, m, n, k, 0.5, pa, pb, -2.0, pc, dtype)
    want = 0.5 * (a.T if trans_a else a) @ (b.T if trans_b else b) - 2.0 * c
    np.testing.assert_allclose(mem.view(pc)[:m * n].reshape(m, n), want, rtol=1e-12)
    code = blas.half_type(dtype)
    assert types == [(code, code, code)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_float_c_takes_a_float32_output_type(fake, dtype):
    """c_float: A and B in the half type, C float32 (CUDA_R_32F); refused for float32/float64."""
    mem, types = fake
    a, b, c = np.ones((2, 3)), np.ones((3, 4)), np.zeros((2, 4))
    blas.gemm(False, False, 2, 4, 3, 1.0, mem.put(a), mem.put(b), 0.0, mem.put(c), dtype, c_float=True)
    code = blas.half_type(dtype)
    assert types == [(code, code, blas.CUDA_R_32F)]
    with pytest.raises(CudaError, match="float32 C"):
        blas.gemm(False, False, 2, 4, 3, 1.0, 1 << 20, 1 << 20, 0.0, 1 << 20, np.float32, c_float=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_strided_batched_adapter(fake, dtype):
    mem, _ = fake
    rng = np.random.default_rng(1)
    batch, m, n, k = 3, 4, 6, 5
    a, b, c = (rng.standard_normal(s) for s in ((batch, m, k), (batch, n, k), (batch, m, n)))
    pa, pb, pc = mem.put(a), mem.put(b), mem.put(c)
    blas.gemm_strided_batched(False, True, m, n, k, 1.0, pa, m * k, pb, n * k, 1.0, pc, m * n, batch, dtype)
    np.testing.assert_allclose(mem.view(pc)[:c.size].reshape(c.shape), np.einsum("bmk,bnk->bmn", a, b) + c,
                               rtol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trans", [False, True])
def test_gemv_is_a_one_column_gemm(fake, dtype, trans):
    mem, _ = fake
    rng = np.random.default_rng(2)
    m, n = 6, 9
    a = rng.standard_normal((m, n))
    x, y = rng.standard_normal(m if trans else n), rng.standard_normal(n if trans else m)
    pa, px, py = mem.put(a), mem.put(x), mem.put(y)
    blas.gemv(trans, m, n, 2.0, pa, px, 0.5, py, dtype)
    want = 2.0 * (a.T if trans else a) @ x + 0.5 * y
    np.testing.assert_allclose(mem.view(py)[:want.size], want, rtol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy_and_scal(fake, dtype):
    mem, types = fake
    x, y = np.arange(5.0), np.ones(5)
    px, py = mem.put(x), mem.put(y)
    blas.axpy(5, 3.0, px, py, dtype)
    np.testing.assert_allclose(mem.view(py)[:5], 3.0 * x + 1)
    blas.scal(5, -0.5, px, dtype)
    np.testing.assert_allclose(mem.view(px)[:5], -0.5 * x)
    code = blas.half_type(dtype)
    assert types == [(code, code), (code,)]


def test_float_types_keep_the_s_and_d_routines(fake):
    """float32/float64 never reach the Ex routines (the fake has no S/D routine: they would fail)."""
    for dtype in (np.float32, np.float64):
        with pytest.raises(AttributeError):
            blas.gemm(False, False, 2, 2, 2, 1.0, 1 << 20, 1 << 20, 0.0, 1 << 20, dtype)
