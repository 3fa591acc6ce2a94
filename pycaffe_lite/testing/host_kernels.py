"""CUDA kernel files run on the host, for tests without a GPU: a ``.cu`` source is compiled by the
host C++ compiler behind a shim standing in for CUDA's built-ins (``Dtype`` typedef'd to float or
double), loaded with ctypes, and the layers' device pointers become their blobs' host addresses.

Two shims: ``SERIAL_SHIM`` makes each ``__global__`` kernel a plain ``extern "C"`` function and
``CUDA_KERNEL_LOOP`` a serial loop (harnesses add what else their kernels use);
``THREADED_SHIM`` runs a launch's blocks (a 1-, 2- or 3-D grid) one after another, each block's threads
as OS threads (``__syncthreads`` a barrier, ``__shfl_xor_sync`` / ``__shfl_down_sync`` an exchange
between two barriers, atomics compare-and-swap), through ``launch_<kernel>(gx, gy, gz, bx, by, bz,
void** args)`` entries (``threaded_library``, ``launch``). Nothing is compiled until a library is asked for: importing
this module needs no compiler (``CXX`` is None where there is none)."""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..blob import Blob
from ..gpu.signatures import Signature, check_args, parse_signatures

CXX = shutil.which("g++") or shutil.which("c++")
C_TYPES: dict[np.dtype, tuple[type, str]] = {np.dtype(np.float32): (ctypes.c_float, "float"),
                                             np.dtype(np.float64): (ctypes.c_double, "double"),
                                             np.dtype(np.float16): (ctypes.c_uint16, "_Float16"),
                                             np.dtype(np.uint16): (ctypes.c_uint16, "bf16_host")}
# The half types on the host: float16 is the compiler's _Float16 (IEEE binary16, conversions rounded
# to nearest even); bfloat16 a 16-bit struct converting to and from float as cuda_bf16.h's
# __float2bfloat16_rn does (nearest even, NaN kept quiet). Both compute in Mtype = float.
HALF_HOST_TYPES = """#include <cstring>
struct bf16_host {
  unsigned short bits;
  bf16_host() = default;
  bf16_host(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    bits = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u)
                                            : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  bf16_host(double d) : bf16_host(float(d)) {}
  bf16_host(int i) : bf16_host(float(i)) {}
  operator float() const {
    const unsigned u = unsigned(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
"""

SERIAL_SHIM = """#include <cmath>
#include <algorithm>
using std::min; using std::max; using std::fmin; using std::fmax; using std::tanh; using std::exp;
#define __global__ extern "C"
#define __device__
#define __forceinline__ inline
#define __align__(n) alignas(n)
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
#define CUDA_KERNEL_LOOP(i, n) for (int i = 0; i < (n); ++i)
"""

THREADED_SHIM = r"""#include <cmath>
#include <algorithm>
#include <barrier>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
using std::min; using std::max; using std::sqrt; using std::fma; using std::fabs;
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local Dim3 threadIdx, blockIdx;
static Dim3 blockDim, gridDim;
static std::barrier<>* block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;  // one per warp of the running block
static std::vector<double> exchange;
static inline int linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
static inline void __syncthreads() { block_barrier->arrive_and_wait(); }
static inline void __syncwarp(unsigned = 0xffffffffu) { block_barrier->arrive_and_wait(); }  // all block threads call it
// Every thread of the block must call it (the kernels keep whole warps, and here whole blocks, in step).
template <class T> static T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
  const int tid = linear_tid();
  if (lane_mask >= width || width > 32) throw 1;
  exchange[tid] = static_cast<double>(v);
  block_barrier->arrive_and_wait();
  const T out = static_cast<T>(exchange[tid ^ lane_mask]);
  block_barrier->arrive_and_wait();
  return out;
}
// Every thread of the caller's warp must call it (the other warps need not: a warp's barrier).
template <class T> static T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int tid = linear_tid(), lane = tid % 32;
  if (width != 32) throw 1;
  std::barrier<>& warp = *warp_barriers[tid / 32];
  exchange[tid] = static_cast<double>(v);
  warp.arrive_and_wait();
  const T out = lane + int(delta) < 32 && tid + int(delta) < int(exchange.size())
                    ? static_cast<T>(exchange[tid + delta]) : v;
  warp.arrive_and_wait();
  return out;
}
static inline int atomicMax(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
  return old;
}
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
static void run_grid(int gx, int gy, int gz, int bx, int by, int bz, const std::function<void()>& body) {
  gridDim = {unsigned(gx), unsigned(gy), unsigned(gz)};
  blockDim = {unsigned(bx), unsigned(by), unsigned(bz)};
  const int threads = bx * by * bz;
  exchange.assign(threads, 0.0);
  warp_barriers.clear();
  for (int w = 0; w * 32 < threads; ++w) warp_barriers.emplace_back(new std::barrier<>(std::min(32, threads - 32 * w)));
  for (int b = 0; b < gx * gy * gz; ++b) {
    std::barrier<> bar(threads);
    block_barrier = &bar;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, b, t] {
        blockIdx = {unsigned(b % gx), unsigned(b / gx % gy), unsigned(b / (gx * gy))};
        threadIdx = {unsigned(t % bx), unsigned(t / bx % by), unsigned(t / (bx * by))};
        body();
      });
    }
    for (auto& th : pool) th.join();
  }
}
template <class... P, std::size_t... I>
static void call_with(void (*k)(P...), void** a, std::index_sequence<I...>) {
  k(*static_cast<std::remove_cv_t<P>*>(a[I])...);
}
template <class... P> static void launch_any(void (*k)(P...), int gx, int gy, int gz, int bx, int by, int bz,
                                             void** a) {
  run_grid(gx, gy, gz, bx, by, bz, [=] { call_with(k, a, std::index_sequence_for<P...>{}); });
}
#define __global__ extern "C"
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
#define CUDA_KERNEL_LOOP(i, n) \
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += blockDim.x * gridDim.x)
"""

ARG_TYPES: dict[str, type] = {"ptr": ctypes.c_void_p, "int": ctypes.c_int, "uint": ctypes.c_uint,
                              "int64": ctypes.c_longlong, "uint64": ctypes.c_ulonglong, "float": ctypes.c_float,
                              "double": ctypes.c_double}


@functools.cache
def _build_dir() -> Path:
    path = tempfile.mkdtemp(prefix="host_kernels_")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return Path(path)


@functools.cache
def _compile(text: str, stem: str, flags: tuple[str, ...]) -> ctypes.CDLL:
    if CXX is None:
        raise RuntimeError("no host C++ compiler (g++ or c++) on PATH")
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    src = _build_dir() / f"{stem}_{digest}.cpp"
    src.write_text(text)
    lib = src.with_suffix(".so")
    done = subprocess.run([CXX, "-O1", "-shared", "-fPIC", *flags, "-o", str(lib), str(src)], capture_output=True,
                          text=True)
    if done.returncode:
        raise RuntimeError(f"host build of {stem} failed:\n{done.stderr[-4000:]}")
    return ctypes.CDLL(str(lib))


def library(source: str, dtype, shim: str, stem: str, flags: Sequence[str] = ()) -> ctypes.CDLL:
    """``typedef <float|double> Dtype;`` (and ``Mtype``, the same, with identity ``to_m``/``from_m``,
    as the backend prelude has them; for float16 / uint16 a half ``Dtype`` and ``Mtype`` float, see
    :data:`HALF_HOST_TYPES`) + ``shim`` + ``source`` as a shared library, compiled once per
    process for each (text, flags); ``stem`` names the build files."""
    ctype = C_TYPES[np.dtype(dtype)][1]
    if np.dtype(dtype).itemsize == 2:  # half storage, float math (as the backend prelude has it)
        text = (f"{HALF_HOST_TYPES}typedef {ctype} Dtype;\ntypedef float Mtype;\n"
                "static inline Mtype to_m(const Dtype x) { return float(x); }\n"
                f"static inline Dtype from_m(const Mtype x) {{ return Dtype(x); }}\n{shim}{source}")
    else:
        text = (f"typedef {ctype} Dtype;\ntypedef Dtype Mtype;\n"
                "static inline Mtype to_m(const Dtype x) { return x; }\n"
                f"static inline Dtype from_m(const Mtype x) {{ return x; }}\n{shim}{source}")
    return _compile(text, stem, tuple(flags))


def serial_library(cu: Path, dtype, extra_shim: str = "") -> tuple[ctypes.CDLL, dict[str, Signature]]:
    """``cu`` built on ``SERIAL_SHIM`` (+ ``extra_shim``), its kernels plain functions, and its signatures."""
    source = Path(cu).read_text()
    return library(source, dtype, SERIAL_SHIM + extra_shim, Path(cu).stem), _signatures(source)


def threaded_library(cu: Path, dtype, flags: Sequence[str] = ()) -> tuple[ctypes.CDLL, dict[str, Signature]]:
    """``cu`` built on ``THREADED_SHIM`` with a ``launch_<name>`` entry per kernel, and its signatures."""
    source = Path(cu).read_text()
    sigs = _signatures(source)
    entries = "".join(f'extern "C" void launch_{name}(int gx, int gy, int gz, int bx, int by, int bz, void** a) '
                      f'{{ launch_any(&{name}, gx, gy, gz, bx, by, bz, a); }}\n' for name in sigs)
    lib = library(f"{source}\n{entries}", dtype, THREADED_SHIM, Path(cu).stem, ("-std=c++20", "-pthread", *flags))
    return lib, sigs


@functools.cache
def _signatures(source: str) -> dict[str, Signature]:
    return parse_signatures(source)


def kernel_args(sig: Signature, args: Sequence[Any], dtype) -> list[Any]:
    """The ctypes values of a launch's arguments, checked as the backend checks them
    (``signatures.check_args``); ``scalar`` parameters take the dtype's type (a half one its bits),
    ``mscalar`` ones the math type's (float for the half types)."""
    check_args(sig, tuple(args), "host build")
    dt = np.dtype(dtype)
    if dt.itemsize == 2:  # half Dtype scalars travel as their bits, Mtype ones as floats
        def half_bits(v: Any) -> ctypes.c_uint16:
            probe = Blob((1,), dt)
            probe.set_math_data(np.array([v], np.float32))
            return ctypes.c_uint16(int(probe.cpu_data().view(np.uint16)[0]))

        kinds: dict[str, Callable[[Any], Any]] = {**ARG_TYPES, "scalar": half_bits, "mscalar": ctypes.c_float}
    else:
        kinds = {**ARG_TYPES, "scalar": C_TYPES[dt][0], "mscalar": C_TYPES[dt][0]}
    return [kinds[p.kind](v) for p, v in zip(sig.params, args)]


def launch(lib: ctypes.CDLL, sig: Signature, args: Sequence[Any], dtype, grid: int | tuple[int, ...],
           block: tuple[int, int, int]) -> None:
    """Run ``sig``'s kernel of a ``threaded_library`` on a grid of ``grid`` blocks (an int, or up to
    3 dimensions) of ``block`` threads."""
    values = kernel_args(sig, args, dtype)
    argv = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
    dims = (grid,) if isinstance(grid, int) else tuple(grid)
    dims = dims + (1,) * (3 - len(dims))
    getattr(lib, f"launch_{sig.name}")(*(ctypes.c_int(g) for g in dims), *(ctypes.c_int(b) for b in block), argv)


def host_array(addr: int, shape, dtype) -> np.ndarray:
    """A numpy view of ``shape`` elements of ``dtype`` at a host address (a "device pointer")."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape))
    buf = (ctypes.c_char * (count * dt.itemsize)).from_address(addr)
    return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)


def route_blobs_to_host(monkeypatch: Any) -> None:
    """Blob's ``gpu_data`` / ``gpu_diff`` (and mutable) return their host arrays' addresses while
    ``monkeypatch`` (pytest's fixture) holds."""
    for gpu, cpu in (("gpu_data", "cpu_data"), ("gpu_diff", "cpu_diff"),
                     ("mutable_gpu_data", "mutable_cpu_data"), ("mutable_gpu_diff", "mutable_cpu_diff"),
                     ("overwritten_gpu_diff", "mutable_cpu_diff")):
        monkeypatch.setattr(Blob, gpu, lambda self, _cpu=cpu: getattr(self, _cpu)().ctypes.data)


def host_workspace(held: list[np.ndarray]) -> Callable[..., list[int]]:
    """A stand-in for ``backend.workspace``: fresh host buffers of garbage bytes (as the device's
    would hold), kept alive in ``held``."""
    def workspace(*sizes: int, slot: str = "main") -> list[int]:
        out = []
        for size in sizes:
            arr = np.full(max(int(size), 1), 0x7F, np.uint8)
            held.append(arr)
            out.append(arr.ctypes.data)
        return out
    return workspace


def aligned_copy(a: np.ndarray, shift: int = 0) -> np.ndarray:
    """A copy of ``a`` at a 64-byte aligned address plus ``shift`` elements (a kernel's vector path
    needs aligned pointers; ``shift`` tests its fallback)."""
    buf = np.empty(a.size + 64, a.dtype)
    start = (-buf.ctypes.data % 64) // a.itemsize + shift
    out = buf[start:start + a.size].reshape(a.shape)
    out[...] = a
    return out


def threaded_device(monkeypatch: Any) -> list[tuple[str, Any, tuple[int, int, int]]]:
    """While ``monkeypatch`` (pytest's fixture) holds, the device API runs on the host: blobs'
    device pointers are their host arrays, ``backend.kernel`` launches a ``threaded_library`` build
    of the ``.cu`` (the launch shape the caller asks for, 2- and 3-D grids too, or the backend's default;
    ``backend.elementwise`` kernels too), the workspace
    is fresh host memory, the device has one multiprocessor (small capped grids: grid-stride loops
    run), ``memset_zero`` clears host bytes and ``memcpy_dtod`` copies them. Returns the list each
    launch is appended to as (kernel name, blocks (an int for a 1-D grid, else the grid's 3 dimensions),
    block shape)."""
    from ..gpu import backend

    route_blobs_to_host(monkeypatch)
    held: list[np.ndarray] = []
    launches: list[tuple[str, Any, tuple[int, int, int]]] = []
    include = ("-I", str(Path(backend.__file__).parent))  # vec.cuh, block_sum.cuh

    def kernel(path: Any, name: str, dtype: Any) -> Callable[..., None]:
        lib, sigs = threaded_library(path, dtype, include)

        def call(*args: Any, block: Any = backend.CUDA_NUM_THREADS, grid: Any = None) -> None:
            shape = (block, 1, 1) if isinstance(block, int) else tuple(block)
            if grid is None:
                if args[0] <= 0:
                    return
                grid = min(-(-args[0] // shape[0]), backend.MAX_BLOCKS)
            dims = (grid,) if isinstance(grid, int) else tuple(grid)
            dims = dims + (1,) * (3 - len(dims))
            assert np.prod(shape) <= 1024 and min(dims) >= 1
            launches.append((name, dims[0] if dims[1:] == (1, 1) else dims, shape))
            launch(lib, sigs[name], args, dtype, dims, shape)
        return call

    def elementwise(name: str, params: str, body: str, dtype: Any, preamble: str = "") -> Callable[..., None]:
        source = backend.elementwise_source(name, params, body, preamble)
        path = _build_dir() / f"ew_{name}_{hashlib.sha1(source.encode()).hexdigest()[:10]}.cu"
        if not path.exists():
            path.write_text(source)
        return kernel(path, name, dtype)

    monkeypatch.setattr(backend, "kernel", kernel)
    monkeypatch.setattr(backend, "elementwise", elementwise)
    monkeypatch.setattr(backend, "workspace", host_workspace(held))
    monkeypatch.setattr(backend, "multiprocessor_count", lambda: 1)
    monkeypatch.setattr(backend, "memset_zero", lambda ptr, nbytes: host_array(ptr, (nbytes,), np.uint8).fill(0))
    monkeypatch.setattr(backend, "memcpy_dtod", lambda dst, src, nbytes: ctypes.memmove(dst, src, nbytes))
    return launches
