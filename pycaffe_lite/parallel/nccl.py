"""NCCL through ctypes (as cuBLAS in :mod:`pycaffe_lite.gpu.blas`): discovery, unique ids,
communicators, and the collectives multi-GPU training uses, queued on a given CUDA stream.

The library is looked up, in order, where ``PYCAFFE_LITE_NCCL`` points (the file or its folder),
in the ``nvidia-nccl`` wheel's folder (``nvidia/nccl/lib/libnccl.so.2`` under any ``sys.path``
entry), then on the loader path. Without it, :func:`library` raises :class:`NCCLUnavailableError`
saying what to install; nothing else in pycaffe-lite needs NCCL. Failing calls raise
:class:`~pycaffe_lite.errors.CudaError` with NCCL's own error string.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

import numpy as np

from ..config import config
from ..errors import CudaError, GPUUnavailableError

UNIQUE_ID_BYTES = 128
SUM, AVG = 0, 4  # ncclRedOp_t
# ncclDataType_t of our storage types (uint16 holds bfloat16 bit patterns, pycaffe_lite.precision)
_DTYPES = {np.dtype(np.float32): 7, np.dtype(np.float64): 8, np.dtype(np.int64): 4, np.dtype(np.float16): 6,
           np.dtype(np.uint16): 9}
INSTALL_HINT = ("install NCCL with `pip install nvidia-nccl-cu13` (or nvidia-nccl-cu12 for CUDA 12), "
                "or set PYCAFFE_LITE_NCCL to the path of libnccl.so.2")


class NCCLUnavailableError(GPUUnavailableError):
    """NCCL cannot be loaded: multi-GPU training is not possible here."""


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


def candidates() -> list[str]:
    """Library paths to try, in order (see the module docstring)."""
    names: list[str] = []
    env = config.nccl
    if env:
        names += sorted(glob.glob(os.path.join(env, "libnccl.so*")), reverse=True) if os.path.isdir(env) else [env]
    for path in sys.path:
        names += sorted(glob.glob(os.path.join(path or ".", "nvidia", "nccl", "lib", "libnccl.so*")), reverse=True)
    found = ctypes.util.find_library("nccl")
    if found:
        names.append(found)
    names += ["libnccl.so.2", "libnccl.so"]
    return list(dict.fromkeys(names))


_lib: ctypes.CDLL | None = None
_load_error: str | None = None


def library() -> ctypes.CDLL:
    """The loaded NCCL library (loaded once); raises NCCLUnavailableError naming what to install."""
    global _lib, _load_error
    if _lib is not None:
        return _lib
    if _load_error is None:
        errors = []
        for name in candidates():
            try:
                lib = ctypes.CDLL(name)
                lib.ncclGetVersion  # noqa: B018  (an unrelated library of that name has no NCCL API)
            except (OSError, AttributeError) as exc:
                errors.append(f"{name}: {exc}")
                continue
            _declare(lib)
            lib.path = name  # type: ignore[attr-defined]  # where it was found, for messages
            _lib = lib
            return lib
        _load_error = "; ".join(errors[:6])
    raise NCCLUnavailableError(f"multi-GPU training needs NCCL, which was not found: {INSTALL_HINT} "
                               f"(tried: {_load_error})")


def available() -> bool:
    """Whether NCCL can be loaded (pycaffe's ``caffe.has_nccl()``)."""
    try:
        library()
    except NCCLUnavailableError:
        return False
    return True


def _declare(lib: ctypes.CDLL) -> None:
    vp, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    lib.ncclGetVersion.argtypes = [ctypes.POINTER(i)]
    lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(_UniqueId)]
    lib.ncclGetErrorString.argtypes = [i]
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(vp), i, _UniqueId, i]
    lib.ncclCommAbort.argtypes = [vp]
    lib.ncclCommDestroy.argtypes = [vp]
    lib.ncclCommGetAsyncError.argtypes = [vp, ctypes.POINTER(i)]
    lib.ncclAllReduce.argtypes = [vp, vp, sz, i, i, vp, vp]
    lib.ncclBroadcast.argtypes = [vp, vp, sz, i, i, vp, vp]
    lib.ncclAllGather.argtypes = [vp, vp, sz, i, vp, vp]


def check(status: int, what: str) -> None:
    """Raise CudaError for a failing NCCL status, with NCCL's message."""
    if status != 0:
        message = library().ncclGetErrorString(status)
        raise CudaError(f"{what} failed: {message.decode() if message else f'NCCL status {status}'} "
                        f"(set NCCL_DEBUG=WARN for NCCL's own diagnostics)")


def version() -> tuple[int, int, int]:
    """NCCL's (major, minor, patch)."""
    code = ctypes.c_int()
    check(library().ncclGetVersion(ctypes.byref(code)), "ncclGetVersion")
    v = code.value
    return (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100)


def new_unique_id() -> bytes:
    """A fresh NCCL unique id (128 bytes); every rank of one communicator must use the same one."""
    uid = _UniqueId()
    check(library().ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    return ctypes.string_at(ctypes.addressof(uid), UNIQUE_ID_BYTES)


def nccl_dtype(dtype) -> int:
    try:
        return _DTYPES[np.dtype(dtype)]
    except KeyError:
        raise CudaError(f"NCCL: no data type for {np.dtype(dtype)}") from None


class Communicator:
    """One rank of an NCCL communicator on the current CUDA device (``ncclCommInitRank``)."""

    def __init__(self, uid: bytes, nranks: int, rank: int) -> None:
        lib = library()
        if len(uid) != UNIQUE_ID_BYTES:
            raise CudaError(f"NCCL unique id must be {UNIQUE_ID_BYTES} bytes, got {len(uid)}")
        if not 0 <= rank < nranks:
            raise CudaError(f"NCCL: rank {rank} out of range for {nranks} ranks")
        self.nranks, self.rank = int(nranks), int(rank)
        uid_struct = _UniqueId.from_buffer_copy(bytes(uid))
        self.handle = ctypes.c_void_p()
        check(lib.ncclCommInitRank(ctypes.byref(self.handle), self.nranks, uid_struct, self.rank),
              f"ncclCommInitRank (rank {rank} of {nranks})")

    def async_error(self) -> int:
        """ncclCommGetAsyncError's status (0: none, 7: in progress)."""
        code = ctypes.c_int()
        library().ncclCommGetAsyncError(self.handle, ctypes.byref(code))
        return code.value

    def all_reduce(self, ptr: int, count: int, dtype, stream: int, op: int = SUM) -> None:
        """In place: ``ptr[:count]`` = op over ranks, queued on ``stream`` (a CUstream handle)."""
        check(library().ncclAllReduce(ptr, ptr, count, nccl_dtype(dtype), op, self.handle, stream), "ncclAllReduce")

    def broadcast(self, ptr: int, count: int, dtype, stream: int, root: int = 0) -> None:
        """In place: every rank's ``ptr[:count]`` becomes ``root``'s."""
        check(library().ncclBroadcast(ptr, ptr, count, nccl_dtype(dtype), root, self.handle, stream), "ncclBroadcast")

    def all_gather(self, send: int, recv: int, count: int, dtype, stream: int) -> None:
        """``recv[r*count:(r+1)*count]`` = rank r's ``send[:count]``."""
        check(library().ncclAllGather(send, recv, count, nccl_dtype(dtype), self.handle, stream), "ncclAllGather")

    def group(self) -> _Group:
        """``with comm.group(): ...`` fuses the collectives queued inside into one launch."""
        return _Group()

    def abort(self) -> None:
        """Stop this rank's pending collectives (safe from another thread; the comm is then gone)."""
        if self.handle:
            handle, self.handle = self.handle, ctypes.c_void_p()
            library().ncclCommAbort(handle)

    def destroy(self) -> None:
        if self.handle:
            handle, self.handle = self.handle, ctypes.c_void_p()
            check(library().ncclCommDestroy(handle), "ncclCommDestroy")


class _Group:
    def __enter__(self) -> None:
        check(library().ncclGroupStart(), "ncclGroupStart")

    def __exit__(self, exc_type, exc, tb) -> None:
        status = library().ncclGroupEnd()
        if exc_type is None:
            check(status, "ncclGroupEnd")
