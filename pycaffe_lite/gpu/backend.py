"""The GPU backend: one CUDA context (the device's primary context), one stream that every kernel,
copy and cuBLAS call uses, a device memory pool, and a kernel cache (each ``.cu`` file compiled
once per element type per process with PyCUDA's ``SourceModule``).

Kernel files are CUDA C written against ``Dtype`` (the storage type: float or double; __half and
__nv_bfloat16 compile too), ``Mtype`` (the math type: float for the half types, else Dtype) and the
grid-stride macro ``CUDA_KERNEL_LOOP(i, n)``, all defined by :func:`prelude`. Importing this module needs no GPU;
:func:`init_device` does, and raises :class:`GPUUnavailableError` naming what is missing.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import hashlib
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, SupportsInt

import numpy as np

from ..config import config
from ..errors import CudaError, GPUUnavailableError
from .signatures import Signature, SignatureError, check_args, parse_signatures


class Recording(Protocol):
    """What the backend sees of a CUDA-graph capture in progress (a ``cuda_graph.Recording``):
    the sets of memories the captured work writes and uses."""

    written: set
    touched: set

CUDA_NUM_THREADS = 256
MAX_BLOCKS = 65535 * 4
MAX_GRID_YZ = 65535  # a grid's y and z dimensions at most
INT32_MAX = 2**31 - 1

PRELUDE = """typedef {ctype} Dtype;
typedef {mtype} Mtype;
static __device__ __forceinline__ __attribute__((unused)) Mtype to_m(const Dtype x) {{ return {to_m}; }}
static __device__ __forceinline__ __attribute__((unused)) Dtype from_m(const Mtype x) {{ return {from_m}; }}
#define CUDA_KERNEL_LOOP(i, n) \\
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += blockDim.x * gridDim.x)
"""
"""What every kernel file is compiled after: the storage type ``Dtype``, the math type ``Mtype``
(what sums and products accumulate in: float for the half types, else Dtype), ``to_m``/``from_m``
between them (rounding to nearest even into a half type), and the grid-stride loop. Fill it with
:func:`prelude`."""

# The headers of the half types, outside the extern "C" that wraps every kernel source (their C++).
_HALF_HEADERS = 'extern "C++" {\n#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n}\n'
HALF_HEADERS = _HALF_HEADERS  # (for a preamble naming a half type in a float kernel: gpu/cast.py)

# storage dtype -> (Dtype, Mtype, to_m(x), from_m(x), struct code of a Dtype scalar argument, struct
# code of an Mtype scalar argument). bfloat16 has no numpy dtype: its arrays are uint16 bit patterns
# (pycaffe_lite.precision), and its Dtype scalars travel as such bits (Kernel.__call__ converts).
_KERNEL_TYPES: dict[np.dtype, tuple[str, str, str, str, str, str]] = {
    np.dtype(np.float32): ("float", "float", "x", "x", "f", "f"),
    np.dtype(np.float64): ("double", "double", "x", "x", "d", "d"),
    np.dtype(np.float16): ("__half", "float", "__half2float(x)", "__float2half_rn(x)", "e", "f"),
    np.dtype(np.uint16): ("__nv_bfloat16", "float", "__bfloat162float(x)", "__float2bfloat16_rn(x)", "H", "f"),
}


def math_dtype(dtype) -> np.dtype:
    """The numpy dtype of values stored in ``dtype`` as kernels compute them (their ``Mtype``):
    float32 for float16 and bfloat16 (uint16 bits), else ``dtype`` itself."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype in (np.float16, np.uint16) else dtype


def prelude(dtype) -> str:
    """:data:`PRELUDE` for kernels storing ``dtype`` (float32, float64, float16; uint16 stands for
    bfloat16), the half types' headers first."""
    ctype, mtype, to_m, from_m, _, _ = _KERNEL_TYPES[_dtype(dtype)]
    text = PRELUDE.format(ctype=ctype, mtype=mtype, to_m=to_m, from_m=from_m)
    return text if ctype == mtype else _HALF_HEADERS + text


class DeviceState:
    """One device's state (``state()``; ``common.context().device``): CUDA context, stream, memory
    pool, compiled modules, the workspace, the allocation generation and ``device_cache`` dicts."""

    def __init__(self, cuda, device_id: int) -> None:
        import pycuda.tools

        self.cuda = cuda
        self.device_id = device_id
        self.device = cuda.Device(device_id)
        self.context = self.device.retain_primary_context()
        self.context.push()
        self.stream = cuda.Stream()
        self.copy = None  # copy_stream(): made on first use
        self.pool = pycuda.tools.DeviceMemoryPool()
        self.free_at_init = cuda.mem_get_info()[0]  # baseline of memory_held()
        self.peak_used = 0  # the most memory_held()'s "device" was when the pool grew or gave blocks back
        self.modules: dict[tuple[str, str], KernelModule] = {}
        self.lock = threading.Lock()
        self.recording: Recording | None = None  # the cuda_graph.Recording while a graph capture records the stream
        self.alloc_generation = 0  # bumped by every allocation: graphs keyed on old pointers retire
        self.workspaces: dict[str, tuple[int, SupportsInt]] = {}  # slot -> (bytes, allocation), see workspace()
        self.sm_count: int | None = None  # cached by multiprocessor_count()
        self.caches: dict[str, dict] = {}  # device_cache(name): what modules keep per device

    def close(self) -> None:
        for cache in self.caches.values():
            for value in cache.values():
                if hasattr(value, "close"):  # a library handle (cuBLAS)
                    value.close()
        self.caches.clear()

        try:
            if self.copy is not None:
                self.copy.synchronize()
            self.stream.synchronize()
            self.pool.stop_holding()
            self.context.pop()
        except Exception:  # interpreter shutdown: nothing more to do
            pass


_state: DeviceState | None = None
_selected_device = 0  # the device state() initialises on first use (set by common.set_device)


def select_device(device_id: int) -> None:
    """Choose the device used when GPU work first needs one (switches now if one is active)."""
    global _selected_device
    _selected_device = int(device_id)
    if _state is not None and _state.device_id != _selected_device:
        init_device(_selected_device)


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
    global _state, _selected_device
    _selected_device = int(device_id)
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
        _state = DeviceState(cuda, device_id)
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


def started() -> bool:
    """Whether a device has been started in this process (``state()`` would not start one)."""
    return _state is not None


def device_cache(name: str) -> dict:
    """A dict kept with the current device's state, for what a module caches per device (buffers,
    tables, library handles): dropped with the device's context, whose allocations it may hold.
    Values with a ``close()`` are closed then."""
    return state().caches.setdefault(name, {})


def state() -> DeviceState:
    if _state is None:
        init_device(_selected_device)
    assert _state is not None
    return _state


def recording() -> Recording | None:
    """The CUDA-graph recording in progress (a ``cuda_graph.Recording``), or None."""
    return _state.recording if _state is not None else None


def is_initialized() -> bool:
    return _state is not None


def stream():
    """The stream every GPU operation of the process is queued on."""
    return state().stream


def copy_stream():
    """A second stream for host-to-device uploads that overlap the work queued on :func:`stream`
    (the data layers' next batch): the compute stream waits on an event recorded after the upload
    (``stream().wait_for_event``) before it reads the memory. Made on first use."""
    st = state()
    if st.copy is None:
        st.copy = st.cuda.Stream()
    return st.copy


@contextlib.contextmanager
def current_in_thread() -> Iterator[None]:
    """Make the started device's context current in this thread for the block (a PyCUDA context is
    current per thread: the one that started the device has it, another thread pushes it): for a
    thread of a layer's own that queues work on :func:`copy_stream` (the Data layer's nvJPEG
    staging). GPUUnavailableError when no device was started."""
    st = _state
    if st is None:
        raise GPUUnavailableError("no device started: a thread can only join the context of a started device")
    st.context.push()
    try:
        yield
    finally:
        try:
            st.context.pop()
        except Exception:  # (the context is gone at exit)
            pass


def synchronize() -> None:
    state().stream.synchronize()


def device_name() -> str:
    return state().device.name()


def multiprocessor_count() -> int:
    """Streaming multiprocessors of the current device."""
    st = state()
    if st.sm_count is None:
        st.sm_count = st.device.get_attribute(st.cuda.device_attribute.MULTIPROCESSOR_COUNT)
    return st.sm_count


# -- memory ---------------------------------------------------------------------------------
def device_memory_bytes() -> int:
    """Total memory of the current device (what :mod:`pycaffe_lite.memcheck` checks sizes against)."""
    return int(state().device.total_memory())


def alloc(nbytes: int):
    """A pooled device allocation of ``nbytes`` (``int(a)`` is its pointer); freed to the pool on GC."""
    st = state()
    if st.recording is not None:
        raise CudaError(
            f"device allocation of {nbytes} bytes while a CUDA graph is being captured: "
            "allocate buffers before capture (run one iteration first)"
        )
    st.alloc_generation += 1
    held = st.pool.managed_bytes
    try:
        block = st.pool.allocate(int(nbytes))
    except st.cuda.MemoryError:
        reclaim()  # a dropped Net or Solver may still hold its blocks, or the pool caches odd sizes
        try:
            block = st.pool.allocate(int(nbytes))
        except st.cuda.MemoryError as exc:
            raise CudaError(f"out of device memory allocating {nbytes} bytes: {exc}") from None
    if st.pool.managed_bytes > held:  # the pool took memory from the driver
        _device_used(st)
    return block


def _device_used(st: DeviceState) -> int:
    """Bytes taken since the context was made (cuMemGetInfo), noted in ``st.peak_used``."""
    used = int(st.free_at_init - st.cuda.mem_get_info()[0])
    st.peak_used = max(st.peak_used, used)
    return used


def _free_held(st: DeviceState) -> None:
    """The pool's cached blocks back to the driver (the peak noted first)."""
    _device_used(st)
    st.pool.free_held()


def reclaim() -> None:
    """Give back what dead objects hold: run Python's cyclic collector (a Net or Solver nobody
    references is a reference cycle, and keeps its device memory until that collector runs) and
    return the pool's cached blocks to the driver."""
    gc.collect()
    if _state is not None:
        _free_held(_state)


_WORKSPACE_ALIGN = 256


def workspace(*sizes: int, slot: str = "main") -> list[int]:
    """Device scratch shared by every layer: one pointer per requested size (bytes), carved from one
    buffer per ``slot`` grown on demand. Contents are undefined and the pointers are valid only
    until the next call for the same slot, so a pass asks once for everything it needs. Slot
    ``"main"`` serves the big consumers (convolution engines); ``"reduce"`` the small partial sums
    of reductions, which run inside such passes (a convolution's bias gradient) without
    disturbing them. State kept from forward to backward belongs in a Blob instead.
    """
    st = state()
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-max(int(size), 1) // _WORKSPACE_ALIGN) * _WORKSPACE_ALIGN
    buf = st.workspaces.get(slot)
    if buf is None or buf[0] < total:
        buf = None  # no reference may keep the old buffer alive past free_held
        if st.workspaces.pop(slot, None) is not None:  # give the old buffer back to the driver: the
            _free_held(st)  # pool would keep it in a size bin no later request may fit
        st.workspaces[slot] = buf = (total, alloc(total))
    base = int(buf[1])
    return [base + off for off in offsets]


def workspace_total(*sizes: int) -> int:
    """Bytes :func:`workspace` needs for ``sizes`` (each region aligned)."""
    return sum(-(-max(int(size), 1) // _WORKSPACE_ALIGN) * _WORKSPACE_ALIGN for size in sizes)


def release_workspace(slot: str = "main") -> None:
    """Free ``slot``'s buffer (back to the driver); the next :func:`workspace` call sizes it anew."""
    st = state()
    if st.workspaces.pop(slot, None) is not None:
        _free_held(st)


def workspace_bytes(slot: str | None = None) -> int:
    """Current size (bytes) of the shared device workspace ``slot``, or of all of them (0 before
    first use)."""
    if _state is None:
        return 0
    return sum(b[0] for name, b in _state.workspaces.items() if slot in (None, name))


def memory_held() -> dict[str, int]:
    """Device memory (bytes) this process took since its context was created: ``device`` from the
    driver's cuMemGetInfo (free at context creation minus free now: our pool, cuBLAS workspaces,
    loaded modules, CUDA graphs; assumes no other process allocates on the device meanwhile),
    ``pool`` (what our pool holds, in use or cached) and ``pool_active`` (in use); ``peak``, the
    most ``device`` has been whenever the pool took memory from the driver or gave cached blocks
    back (workspace growth, the convolution autotune's operands, :func:`reclaim`), and now: the
    figure to hold against a peer's peak (PyTorch's ``max_memory_reserved``). Memory others take
    between those points (cuBLAS, modules, graphs) counts from the next one."""
    st = state()
    device = _device_used(st)
    return {
        "device": device,
        "peak": st.peak_used,
        "pool": int(getattr(st.pool, "managed_bytes", 0)),
        "pool_active": int(getattr(st.pool, "active_bytes", 0)),
    }


PIN_MIN_BYTES = 1 << 20  # smaller host copies stay pageable: their transfers are latency-bound


def pinned_array(count: int, dtype, zero: bool) -> np.ndarray | None:
    """A page-locked host array of ``count`` elements (zeroed if ``zero``) for a blob's host copy
    while a device is in use, as BVLC's ``CaffeMallocHost`` does in GPU mode: transfers from and to it
    run at the bus's rate instead of being staged through pageable memory. None when no device is
    initialized, the array is under :data:`PIN_MIN_BYTES` or the driver refuses (the caller then
    allocates pageable memory)."""
    nbytes = int(count) * np.dtype(dtype).itemsize
    if _state is None or nbytes < PIN_MIN_BYTES:
        return None
    cuda = _state.cuda
    make = cuda.pagelocked_zeros if zero else cuda.pagelocked_empty
    try:
        return make(int(count), np.dtype(dtype), mem_flags=cuda.host_alloc_flags.PORTABLE)
    except (cuda.Error, MemoryError):
        return None


def memcpy_htod(dst: int, src: np.ndarray, pinned: bool = False, on=None):
    """Queue a host-to-device copy of the contiguous array ``src`` on :func:`stream` (or the stream
    ``on``: :func:`copy_stream`). From pageable memory the call returns once the driver has staged
    ``src`` (None); from page-locked memory (``pinned``) the copy runs asynchronously and the
    returned event completes when ``src`` may be written again."""
    st = state()
    queue = st.stream if on is None else on
    if st.recording is not None and queue is st.stream:  # (another stream, such as the copy stream, is not captured)
        raise CudaError("host-to-device copy from host memory while a CUDA graph is being captured")
    st.cuda.memcpy_htod_async(dst, np.ascontiguousarray(src), queue)
    if not pinned:
        return None
    return record_event(queue)


def record_event(on=None):
    """An event recorded now on :func:`stream` (or on the stream ``on``): it completes when the work
    queued there before it has."""
    st = state()
    done = st.cuda.Event(st.cuda.event_flags.DISABLE_TIMING)
    done.record(st.stream if on is None else on)
    return done


def memcpy_dtoh(dst: np.ndarray, src: int) -> None:
    """Copy device memory into the contiguous array ``dst`` and wait for it."""
    st = state()
    if st.recording is not None:
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
class Kernel:
    """A compiled kernel whose argument kinds come from its ``__global__`` signature.

    ``kernel(*args)`` launches on the backend stream. Without ``grid=``, the kernel's first
    parameter must be an ``int``: the number of work items of its grid-stride loop, passed once
    and used to size a capped grid. With ``grid=``/``block=`` (ints or 3-tuples) the launch shape
    is explicit. Arguments are checked against the signature; :meth:`launch` skips the checks for
    hot paths whose arguments were validated once with :meth:`check_args`.
    """

    def __init__(self, function, signature: Signature, dtype: np.dtype, where: str) -> None:
        self.function = function
        self.signature = signature
        self.name = signature.name
        self.dtype = dtype
        self.where = where
        self._shared_allowed = 48 * 1024
        function.prepare(signature.struct_codes(*_KERNEL_TYPES[dtype][4:]))
        # bfloat16's Dtype scalars are packed as bit patterns: positions converted by __call__
        self._bf16_scalars = tuple(i for i, p in enumerate(signature.params) if p.kind == "scalar") \
            if dtype == np.dtype(np.uint16) else ()

    def check_args(self, *args) -> None:
        """Validate ``args`` against the signature (count, kinds, int ranges, non-null pointers)."""
        try:
            check_args(self.signature, args, self.where)
        except (TypeError, ValueError) as exc:
            raise CudaError(str(exc)) from None

    def __call__(self, *args, block: int | tuple = CUDA_NUM_THREADS, grid=None, shared: int = 0) -> None:
        self.check_args(*args)
        if self._bf16_scalars:
            args = bfloat16_scalar_args(args, self._bf16_scalars)
        bx = block if isinstance(block, int) else block[0]
        if grid is None:
            if not self.signature.counts_items:
                raise CudaError(f"kernel {self.name} ({self.where}): its first parameter is not an int "
                                "work-item count, so the launch needs grid= and block=")
            n = int(args[0])
            if n > INT32_MAX - MAX_BLOCKS * bx:  # the grid-stride index must not overflow int
                raise CudaError(f"kernel {self.name}: {n} work items exceed int32 indexing")
            if n <= 0:
                return
            grid = (min((n + bx - 1) // bx, MAX_BLOCKS), 1, 1)
        block = (block, 1, 1) if isinstance(block, int) else tuple(block)
        grid = (grid, 1, 1) if isinstance(grid, int) else tuple(grid)
        self.function.prepared_async_call(grid, block, stream(), *args, shared_size=shared)

    def allow_shared(self, nbytes: int) -> None:
        """Let launches use ``nbytes`` of dynamic shared memory (beyond the default 48 KiB needs the
        opt-in; the device's per-block maximum is checked)."""
        if nbytes <= self._shared_allowed:
            return
        cuda = state().cuda
        limit = state().device.get_attribute(cuda.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        if nbytes > limit:
            raise CudaError(f"kernel {self.name} ({self.where}): {nbytes} bytes of shared memory exceed the "
                            f"device's {limit} per block")
        self.function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes))
        self._shared_allowed = nbytes

    @property
    def max_threads(self) -> int:
        """The most threads a block of this kernel may have (its registers counted)."""
        return int(self.function.get_attribute(state().cuda.function_attribute.MAX_THREADS_PER_BLOCK))

    def resident_blocks(self, threads: int, shared: int = 0) -> int:
        """Blocks of ``threads`` threads (``shared`` bytes of dynamic shared memory each) that one
        multiprocessor holds at once: the least of what its registers, shared memory and thread
        slots allow (registers go to warps in units of 256)."""
        cuda = state().cuda
        dev, fa, da = state().device, cuda.function_attribute, cuda.device_attribute
        warps = -(-threads // 32)
        per_warp = -(-self.function.get_attribute(fa.NUM_REGS) * 32 // 256) * 256
        smem = self.function.get_attribute(fa.SHARED_SIZE_BYTES) + shared + 1024  # 1 KiB reserved per block
        return max(1, min(dev.get_attribute(da.MAX_REGISTERS_PER_MULTIPROCESSOR) // max(per_warp * warps, 1),
                          dev.get_attribute(da.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) // smem,
                          dev.get_attribute(da.MAX_THREADS_PER_MULTIPROCESSOR) // threads))

    def launch(self, grid: tuple, block: tuple, *args, shared: int = 0) -> None:
        """Launch with explicit 3-D ``grid``/``block`` tuples and no argument checks."""
        self.function.prepared_async_call(grid, block, state().stream, *args, shared_size=shared)


def bfloat16_scalar_args(args: tuple, positions: tuple[int, ...]) -> tuple:
    """``args`` with the numbers at ``positions`` (a bfloat16 kernel's ``Dtype`` scalars) replaced by
    their bfloat16 bit patterns, rounded to nearest even (``Mtype`` scalars are floats and need none)."""
    from ..schema.blob_values import float32_to_bfloat16

    out = list(args)
    for i in positions:
        out[i] = int(float32_to_bfloat16(np.array([float(out[i])], np.float32))[0])
    return tuple(out)


def compile_lock_path(key: str) -> Path:
    """The lock file of one compilation (``key``: its source and options)."""
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"pycaffe-lite-nvcc-{os.getuid()}-{digest}.lock"


@contextlib.contextmanager
def _compile_lock(key: str) -> Iterator[None]:
    """Processes on this machine compile the same source one at a time: PyCUDA's compiler cache
    writes its cubin files in place, so a process reading one another is writing loads a truncated
    image ("device kernel image is invalid", seen once with parallel GPU test workers). Different
    sources compile in parallel."""
    import fcntl  # POSIX only: here, not at import, so CPU-only installs elsewhere still import the backend

    path = compile_lock_path(key)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class KernelModule:
    """One CUDA source compiled for one dtype; its kernels' signatures are read from the source."""

    def __init__(self, source: str, dtype: np.dtype, where: str, include_dirs: list[str], arch: str | None = None) -> None:
        from pycuda.compiler import SourceModule

        self.where = where
        self.dtype = dtype
        try:
            self.signatures = parse_signatures(source)
        except SignatureError as exc:
            raise CudaError(f"{where}: {exc}") from None
        options = ["-O3"]
        extra = config.nvcc_flags
        if extra:
            options += extra.split()
        try:
            text = prelude(dtype) + source
            with _compile_lock(text + " ".join(options) + (arch or "")):
                self.module = SourceModule(text, options=options, include_dirs=include_dirs, arch=arch)
        except Exception as exc:
            raise CudaError(f"compiling {where} for {dtype}: {exc}") from None
        self._kernels: dict[str, Kernel] = {}

    def get(self, name: str) -> Kernel:
        kernel = self._kernels.get(name)
        if kernel is None:
            sig = self.signatures.get(name)
            if sig is None:
                known = ", ".join(sorted(self.signatures)) or "none"
                raise CudaError(f"kernel '{name}' not found in {self.where} (its kernels: {known})")
            kernel = self._kernels[name] = Kernel(self.module.get_function(name), sig, self.dtype, self.where)
        return kernel


def _compiled(key: tuple, make) -> KernelModule:
    st = state()
    mod = st.modules.get(key)
    if mod is None:
        with st.lock:
            mod = st.modules.get(key)
            if mod is None:
                mod = st.modules[key] = make()
    return mod


def _dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in _KERNEL_TYPES:
        raise CudaError(f"kernels are compiled for float32 and float64 (and float16, bfloat16 as uint16), not {dtype}")
    return dtype


def module(path: str | os.PathLike, dtype, arch: str | None = None) -> KernelModule:
    """The compiled module of the ``.cu`` file ``path`` for ``dtype`` (compiled once, cached), for
    the current device's architecture or ``arch`` (``"sm_90a"``: Hopper's wgmma)."""
    dtype = _dtype(dtype)
    path = Path(path)

    def make() -> KernelModule:
        try:
            source = path.read_text()
        except OSError as exc:
            raise CudaError(f"cannot read kernel file {path}: {exc.strerror}") from None
        return KernelModule(source, dtype, str(path), [str(path.parent), str(Path(__file__).parent)], arch)

    return _compiled(("file", str(path), dtype.str, arch), make)


def kernel(path: str | os.PathLike, name: str, dtype, arch: str | None = None) -> Kernel:
    """Kernel ``name`` of the ``.cu`` file ``path`` compiled for ``dtype`` (and ``arch``: :func:`module`)."""
    return module(path, dtype, arch).get(name)


def elementwise_source(name: str, params: str, body: str, preamble: str = "") -> str:
    """The CUDA source :func:`elementwise` compiles (before the prelude)."""
    return (f"{preamble}\n__global__ void {name}(const int n{', ' if params else ''}{params}) {{\n"
            f"  CUDA_KERNEL_LOOP(i, n) {{ {body}; }}\n}}\n")


def elementwise(name: str, params: str, body: str, dtype, preamble: str = "") -> Kernel:
    """A grid-stride kernel ``name(const int n, <params>)`` running ``body`` for each ``i < n``.

    ``body`` is CUDA statements over ``i`` (for example ``"y[i] = x[i] > 0 ? x[i] : 0"``);
    ``params`` the C parameter list after ``n`` (``"const Dtype* x, Dtype* y"``); ``preamble``
    optional ``__device__`` helpers. Compiled once per (source, dtype); call as ``k(n, *args)``.
    """
    dtype = _dtype(dtype)
    source = elementwise_source(name, params, body, preamble)
    key = ("elementwise", source, dtype.str)
    return _compiled(key, lambda: KernelModule(source, dtype, f"elementwise kernel {name}", [])).get(name)
