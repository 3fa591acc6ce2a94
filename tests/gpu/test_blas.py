"""cuBLAS wrapper: row-major gemm (all transposes), strided-batched gemm, gemv, level-1 routines."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite.errors import CudaError
from pycaffe_lite.gpu import backend, blas

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_mode")]

DTYPES = [np.float32, np.float64]


def tol(dtype) -> dict:
    return {"rtol": 1e-5, "atol": 1e-5} if np.dtype(dtype) == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


class Dev:
    """A host array mirrored on the device (keeps the allocation alive)."""

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


def rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize(("m", "n", "k"), [(3, 5, 4), (1, 7, 2), (6, 1, 3), (4, 4, 4)])
def test_gemm_all_transposes(dtype, trans_a, trans_b, m, n, k):
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a = rand(rng, (k, m) if trans_a else (m, k), dtype)
    b = rand(rng, (n, k) if trans_b else (k, n), dtype)
    c = rand(rng, (m, n), dtype)
    alpha, beta = 1.5, 0.5
    expected = alpha * (a.T if trans_a else a) @ (b.T if trans_b else b) + beta * c
    A, B, C = Dev(a), Dev(b), Dev(c)
    blas.gemm(trans_a, trans_b, m, n, k, alpha, A.ptr, B.ptr, beta, C.ptr, dtype)
    np.testing.assert_allclose(C.get(), expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_beta_zero_ignores_nan_in_c(dtype):
    rng = np.random.default_rng(1)
    a, b = rand(rng, (2, 3), dtype), rand(rng, (3, 4), dtype)
    C = Dev(np.full((2, 4), np.nan, dtype))
    A, B = Dev(a), Dev(b)
    blas.gemm(False, False, 2, 4, 3, 1.0, A.ptr, B.ptr, 0.0, C.ptr, dtype)
    np.testing.assert_allclose(C.get(), a @ b, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_explicit_leading_dimensions(dtype):
    """Operate on sub-blocks: A = columns 1..3 of a (4, 6) matrix, C = columns 2..4 of a (4, 7)."""
    rng = np.random.default_rng(2)
    big_a, b, big_c = rand(rng, (4, 6), dtype), rand(rng, (3, 3), dtype), rand(rng, (4, 7), dtype)
    A, B, C = Dev(big_a), Dev(b), Dev(big_c)
    item = np.dtype(dtype).itemsize
    blas.gemm(False, False, 4, 3, 3, 1.0, A.ptr + 1 * item, B.ptr, 1.0, C.ptr + 2 * item, dtype,
              lda=6, ldc=7)
    expected = big_c.copy()
    expected[:, 2:5] += big_a[:, 1:4] @ b
    np.testing.assert_allclose(C.get(), expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("trans_a", "trans_b"), [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_strided_batched(dtype, trans_a, trans_b):
    rng = np.random.default_rng(3)
    batch, m, n, k = 3, 2, 5, 4
    a = rand(rng, (batch, k, m) if trans_a else (batch, m, k), dtype)
    b = rand(rng, (batch, n, k) if trans_b else (batch, k, n), dtype)
    c = rand(rng, (batch, m, n), dtype)
    alpha, beta = 0.75, -1.25
    opa = a.transpose(0, 2, 1) if trans_a else a
    opb = b.transpose(0, 2, 1) if trans_b else b
    expected = alpha * opa @ opb + beta * c
    A, B, C = Dev(a), Dev(b), Dev(c)
    blas.gemm_strided_batched(trans_a, trans_b, m, n, k, alpha, A.ptr, m * k, B.ptr, k * n, beta,
                              C.ptr, m * n, batch, dtype)
    np.testing.assert_allclose(C.get(), expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_strided_batched_shared_operand(dtype):
    """stride 0 reuses one weight matrix for every batch item (as convolution does)."""
    rng = np.random.default_rng(4)
    w, x = rand(rng, (3, 4), dtype), rand(rng, (5, 4, 6), dtype)
    W, X, Y = Dev(w), Dev(x), Dev(np.zeros((5, 3, 6), dtype))
    blas.gemm_strided_batched(False, False, 3, 6, 4, 1.0, W.ptr, 0, X.ptr, 24, 0.0, Y.ptr, 18, 5, dtype)
    np.testing.assert_allclose(Y.get(), np.einsum("ij,bjk->bik", w, x), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trans", [False, True])
def test_gemv(dtype, trans):
    rng = np.random.default_rng(5)
    m, n = 4, 7
    a = rand(rng, (m, n), dtype)
    x = rand(rng, n if not trans else m, dtype)
    y = rand(rng, m if not trans else n, dtype)
    alpha, beta = 2.0, 0.5
    expected = alpha * (a.T if trans else a) @ x + beta * y
    A, X, Y = Dev(a), Dev(x), Dev(y)
    blas.gemv(trans, m, n, alpha, A.ptr, X.ptr, beta, Y.ptr, dtype)
    np.testing.assert_allclose(Y.get(), expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy_scal_dot_asum(dtype):
    rng = np.random.default_rng(6)
    x, y = rand(rng, 1000, dtype), rand(rng, 1000, dtype)
    X, Y = Dev(x), Dev(y)
    blas.axpy(1000, -0.5, X.ptr, Y.ptr, dtype)
    np.testing.assert_allclose(Y.get(), y - 0.5 * x, **tol(dtype))
    blas.scal(1000, 3.0, X.ptr, dtype)
    np.testing.assert_allclose(X.get(), 3.0 * x, **tol(dtype))
    d = blas.dot(1000, X.ptr, Y.ptr, dtype)
    assert isinstance(d, float)
    np.testing.assert_allclose(d, np.dot(3.0 * x.astype(np.float64), (y - 0.5 * x).astype(np.float64)),
                               rtol=1e-4 if dtype == np.float32 else 1e-12)
    s = blas.asum(1000, Y.ptr, dtype)
    np.testing.assert_allclose(s, np.abs(y - 0.5 * x).sum(), rtol=1e-4 if dtype == np.float32 else 1e-12)


def test_empty_sizes_are_no_ops():
    assert blas.dot(0, 0, 0, np.float32) == 0.0
    assert blas.asum(0, 0, np.float64) == 0.0
    blas.gemm(False, False, 0, 3, 2, 1.0, 0, 0, 0.0, 0, np.float32)
    blas.axpy(0, 1.0, 0, 0, np.float32)
    blas.scal(0, 1.0, 0, np.float32)


def test_null_pointers_raise():
    C = Dev(np.zeros(4, np.float32))
    with pytest.raises(CudaError, match="null device pointer"):
        blas.gemm(False, False, 2, 2, 2, 1.0, 0, C.ptr, 0.0, C.ptr, np.float32)
    with pytest.raises(CudaError, match="null device pointer"):
        blas.axpy(4, 1.0, C.ptr, 0, np.float32)


def test_cublas_error_status_is_named():
    X = Dev(np.zeros(8, np.float32))
    with pytest.raises(CudaError, match="CUBLAS_STATUS_INVALID_VALUE"):
        # lda smaller than the row length is invalid
        blas.gemm(False, False, 2, 2, 4, 1.0, X.ptr, X.ptr, 0.0, X.ptr, np.float32, lda=1)


def test_status_name_fallback_table():
    assert blas.handle().status_name(7) == "CUBLAS_STATUS_INVALID_VALUE"
    assert blas._STATUS[13] == "CUBLAS_STATUS_EXECUTION_FAILED"


def test_handle_is_cached_and_bound_to_the_backend_stream():
    h = blas.handle()
    assert blas.handle() is h
    assert h.stream_handle == backend.stream().handle


def test_tf32_toggle():
    try:
        blas.set_allow_tf32(True)
        assert blas.handle().tf32
        rng = np.random.default_rng(7)
        a, b = rand(rng, (16, 16), np.float32), rand(rng, (16, 16), np.float32)
        A, B, C = Dev(a), Dev(b), Dev(np.zeros((16, 16), np.float32))
        blas.gemm(False, False, 16, 16, 16, 1.0, A.ptr, B.ptr, 0.0, C.ptr, np.float32)
        np.testing.assert_allclose(C.get(), a @ b, rtol=2e-2, atol=2e-2)  # TF32: ~1e-3 relative
    finally:
        blas.set_allow_tf32(False)
    assert not blas.handle().tf32
