"""cuBLAS through ctypes, bound to the backend stream, with a row-major interface.

cuBLAS is column-major: a row-major ``C = op(A)·op(B)`` is computed as ``Cᵀ = op(B)ᵀ·op(A)ᵀ``
by swapping the operands (one adapter, :func:`gemm`, used by every layer). Pointers are device
addresses (ints); ``dtype`` selects the S or D routine for float32 and float64. The half types,
float16 and uint16 (bfloat16 bit patterns, :mod:`pycaffe_lite.precision`), go to cuBLAS's mixed
routines: ``cublasGemmEx`` / ``cublasGemmStridedBatchedEx`` (gemv too, as a GEMM with one column)
with half operands and output, fp32 compute (``CUBLAS_COMPUTE_32F``, tensor cores, default algo),
``cublasAxpyEx`` / ``cublasScalEx`` executing in fp32; ``dot`` and ``asum`` of half vectors sum in
fp32 in a kernel of their own (``blas_reduce.cu``) and return that float. Scalars (alpha, beta) are
float32 host values for the half types. Failing calls raise :class:`CudaError` with the cuBLAS
status name.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from pathlib import Path

import numpy as np

from ..errors import CudaError, GPUUnavailableError
from . import backend

OP_N, OP_T = 0, 1
WORKSPACE_BYTES = 32 * 1024 * 1024
DEFAULT_MATH, TF32_TENSOR_OP_MATH = 0, 3
# cudaDataType_t (library_types.h), cublasComputeType_t and cublasGemmAlgo_t (cublas_api.h)
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
HALF_TYPES = {np.dtype(np.float16): CUDA_R_16F, np.dtype(np.uint16): CUDA_R_16BF}  # storage -> cudaDataType
REDUCE_KERNELS = Path(__file__).with_name("blas_reduce.cu")

_STATUS = {
    0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
    7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
    15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR",
}


def _candidates() -> list[str]:
    """Where libcublas may live: CUDA_HOME/CUDA_PATH, NVIDIA's pip wheels, the loader path."""
    names = []
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        root = os.environ.get(var)
        if root:
            for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
                names += sorted(glob.glob(os.path.join(root, sub, "libcublas.so*")), reverse=True)
    for path in sys.path:
        names += sorted(glob.glob(os.path.join(path, "nvidia", "cu*", "lib", "libcublas.so*")), reverse=True)
        names += sorted(glob.glob(os.path.join(path, "nvidia", "cublas", "lib", "libcublas.so*")), reverse=True)
    found = ctypes.util.find_library("cublas")
    if found:
        names.append(found)
    names += ["libcublas.so", "libcublas.so.13", "libcublas.so.12", "libcublas.so.11"]
    names += sorted(glob.glob("/usr/local/cuda*/lib64/libcublas.so*"), reverse=True)
    return [n for n in names if "Lt" not in os.path.basename(n)]


class _Cublas:
    def __init__(self) -> None:
        errors = []
        lib: ctypes.CDLL | None = None
        for name in _candidates():
            try:
                lib = ctypes.CDLL(name)
                self.path = name
                break
            except OSError as exc:
                errors.append(f"{name}: {exc}")
        if lib is None:
            raise GPUUnavailableError(
                "cuBLAS library not found; set CUDA_HOME to the CUDA toolkit or install "
                "nvidia-cublas (tried: " + "; ".join(errors[:6]) + ")"
            )
        self.lib: ctypes.CDLL = lib
        self.stream_handle: int | None = None  # the backend stream this handle is bound to, set by handle()
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        for prefix, ct in (("S", ctypes.c_float), ("D", ctypes.c_double)):
            pc = ctypes.POINTER(ct)
            getattr(lib, f"cublas{prefix}gemm_v2").argtypes = [vp, i, i, i, i, i, pc, vp, i, vp, i, pc, vp, i]
            getattr(lib, f"cublas{prefix}gemmStridedBatched").argtypes = [
                vp, i, i, i, i, i, pc, vp, i, ll, vp, i, ll, pc, vp, i, ll, i]
            getattr(lib, f"cublas{prefix}gemv_v2").argtypes = [vp, i, i, i, pc, vp, i, vp, i, pc, vp, i]
            getattr(lib, f"cublas{prefix}axpy_v2").argtypes = [vp, i, pc, vp, i, vp, i]
            getattr(lib, f"cublas{prefix}scal_v2").argtypes = [vp, i, pc, vp, i]
            getattr(lib, f"cublas{prefix}dot_v2").argtypes = [vp, i, vp, i, vp, i, pc]
            getattr(lib, f"cublas{prefix}asum_v2").argtypes = [vp, i, vp, i, pc]
        fp = ctypes.POINTER(ctypes.c_float)
        # the mixed-precision routines the half types use (host scalars, cudaDataType_t as int)
        lib.cublasGemmEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i]
        lib.cublasGemmStridedBatchedEx.argtypes = [
            vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll, i, i, i]
        lib.cublasAxpyEx.argtypes = [vp, i, fp, i, vp, i, i, vp, i, i, i]
        lib.cublasScalEx.argtypes = [vp, i, fp, i, vp, i, i, i]
        lib.cublasSetStream_v2.argtypes = [vp, vp]
        lib.cublasSetMathMode.argtypes = [vp, i]
        self.handle = ctypes.c_void_p()
        self.check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        self.check(lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(backend.stream().handle)), "cublasSetStream")
        # A workspace we own, so GEMMs can be captured into CUDA graphs without cuBLAS allocating.
        lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
        self.workspace = backend.alloc(WORKSPACE_BYTES)
        self.check(lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(int(self.workspace)), WORKSPACE_BYTES),
                   "cublasSetWorkspace")
        self.tf32 = False

    def close(self) -> None:
        """Destroy the handle (its workspace returns to the pool when this object goes)."""
        if self.handle:
            self.lib.cublasDestroy_v2.argtypes = [ctypes.c_void_p]
            self.lib.cublasDestroy_v2(self.handle)
            self.handle = ctypes.c_void_p()

    def status_name(self, status: int) -> str:
        try:
            fn = self.lib.cublasGetStatusName
            fn.restype = ctypes.c_char_p
            fn.argtypes = [ctypes.c_int]
            return fn(status).decode()
        except AttributeError:
            return _STATUS.get(status, f"cuBLAS status {status}")

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise CudaError(f"{what} failed: {self.status_name(status)}")


def handle() -> _Cublas:
    """The cuBLAS handle of the current device, created on first use and bound to the stream."""
    st = backend.state()
    cache = backend.device_cache("cublas")
    h = cache.get("handle")
    if h is None or h.stream_handle != st.stream.handle:
        if h is not None:
            h.close()
        h = cache["handle"] = _Cublas()
        h.stream_handle = st.stream.handle
    return h


def set_allow_tf32(allow: bool) -> None:
    """Let float32 GEMMs use TF32 tensor cores (faster, ~10-bit mantissa inputs). Off by default."""
    global _tf32
    h = handle()
    h.check(h.lib.cublasSetMathMode(h.handle, TF32_TENSOR_OP_MATH if allow else DEFAULT_MATH), "cublasSetMathMode")
    h.tf32 = _tf32 = bool(allow)


_tf32 = False


def tf32_allowed() -> bool:
    """Whether :func:`set_allow_tf32` last allowed TF32 (creates no handle, needs no GPU)."""
    return _tf32


def _prefix(dtype) -> tuple[str, type]:
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return "S", ctypes.c_float
    if dtype == np.float64:
        return "D", ctypes.c_double
    raise CudaError(f"cuBLAS routines take float32, float64, float16 or bfloat16 (uint16), not {dtype}")


def half_type(dtype) -> int | None:
    """The cudaDataType_t of a half storage dtype (CUDA_R_16F for float16, CUDA_R_16BF for uint16,
    bfloat16's bit patterns); None for float32 and float64 (the S and D routines)."""
    return HALF_TYPES.get(np.dtype(dtype))


def _ptr(p: int, what: str) -> ctypes.c_void_p:
    if not p:
        raise CudaError(f"{what}: null device pointer")
    return ctypes.c_void_p(int(p))


def gemm(trans_a: bool, trans_b: bool, m: int, n: int, k: int, alpha: float, a: int, b: int,
         beta: float, c: int, dtype, lda: int | None = None, ldb: int | None = None,
         ldc: int | None = None, c_float: bool = False) -> None:
    """Row-major ``C(m,n) = alpha·op(A)·op(B) + beta·C`` with ``op(A)`` (m,k) and ``op(B)`` (k,n).

    ``A`` is stored (m,k), or (k,m) when ``trans_a``; ``B`` (k,n), or (n,k) when ``trans_b``.
    ``c_float`` (half ``dtype`` only): ``C`` is float32 (cuBLAS may split a long ``k`` and sum the
    parts in C's type; a float32 C keeps every partial sum in fp32).
    """
    if m == 0 or n == 0:
        return
    h = handle()
    lda = lda if lda is not None else max(1, m if trans_a else k)
    ldb = ldb if ldb is not None else max(1, k if trans_b else n)
    ldc = ldc if ldc is not None else max(1, n)
    ht = half_type(dtype)
    if ht is not None:
        h.check(h.lib.cublasGemmEx(
            h.handle, OP_T if trans_b else OP_N, OP_T if trans_a else OP_N, n, m, k,
            ctypes.byref(ctypes.c_float(alpha)), _ptr(b, "gemm B"), ht, ldb, _ptr(a, "gemm A"), ht, lda,
            ctypes.byref(ctypes.c_float(beta)), _ptr(c, "gemm C"), CUDA_R_32F if c_float else ht, ldc,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), "cublasGemmEx")
        return
    if c_float:
        raise CudaError(f"gemm: a float32 C is for half A and B (cublasGemmEx), not {np.dtype(dtype)}")
    p, ct = _prefix(dtype)
    h.check(getattr(h.lib, f"cublas{p}gemm_v2")(
        h.handle, OP_T if trans_b else OP_N, OP_T if trans_a else OP_N, n, m, k,
        ctypes.byref(ct(alpha)), _ptr(b, "gemm B"), ldb, _ptr(a, "gemm A"), lda,
        ctypes.byref(ct(beta)), _ptr(c, "gemm C"), ldc), f"cublas{p}gemm")


def gemm_strided_batched(trans_a: bool, trans_b: bool, m: int, n: int, k: int, alpha: float,
                         a: int, stride_a: int, b: int, stride_b: int, beta: float, c: int,
                         stride_c: int, batch: int, dtype, lda: int | None = None,
                         ldb: int | None = None, ldc: int | None = None) -> None:
    """:func:`gemm` over ``batch`` matrices, each ``stride_*`` elements after the previous."""
    if m == 0 or n == 0 or batch == 0:
        return
    h = handle()
    lda = lda if lda is not None else max(1, m if trans_a else k)
    ldb = ldb if ldb is not None else max(1, k if trans_b else n)
    ldc = ldc if ldc is not None else max(1, n)
    ht = half_type(dtype)
    if ht is not None:
        h.check(h.lib.cublasGemmStridedBatchedEx(
            h.handle, OP_T if trans_b else OP_N, OP_T if trans_a else OP_N, n, m, k,
            ctypes.byref(ctypes.c_float(alpha)), _ptr(b, "gemm B"), ht, ldb, stride_b, _ptr(a, "gemm A"), ht, lda,
            stride_a, ctypes.byref(ctypes.c_float(beta)), _ptr(c, "gemm C"), ht, ldc, stride_c, batch,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), "cublasGemmStridedBatchedEx")
        return
    p, ct = _prefix(dtype)
    h.check(getattr(h.lib, f"cublas{p}gemmStridedBatched")(
        h.handle, OP_T if trans_b else OP_N, OP_T if trans_a else OP_N, n, m, k,
        ctypes.byref(ct(alpha)), _ptr(b, "gemm B"), ldb, stride_b, _ptr(a, "gemm A"), lda, stride_a,
        ctypes.byref(ct(beta)), _ptr(c, "gemm C"), ldc, stride_c, batch), f"cublas{p}gemmStridedBatched")


def gemv(trans: bool, m: int, n: int, alpha: float, a: int, x: int, beta: float, y: int, dtype) -> None:
    """Row-major ``A`` (m,n): ``y = alpha·op(A)·x + beta·y``. Half types: a :func:`gemm` with one
    column (cuBLAS has no mixed-precision gemv)."""
    if m == 0 or n == 0:
        return
    if half_type(dtype) is not None:
        if trans:  # y (n) = A^T (n,m) . x (m)
            gemm(True, False, n, 1, m, alpha, a, x, beta, y, dtype, lda=n, ldb=1, ldc=1)
        else:  # y (m) = A (m,n) . x (n)
            gemm(False, False, m, 1, n, alpha, a, x, beta, y, dtype, lda=n, ldb=1, ldc=1)
        return
    h = handle()
    p, ct = _prefix(dtype)
    h.check(getattr(h.lib, f"cublas{p}gemv_v2")(
        h.handle, OP_N if trans else OP_T, n, m, ctypes.byref(ct(alpha)), _ptr(a, "gemv A"), n,
        _ptr(x, "gemv x"), 1, ctypes.byref(ct(beta)), _ptr(y, "gemv y"), 1), f"cublas{p}gemv")


def axpy(n: int, alpha: float, x: int, y: int, dtype) -> None:
    """``y += alpha·x`` (half types: executed in fp32)."""
    if n == 0:
        return
    h = handle()
    ht = half_type(dtype)
    if ht is not None:
        h.check(h.lib.cublasAxpyEx(h.handle, n, ctypes.byref(ctypes.c_float(alpha)), CUDA_R_32F,
                                   _ptr(x, "axpy x"), ht, 1, _ptr(y, "axpy y"), ht, 1, CUDA_R_32F), "cublasAxpyEx")
        return
    p, ct = _prefix(dtype)
    h.check(getattr(h.lib, f"cublas{p}axpy_v2")(h.handle, n, ctypes.byref(ct(alpha)), _ptr(x, "axpy x"), 1,
                                                 _ptr(y, "axpy y"), 1), f"cublas{p}axpy")


def scal(n: int, alpha: float, x: int, dtype) -> None:
    """``x *= alpha`` (half types: executed in fp32)."""
    if n == 0:
        return
    h = handle()
    ht = half_type(dtype)
    if ht is not None:
        h.check(h.lib.cublasScalEx(h.handle, n, ctypes.byref(ctypes.c_float(alpha)), CUDA_R_32F,
                                   _ptr(x, "scal x"), ht, 1, CUDA_R_32F), "cublasScalEx")
        return
    p, ct = _prefix(dtype)
    h.check(getattr(h.lib, f"cublas{p}scal_v2")(h.handle, n, ctypes.byref(ct(alpha)), _ptr(x, "scal x"), 1),
            f"cublas{p}scal")


def _no_capture(what: str) -> None:
    if backend.recording() is not None:
        raise CudaError(f"{what} returns a host value and cannot run inside a CUDA graph capture")


def _half_reduce(n: int, x: int, y: int, mode: int, dtype) -> float:
    """``blas_reduce`` (one block, fp32 sums): mode 0 ``sum x*y``, mode 1 ``sum |x|``."""
    out = backend.device_cache("blas").get("reduce_out")
    if out is None:
        out = backend.device_cache("blas")["reduce_out"] = backend.alloc(16)
    backend.kernel(REDUCE_KERNELS, "blas_reduce", dtype)(n, x, y, mode, int(out), block=REDUCE_THREADS, grid=1)
    result = np.zeros(1, np.float32)
    backend.memcpy_dtoh(result, int(out))
    return float(result[0])


REDUCE_THREADS = 1024  # blas_reduce.cu's BLAS_REDUCE_THREADS


def dot(n: int, x: int, y: int, dtype) -> float:
    """``x·y`` (waits for the stream: the result comes back to the host). Half types: products and
    sum in fp32 (``blas_reduce.cu``; cublasDotEx would round the result to the storage type)."""
    if n == 0:
        return 0.0
    _no_capture("blas.dot")
    if half_type(dtype) is not None:
        _ptr(x, "dot x"), _ptr(y, "dot y")
        return _half_reduce(n, int(x), int(y), 0, dtype)
    h = handle()
    p, ct = _prefix(dtype)
    out = ct()
    h.check(getattr(h.lib, f"cublas{p}dot_v2")(h.handle, n, _ptr(x, "dot x"), 1, _ptr(y, "dot y"), 1,
                                                ctypes.byref(out)), f"cublas{p}dot")
    return float(out.value)


def asum(n: int, x: int, dtype) -> float:
    """Sum of absolute values (waits for the stream). Half types: summed in fp32 (``blas_reduce.cu``)."""
    if n == 0:
        return 0.0
    _no_capture("blas.asum")
    if half_type(dtype) is not None:
        _ptr(x, "asum x")
        return _half_reduce(n, int(x), int(x), 1, dtype)
    h = handle()
    p, ct = _prefix(dtype)
    out = ct()
    h.check(getattr(h.lib, f"cublas{p}asum_v2")(h.handle, n, _ptr(x, "asum x"), 1, ctypes.byref(out)),
            f"cublas{p}asum")
    return float(out.value)
