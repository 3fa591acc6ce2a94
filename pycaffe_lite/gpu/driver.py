"""The CUDA driver library (``libcuda.so.1``) through ctypes, for the calls PyCUDA does not wrap or
wraps badly: graph capture and replay (:mod:`.cuda_graph`) and page-locking memory the process
did not allocate (:func:`register_host`). ``check`` turns a ``CUresult`` into a CudaError naming
the call and the driver's error name."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from ..errors import CudaError

_lib = None
CU_MEMHOSTREGISTER_PORTABLE = 1
PAGE = 4096


def lib():
    """The driver library with the argument types of the functions used here (loaded once)."""
    global _lib
    if _lib is None:
        try:
            _lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaError(f"the CUDA driver library libcuda.so.1 cannot be loaded: {exc}") from None
        vp = ctypes.c_void_p
        _lib.cuStreamBeginCapture_v2.argtypes = [vp, ctypes.c_int]
        _lib.cuStreamEndCapture.argtypes = [vp, ctypes.POINTER(vp)]
        _lib.cuGraphInstantiateWithFlags.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_ulonglong]
        _lib.cuGraphLaunch.argtypes = [vp, vp]
        _lib.cuGraphExecDestroy.argtypes = [vp]
        _lib.cuGraphDestroy.argtypes = [vp]
        _lib.cuGraphGetNodes.argtypes = [vp, ctypes.POINTER(vp), ctypes.POINTER(ctypes.c_size_t)]
        _lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        _lib.cuMemHostRegister_v2.argtypes = [vp, ctypes.c_size_t, ctypes.c_uint]
        _lib.cuMemHostUnregister.argtypes = [vp]
    return _lib


def loaded() -> bool:
    """Whether :func:`lib` has loaded the library (nothing of it to release otherwise)."""
    return _lib is not None


def check(status: int, what: str) -> None:
    """CudaError naming ``what`` and the driver's error unless ``status`` is CUDA_SUCCESS."""
    if status != 0:
        name = ctypes.c_char_p()
        lib().cuGetErrorName(status, ctypes.byref(name))
        raise CudaError(f"{what} failed: {name.value.decode() if name.value else status}")


def register_host(array: np.ndarray) -> Callable[[], None]:
    """Page-lock the pages under ``array`` (memory this process did not allocate through CUDA, such as
    a shared-memory segment's mapping) for the current context; returns the function that unlocks
    them. The range is widened to whole pages (a mapping's pages exist around its bytes)."""
    start = array.__array_interface__["data"][0]
    first = start - start % PAGE
    end = start + array.nbytes
    size = -(-(end - first) // PAGE) * PAGE
    check(lib().cuMemHostRegister_v2(ctypes.c_void_p(first), size, CU_MEMHOSTREGISTER_PORTABLE),
          f"cuMemHostRegister of {size} bytes")

    def unregister() -> None:
        check(lib().cuMemHostUnregister(ctypes.c_void_p(first)), "cuMemHostUnregister")

    return unregister
