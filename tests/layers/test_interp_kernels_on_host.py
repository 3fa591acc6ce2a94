"""Interp's GPU path without a GPU: ``layers/interp.cu`` compiled as host C++ (a shim runs a warp's
32 lanes one after another inside each ``FOR_LANE`` phase, one warp in all, so its grid-stride task
loops cover every task; the block kernels run one block of the launched size, its threads one
after another inside each ``FOR_THREAD`` phase, on exactly the launched shared memory), device
pointers replaced by the host arrays' addresses. forward_gpu and
backward_gpu then run as written (tables, pointer offsets, launch arguments) and must agree with
the CPU path, with each backward kernel (chosen by shape on the GPU) forced in turn. Marked slow (two
compilations); run with ``python -m pytest -q tests/layers/test_interp_kernels_on_host.py``."""

from __future__ import annotations

import atexit
import ctypes
import functools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite import common
from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu.signatures import parse_signatures
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

CU = Path(__file__).resolve().parents[2] / "layers" / "interp.cu"
CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = [pytest.mark.skipif(CXX is None, reason="no host C++ compiler"), pytest.mark.slow]

SHIM = """#include <algorithm>
using std::min; using std::max;
#define __global__ extern "C"
#define __device__
#define __forceinline__ inline
typedef {ctype} Dtype;
struct Dim3 {{ unsigned x, y, z; }};
static const Dim3 threadIdx = {{0, 0, 0}}, blockIdx = {{0, 0, 0}}, gridDim = {{1, 1, 1}};
static Dim3 blockDim = {{32, 1, 1}};
static Dtype* interp_shared_;
extern "C" void interp_set_launch(int threads, void* shared) {{ blockDim.x = threads; interp_shared_ = (Dtype*)shared; }}
#define __syncwarp()
#define __syncthreads()
#define FOR_LANE(lane) for (int lane = 0; lane < 32; ++lane)
#define FOR_THREAD(tid) for (int tid = 0; tid < (int)blockDim.x; ++tid)
#define INTERP_BOUNDS(threads, blocks)
#define INTERP_SHARED(name) Dtype* name = interp_shared_
#define CUDA_KERNEL_LOOP(i, n) for (int i = 0; i < (n); ++i)
"""
CTYPES = {np.dtype(np.float32): (ctypes.c_float, "float"), np.dtype(np.float64): (ctypes.c_double, "double")}


@functools.cache
def _library(dtype: str):
    dt = np.dtype(dtype)
    build = Path(tempfile.mkdtemp(prefix="interp_kernels_"))
    atexit.register(shutil.rmtree, build, ignore_errors=True)
    src = build / f"interp_{dt.name}.cpp"
    src.write_text(SHIM.format(ctype=CTYPES[dt][1]) + CU.read_text())
    lib = src.with_suffix(".so")
    subprocess.run([CXX, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    return ctypes.CDLL(str(lib)), parse_signatures(CU.read_text())


@pytest.fixture
def host_gpu(monkeypatch):
    for gpu, cpu in (("gpu_data", "cpu_data"), ("gpu_diff", "cpu_diff"),
                     ("mutable_gpu_data", "mutable_cpu_data"), ("mutable_gpu_diff", "mutable_cpu_diff")):
        def ptr(self, _cpu=cpu):
            return getattr(self, _cpu)().ctypes.data
        monkeypatch.setattr(Blob, gpu, ptr)
    launched: list[str] = []

    def kernel(path, name, dtype):
        assert Path(path) == CU
        lib, sigs = _library(np.dtype(dtype).str)
        fn, params = getattr(lib, name), sigs[name].params
        kinds = {"ptr": ctypes.c_void_p, "int": ctypes.c_int, "scalar": CTYPES[np.dtype(dtype)][0]}

        def call(*args, grid=None, block=None, shared=0):
            assert len(args) == len(params), f"{name}: {len(args)} arguments for {len(params)} parameters"
            if grid is not None:  # whole warps, shared memory within the default
                assert block % 32 == 0 and 0 < block <= 1024 and 0 <= shared <= 48 * 1024 and grid >= 1
            if name == "interp_backward_band":
                assert block <= 768  # its __launch_bounds__
            # Block kernels run all threads of a phase in turn (FOR_THREAD) on `shared` bytes of 0xff
            # (NaNs in either precision: a read before a write shows), then a guard that must stay so.
            blocky = name in ("interp_backward_plane", "interp_backward_band")
            smem = np.full(shared + 512, 0xFF, np.uint8)
            lib.interp_set_launch(ctypes.c_int(block if blocky else 32), ctypes.c_void_p(smem.ctypes.data))
            launched.append(name)
            fn(*[kinds[p.kind](v) for p, v in zip(params, args)])
            assert (smem[shared:] == 0xFF).all(), f"{name} wrote past its shared memory"
        return call

    monkeypatch.setattr(backend, "kernel", kernel)
    yield launched


X = np.random.default_rng(3).standard_normal((2, 3, 7, 9))
CASES = [
    ("zoom_factor: 8", X[:, :, :5, :4]),
    ("zoom_factor: 3", X),
    ("height: 17 width: 5", X),
    ("height: 60 width: 60", X[:1, :2, :6, :6]),  # PSPNet pool6-like
    ("height: 5 width: 300", X[:1, :2, :3, :]),  # several column tasks and passes per row
    ("zoom_factor: 8", X[:1, :2, :, :5]),  # 49 x 33: a last column strip of one column (DeepLab's 513)
    ("shrink_factor: 2", X),
    ("shrink_factor: 3", X),
    ("shrink_factor: 2 zoom_factor: 3", X),
    ("height: 3 width: 2", X),  # downsampling by non-integer ratios
    ("height: 4 width: 13", X),  # down in rows, up in columns
    ("height: 1 width: 1", X),
    ("height: 1 width: 7", X),
    ("height: 6 width: 1", X),
    ("height: 4 width: 5", X[:, :, :1, :1]),  # 1x1 input
    ("zoom_factor: 4", X[:, :, :1, :1]),  # 1x1 input, 1x1 output: a copy
    ("height: 7 width: 9", X),  # same size: a copy
    ("zoom_factor: 2 pad_beg: -1 pad_end: -2", X),
    ("shrink_factor: 2 pad_beg: -2 pad_end: -1", X),
    ("height: 4 width: 6 pad_beg: -1 pad_end: -1", X),  # cropped copy
    ("height: 11 width: 3 pad_beg: 0 pad_end: -3", X),
]


def _run(param, x, gpu, dtype):
    layer = make_layer(f'type: "Interp" interp_param {{ {param} }}', dtype)
    bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    (layer.forward_gpu if gpu else layer.forward_cpu)(bottom, top)
    top[0].mutable_cpu_diff()[...] = np.random.default_rng(5).standard_normal(top[0].shape)
    bottom[0].mutable_cpu_diff()[...] = 99.0  # must be overwritten, zeros outside the window
    (layer.backward_gpu if gpu else layer.backward_cpu)(top, [True], bottom)
    return top[0].cpu_data().copy(), bottom[0].cpu_diff().copy()


# Backward kernels and the settings that choose them: a block per plane (any number of planes), a
# block per band of up to 3 bottom rows (several bands, both walking directions; bands of 1 row),
# one band per plane with at most 64 threads (columns strided over threads), the direct gather.
TWO_PASS = ("interp_backward_rows", "interp_backward_cols")
BACKWARDS = {
    "plane": (("interp_backward_plane",), dict(PLANE_KERNEL_MIN_PLANES=1, TWO_PASS=False)),
    "band3": (("interp_backward_band",), dict(PLANE_KERNEL_MIN_PLANES=1 << 30, BAND_ROWS=3, TWO_PASS=False)),
    "band1": (("interp_backward_band",), dict(PLANE_KERNEL_MIN_PLANES=1 << 30, BAND_ROWS=1, TWO_PASS=False)),
    "band_narrow": (("interp_backward_band",), dict(PLANE_KERNEL_MIN_PLANES=1 << 30, BAND_THREADS=64,
                                                    TWO_PASS=False)),
    "two_pass1": (TWO_PASS, dict(PLANE_KERNEL_MIN_PLANES=1 << 30, TWO_PASS=True, TWO_PASS_ROWS=1)),
    "two_pass3": (TWO_PASS, dict(PLANE_KERNEL_MIN_PLANES=1 << 30, TWO_PASS=True, TWO_PASS_ROWS=3)),
    "two_pass_all": (TWO_PASS, dict(PLANE_KERNEL_MIN_PLANES=1 << 30, TWO_PASS=True, TWO_PASS_ROWS=1 << 20)),
    "direct": (("interp_backward_direct",), dict(SHARED_BYTES=0, TWO_PASS=False)),
}


@pytest.mark.parametrize("backward", list(BACKWARDS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("param,x", CASES, ids=[c[0] for c in CASES])
def test_gpu_path_on_host_matches_cpu(host_gpu, monkeypatch, param, x, dtype, backward):
    kernel, settings = BACKWARDS[backward]
    module = sys.modules[type(make_layer('type: "Interp" interp_param { zoom_factor: 2 }')).__module__]
    for key, value in settings.items():
        monkeypatch.setattr(module, key, value)
    common.set_mode_cpu()
    y_cpu, dx_cpu = _run(param, x, False, dtype)
    y_gpu, dx_gpu = _run(param, x, True, dtype)
    assert host_gpu == ["interp_forward", *kernel]
    tol = dict(rtol=1e-12, atol=1e-13) if dtype == np.float64 else dict(rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(y_gpu, y_cpu, **tol)
    np.testing.assert_allclose(dx_gpu, dx_cpu, **tol)
