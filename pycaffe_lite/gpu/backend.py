"""The GPU backend: one CUDA context (the device's primary context), one stream that every kernel,
copy and cuBLAS call uses, a device memory pool, and a kernel cache (each ``.cu`` file compiled
once per element type per process with PyCUDA's ``SourceModule``).

Kernel files are CUDA C written against ``Dtype`` (float or double) and the grid-stride macro
``CUDA_KERNEL_LOOP(i, n)``, both defined by :data:`PRELUDE`. Importing this module needs no GPU;
:func:`init_device` does, and raises :class:`GPUUnavailableError` naming what is missing.
"""

from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path

import numpy as np

from ..errors import CudaError, GPUUnavailableError

CUDA_NUM_THREADS = 256
MAX_BLOCKS = 65535 * 4
INT32_MAX = 2**31 - 1

PRELUDE = """typedef {ctype} Dtype;
#define CUDA_KERNEL_LOOP(i, n) \\
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += blockDim.x * gridDim.x)
"""

_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


class _State:
    def __init__(self, cuda, device_id: int) -> None:
        import pycuda.tools

        self.cuda = cuda
        self.device_id = device_id
        self.device = cuda.Device(device_id)
        self.context = self.device.retain_primary_context()
        self.context.push()
        self.stream = cuda.Stream()
        self.pool = pycuda.tools.DeviceMemoryPool()
        self.free_at_init = cuda.mem_get_info()[0]  # baseline of memory_held()
        self.modules: dict[tuple[str, str], KernelModule] = {}
        self.lock = threading.Lock()
        self.capturing = False  # a CUDA graph capture is recording the stream
        self.capture_written: set = set()
        self.alloc_generation = 0  # SyncedMemory objects made device-newest during capture

    def close(self) -> None:
        try:
            self.stream.synchronize()
            self.pool.stop_holding()
            self.context.pop()
        except Exception:  # interpreter shutdown: nothing more to do
            pass


_state: _State | None = None


def _import_driver():
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise GPUUnavailableError(
            "GPU mode needs PyCUDA: install with `pip install pycaffe-lite[gpu]` on a machine with "
            f"the CUDA toolkit and an NVIDIA driver (import failed: {exc})"
        ) from None
    try:
        cuda.init()
    except Exception as exc:
        raise GPUUnavailableError(f"GPU mode: the CUDA driver could not be initialised: {exc}") from None
    return cuda


def init_device(device_id: int = 0) -> None:
    """Make ``device_id`` current (its primary context, a stream, a pool). Idempotent."""
    global _state
    if _state is not None and _state.device_id == device_id:
        return
    cuda = _import_driver()
    count = cuda.Device.count()
    if count == 0:
        raise GPUUnavailableError("GPU mode: the CUDA driver reports no device")
    if not 0 <= device_id < count:
        raise GPUUnavailableError(f"GPU mode: device {device_id} requested but only {count} device(s) exist")
    old, _state = _state, None
    if old is not None:
        old.close()
    try:
        _state = _State(cuda, device_id)
    except Exception as exc:
        if old is not None:  # keep the previous device usable
            old.context.push()
            _state = old
        raise GPUUnavailableError(f"GPU mode: cannot use device {device_id}: {exc}") from None


@atexit.register
def _shutdown() -> None:
    global _state
    if _state is not None:
        _state.close()
        _state = None


def state() -> _State:
    if _state is None:
        from .. import common

        init_device(common.device_id())
    return _state


def is_initialized() -> bool:
    return _state is not None


def stream():
    """The stream every GPU operation of the process is queued on."""
    return state().stream


def synchronize() -> None:
    state().stream.synchronize()


def device_name() -> str:
    return state().device.name()


def multiprocessor_count() -> int:
    """Streaming multiprocessors of the current device."""
    st = state()
    count = getattr(st, "sm_count", None)
    if count is None:
        count = st.sm_count = st.device.get_attribute(st.cuda.device_attribute.MULTIPROCESSOR_COUNT)
    return count


# -- memory ---------------------------------------------------------------------------------
def alloc(nbytes: int):
    """A pooled device allocation of ``nbytes`` (``int(a)`` is its pointer); freed to the pool on GC."""
    st = state()
    if st.capturing:
        raise CudaError(
            f"device allocation of {nbytes} bytes while a CUDA graph is being captured: "
            "allocate buffers before capture (run one iteration first)"
        )
    st.alloc_generation += 1  # pointers may change: captured CUDA graphs keyed on the old value retire
    try:
        return st.pool.allocate(int(nbytes))
    except st.cuda.MemoryError as exc:
        raise CudaError(f"out of device memory allocating {nbytes} bytes: {exc}") from None


def memory_held() -> dict[str, int]:
    """Device memory (bytes) this process took since its context was created: ``device`` from the
    driver's cuMemGetInfo (free at context creation minus free now: our pool, cuBLAS workspaces,
    loaded modules, CUDA graphs; assumes no other process allocates on the device meanwhile),
    ``pool`` (what our pool holds, in use or cached) and ``pool_active`` (in use). The pool keeps
    freed blocks, so ``pool`` is also its peak so far, and ``device`` the process's peak unless a
    library released memory meanwhile."""
    st = state()
    return {
        "device": int(st.free_at_init - st.cuda.mem_get_info()[0]),
        "pool": int(getattr(st.pool, "managed_bytes", 0)),
        "pool_active": int(getattr(st.pool, "active_bytes", 0)),
    }


def memcpy_htod(dst: int, src: np.ndarray) -> None:
    """Queue a host-to-device copy of the contiguous array ``src``."""
    st = state()
    if st.capturing:
        raise CudaError("host-to-device copy from pageable memory while a CUDA graph is being captured")
    st.cuda.memcpy_htod_async(dst, np.ascontiguousarray(src), st.stream)


def memcpy_dtoh(dst: np.ndarray, src: int) -> None:
    """Copy device memory into the contiguous array ``dst`` and wait for it."""
    st = state()
    if st.capturing:
        raise CudaError("device-to-host copy while a CUDA graph is being captured (it would need a sync)")
    if not dst.flags.c_contiguous:
        raise CudaError("memcpy_dtoh: destination array must be C-contiguous")
    st.cuda.memcpy_dtoh_async(dst, src, st.stream)
    st.stream.synchronize()


def memcpy_dtod(dst: int, src: int, nbytes: int) -> None:
    st = state()
    if nbytes:
        st.cuda.memcpy_dtod_async(dst, src, int(nbytes), st.stream)


def memset_zero(ptr: int, nbytes: int) -> None:
    st = state()
    if nbytes == 0:
        return
    if nbytes % 4 == 0 and int(ptr) % 4 == 0:
        st.cuda.memset_d32_async(ptr, 0, nbytes // 4, st.stream)
    else:
        st.cuda.memset_d8_async(ptr, 0, nbytes, st.stream)


# -- kernels --------------------------------------------------------------------------------
_ARG_CODES = {"i": "i", "u": "I", "q": "q", "P": "P"}


class Kernel:
    """A compiled kernel with a fixed argument signature, launched on the backend stream.

    ``argtypes``: one letter per argument: ``i`` int32, ``u`` uint32, ``q`` int64, ``P`` device
    pointer, ``f`` a ``Dtype`` scalar. Call as ``kernel(n, *args)``: ``n`` work items sized with
    the grid-stride loop (grid capped), or pass ``grid=``/``block=`` explicitly.
    """

    def __init__(self, function, name: str, argtypes: str, dtype: np.dtype) -> None:
        self.function = function
        self.name = name
        self.argtypes = argtypes
        self.dtype = dtype
        scalar = "f" if dtype == np.float32 else "d"
        try:
            codes = "".join(scalar if c == "f" else _ARG_CODES[c] for c in argtypes)
        except KeyError as exc:
            raise ValueError(f"kernel {name}: unknown argument type code {exc} in '{argtypes}'") from None
        function.prepare(codes)

    def _check(self, args) -> None:
        if len(args) != len(self.argtypes):
            raise CudaError(f"kernel {self.name}: expected {len(self.argtypes)} arguments, got {len(args)}")
        for pos, (code, value) in enumerate(zip(self.argtypes, args)):
            if code == "P":
                if int(value) == 0:
                    raise CudaError(f"kernel {self.name}: argument {pos} is a null device pointer")
            elif code == "i" and not -INT32_MAX - 1 <= int(value) <= INT32_MAX:
                raise CudaError(f"kernel {self.name}: argument {pos} = {value} does not fit in int32")
            elif code == "u" and not 0 <= int(value) <= 2**32 - 1:
                raise CudaError(f"kernel {self.name}: argument {pos} = {value} does not fit in uint32")

    def __call__(self, n: int, *args, block: int | tuple = CUDA_NUM_THREADS, grid=None, shared: int = 0) -> None:
        self._check(args)
        bx = block if isinstance(block, int) else block[0]
        if n > INT32_MAX - MAX_BLOCKS * bx:  # the grid-stride index must not overflow int
            raise CudaError(f"kernel {self.name}: {n} work items exceed int32 indexing")
        if grid is None:
            if n <= 0:
                return
            grid = (min((n + bx - 1) // bx, MAX_BLOCKS), 1, 1)
        block = (block, 1, 1) if isinstance(block, int) else tuple(block)
        grid = (grid, 1, 1) if isinstance(grid, int) else tuple(grid)
        self.function.prepared_async_call(grid, block, stream(), *args, shared_size=shared)


    def launch(self, grid: tuple, block: tuple, *args, shared: int = 0) -> None:
        """Launch with explicit 3-D ``grid``/``block`` tuples and no argument checks: for hot paths
        whose arguments were validated once (:meth:`check_args`) and only pointers change."""
        self.function.prepared_async_call(grid, block, state().stream, *args, shared_size=shared)

    def check_args(self, *args) -> None:
        """Validate ``args`` against the signature (counts, int ranges, non-null pointers)."""
        self._check(args)


class KernelModule:
    """One ``.cu`` file compiled for one dtype."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        from pycuda.compiler import SourceModule

        self.path = path
        self.dtype = dtype
        try:
            source = path.read_text()
        except OSError as exc:
            raise CudaError(f"cannot read kernel file {path}: {exc.strerror}") from None
        options = ["-O3"]
        extra = os.environ.get("PYCAFFE_LITE_NVCC_FLAGS")
        if extra:
            options += extra.split()
        try:
            self.module = SourceModule(
                PRELUDE.format(ctype=_CTYPES[dtype]) + source,
                options=options,
                include_dirs=[str(path.parent), str(Path(__file__).parent)],
            )
        except Exception as exc:
            raise CudaError(f"compiling {path} for {dtype}: {exc}") from None
        self._kernels: dict[str, Kernel] = {}

    def get(self, name: str, argtypes: str) -> Kernel:
        kernel = self._kernels.get(name)
        if kernel is None:
            try:
                function = self.module.get_function(name)
            except Exception:
                raise CudaError(f"kernel '{name}' not found in {self.path}") from None
            kernel = self._kernels[name] = Kernel(function, name, argtypes, self.dtype)
        return kernel


def module(path: str | os.PathLike, dtype) -> KernelModule:
    """The compiled module for ``path`` and ``dtype`` (compiled on first use, then cached)."""
    dtype = np.dtype(dtype)
    if dtype not in _CTYPES:
        raise CudaError(f"kernels are compiled for float32 and float64, not {dtype}")
    st = state()
    key = (str(path), dtype.str)
    mod = st.modules.get(key)
    if mod is None:
        with st.lock:
            mod = st.modules.get(key)
            if mod is None:
                mod = st.modules[key] = KernelModule(Path(path), dtype)
    return mod


def kernel(path: str | os.PathLike, name: str, dtype, argtypes: str) -> Kernel:
    """Shorthand: ``module(path, dtype).get(name, argtypes)``."""
    return module(path, dtype).get(name, argtypes)
