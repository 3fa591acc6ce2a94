"""NeuronLayer: the generic launch, and every neuron type's GPU code checked without a GPU.

A stand-in for the GPU backend (host memory; kernels parsed from the generated or ``.cu`` sources)
runs each layer's GPU forward and backward: every launch is checked against its kernel's signature
and every source is collected. The sources are then compiled by nvcc for sm_90 (as the backend
would, batched into one file per dtype), and, built for the host by g++, run against the numpy path.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite import common, memcheck
from pycaffe_lite.errors import CudaError, NetError
from pycaffe_lite.gpu import backend, cuda_graph
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.gpu.signatures import check_args, parse_signatures
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

# (layer text, input range, has backward)
NEURONS = [
    ("type: 'ReLU'", -2, 2, True),
    ("type: 'ReLU' relu_param { negative_slope: 0.1 }", -2, 2, True),
    ("type: 'Sigmoid'", -9, 9, True),
    ("type: 'TanH'", -3, 3, True),
    ("type: 'AbsVal'", -2, 2, True),
    ("type: 'BNLL'", -60, 60, True),
    ("type: 'ELU' elu_param { alpha: 0.5 }", -2, 2, True),
    ("type: 'Exp' exp_param { base: 2 scale: 0.5 shift: 1 }", -2, 2, True),
    ("type: 'Log' log_param { base: 10 scale: 2 shift: 0.5 }", 0.1, 3, True),
    ("type: 'Power' power_param { power: 2 scale: 0.5 shift: 1.5 }", -2, 2, True),
    ("type: 'Power' power_param { power: 0.5 scale: 2 shift: 1 }", 0.1, 2, True),
    ("type: 'Power' power_param { power: 3 }", -2, 2, True),
    ("type: 'Power' power_param { power: 1 scale: -2 shift: 0.3 }", -2, 2, True),
    ("type: 'Power' power_param { power: 0 scale: 3 shift: 2 }", -2, 2, True),
    ("type: 'Swish' swish_param { beta: 2.5 }", -3, 3, True),
    ("type: 'Clip' clip_param { min: -0.5 max: 0.7 }", -2, 2, True),
    ("type: 'Threshold' threshold_param { threshold: 0.3 }", -2, 2, False),
    ("type: 'PReLU' prelu_param { filler { type: 'uniform' min: 0.1 max: 0.6 } }", -2, 2, True),
    ("type: 'PReLU' prelu_param { channel_shared: true }", -2, 2, True),
    ("type: 'Dropout' phase: TEST", -2, 2, True),
]
SHAPE = (2, 3, 4, 5)
DTYPES = (np.float32, np.float64)
HOST_PRELUDE = """#include <math.h>
typedef {ctype} Dtype;
typedef Dtype Mtype;
static inline Mtype to_m(const Dtype x) {{ return x; }}
static inline Dtype from_m(const Mtype x) {{ return x; }}
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define CUDA_KERNEL_LOOP(i, n) for (int i = 0; i < (n); ++i)
"""


def _x(low, high, seed=0):
    x = np.random.default_rng(seed).uniform(low, high, SHAPE)
    if low < 0 < high:
        x.flat[::7] = 0.0  # kinks: both devices must agree there too
    return x


def _ctype(dtype) -> str:
    return "float" if np.dtype(dtype) == np.float32 else "double"


def _unique_names(source: str, k: int) -> str:
    return re.sub(r"(__global__\s+void\s+)(\w+)", rf"\g<1>\g<2>__{k}", source)


class _Kernel:
    def __init__(self, device, key, sig):
        self.device, self.key, self.signature, self.name = device, key, sig, sig.name

    def check_args(self, *args):
        try:
            check_args(self.signature, args, self.key[2])
        except (TypeError, ValueError) as exc:
            raise CudaError(str(exc)) from None

    def __call__(self, *args, block=256, grid=None, shared=0):
        self.check_args(*args)
        if grid is None and int(args[0]) <= 0:
            return
        assert grid is None or grid in (1, (1, 1, 1)), "the host runs grid-stride or one-thread kernels only"
        self.launch(grid, block, *args)

    def launch(self, grid, block, *args, shared=0):
        self.device.launch(self, args)


class _Module:
    def __init__(self, device, key):
        self.device, self.key = device, key
        self.signatures = parse_signatures(key[0])

    def get(self, name):
        return _Kernel(self.device, self.key, self.signatures[name])


class HostDevice:
    """The backend's memory and kernel calls on the host. Without ``libs`` kernels are only checked and
    their sources recorded; with ``libs`` ((source, dtype) -> ctypes library) they run. A CUDA graph
    capture records the queued work and replays it."""

    def __init__(self, libs=None):
        self.libs, self.sources, self.launches = libs, {}, []
        self.keep = []  # host buffers standing in for device allocations
        self.recording = None
        self.state = type("State", (), {"recording": None, "alloc_generation": 0, "device_id": 0})()

    def alloc(self, nbytes):
        if self.state.recording is not None:
            raise CudaError("allocation during capture")
        self.state.alloc_generation += 1
        self.keep.append(np.full(max(int(nbytes), 1), 0xAB, np.uint8))  # garbage, as device memory
        return self.keep[-1].ctypes.data

    def queue(self, op):
        if self.recording is None:
            op()
        else:
            self.recording.append(op)

    def compiled(self, key, make):
        source = key[1] if key[0] == "elementwise" else Path(key[1]).read_text()
        mkey = (source, np.dtype(key[2]).str, key[1] if key[0] == "file" else "elementwise")
        self.sources.setdefault(mkey[:2], mkey[2])
        return _Module(self, mkey)

    def launch(self, kernel, args):
        self.launches.append(kernel.name)
        if self.libs is None:
            return
        lib, k = self.libs[kernel.key[1]], self.libs[kernel.key[:2]]
        fn = getattr(lib, f"{kernel.name}__{k}")
        scalar = ctypes.c_float if kernel.key[1] == np.dtype(np.float32).str else ctypes.c_double
        kinds = {"ptr": ctypes.c_void_p, "int": ctypes.c_int, "uint": ctypes.c_uint, "scalar": scalar,
                 "mscalar": scalar}
        self.queue(lambda: fn(*(kinds[p.kind](a) for p, a in zip(kernel.signature.params, args))))

    def view(self, ptr, count, dtype):
        return np.ctypeslib.as_array((ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(ptr)).view(dtype)

    def channel_sum(self, num, channels, spatial, x, out, dtype, beta=1.0):
        def op():
            o = self.view(out, channels, dtype)
            o[...] = beta * o + self.view(x, num * channels * spatial, dtype).reshape(num, channels, -1).sum((0, 2))
        self.queue(op)

    def sum_rows_into(self, rows, cols, x, y, dtype, beta=1.0):
        def op():
            o = self.view(y, cols, dtype)
            o[...] = beta * o + self.view(x, rows * cols, dtype).reshape(rows, cols).sum(0)
        self.queue(op)

    @contextlib.contextmanager
    def capture(self, recording):
        self.recording, self.state.recording = [], recording
        try:
            yield recording
        finally:
            ops, self.recording, self.state.recording = self.recording, None, None
        recording.graph = type("Graph", (), {"launch": lambda _: [op() for op in ops]})()

    @contextlib.contextmanager
    def installed(self):
        mem = ctypes.memmove
        with pytest.MonkeyPatch.context() as mp:
            for name, value in {
                "state": lambda: self.state, "recording": lambda: self.state.recording,
                "init_device": lambda *a: None, "alloc": self.alloc, "device_memory_bytes": memcheck.host_limit,
                "_compiled": self.compiled, "workspace": lambda *sizes: [self.alloc(s) for s in sizes],
                "memset_zero": lambda p, n: self.queue(lambda: ctypes.memset(p, 0, n)),
                "memcpy_dtod": lambda d, s, n: self.queue(lambda: mem(d, s, n)),
                "memcpy_htod": lambda d, a, pinned=False: mem(d, np.ascontiguousarray(a).ctypes.data, a.nbytes),
                "memcpy_dtoh": lambda a, s: mem(a.ctypes.data, s, a.nbytes),
            }.items():
                mp.setattr(backend, name, value)
            mp.setattr(gm, "channel_sum", self.channel_sum)
            mp.setattr(gm, "sum_rows_into", self.sum_rows_into)
            mp.setattr(cuda_graph, "capture", self.capture)
            try:
                yield self
            finally:
                common.set_mode_cpu()


def _exercise_gpu_paths() -> None:
    """Every GPU path of the neuron layers: out of place, in place, Dropout at TRAIN."""
    for dtype in DTYPES:
        for text, low, high, has_backward in NEURONS + [("type: 'Dropout'", -2, 2, True)]:
            common.set_mode_gpu()
            run_layer(text, [_x(low, high)], propagate=[has_backward], dtype=dtype)
            if "AbsVal" not in text:
                layer, (blob,) = make_layer(text, dtype), blobs([_x(low, high)], dtype)
                layer.setup([blob], [blob])
                layer.forward([blob], [blob])
                layer.backward([blob], [has_backward], [blob])


@pytest.fixture(scope="module")
def generated_sources() -> dict:
    """(source, dtype.str) -> where, for every kernel the neuron layers launch."""
    device = HostDevice()
    with device.installed():
        _exercise_gpu_paths()
    return device.sources


def test_every_launch_fits_its_signature(generated_sources):
    kinds = {(where, dt) for (_, dt), where in generated_sources.items()}
    assert {("elementwise", np.dtype(d).str) for d in DTYPES} <= kinds
    assert any(w.endswith("dropout.cu") for w, _ in kinds)
    assert len(generated_sources) >= 2 * 30


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.slow
def test_generated_kernels_compile_with_nvcc(generated_sources, dtype, tmp_path):
    sources = [s for (s, dt) in generated_sources if dt == np.dtype(dtype).str]
    body = "\n".join(_unique_names(s, k) for k, s in enumerate(sources))
    src = tmp_path / "neurons.cu"
    src.write_text('extern "C" {\n' + backend.prelude(dtype) + body + "\n}\n")
    proc = subprocess.run(["nvcc", "-c", "-arch=sm_90", "-O3", "-o", str(tmp_path / "neurons.o"), str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def host_device(generated_sources, tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    libs, folder = {}, tmp_path_factory.mktemp("host_kernels")
    for dtype in map(np.dtype, DTYPES):
        sources = [s for (s, dt) in generated_sources if dt == dtype.str]
        libs.update({(s, dtype.str): k for k, s in enumerate(sources)})
        cpp, so = folder / f"{dtype.name}.cpp", folder / f"{dtype.name}.so"
        body = "\n".join(_unique_names(s, k) for k, s in enumerate(sources))
        cpp.write_text(HOST_PRELUDE.format(ctype=_ctype(dtype)) + 'extern "C" {\n' + body + "\n}\n")
        subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(so), str(cpp)], check=True)
        libs[dtype.str] = ctypes.CDLL(str(so))
    with HostDevice(libs).installed() as device:
        yield device


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", NEURONS, ids=[t[7:].split("'")[0] + str(i) for i, (t, *_) in enumerate(NEURONS)])
@pytest.mark.slow
def test_gpu_statements_on_the_host_agree_with_numpy(host_device, case, dtype):
    text, low, high, has_backward = case
    tol = {"rtol": 2e-5, "atol": 2e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-13}
    with np.errstate(all="ignore"):  # Power with power 3 and no shift: 0/0 at x = 0 on both devices
        assert_cpu_gpu_agree(text, [_x(low, high, seed=3)], propagate=[has_backward], dtype=dtype, **tol)


def test_dropout_on_the_host_device_replays_fresh_masks(host_device):
    """Under a (host) graph capture, each replay of Dropout's forward advances the device counter."""
    common.set_mode_gpu()
    layer, bottom, top = make_layer("type: 'Dropout'"), blobs([np.ones((40, 50))]), empty_blobs(1)
    layer.setup(bottom, top)
    common.set_random_seed(3)
    layer.forward(bottom, top)
    first = layer.mask.cpu_data().copy()
    recording = cuda_graph.Recording()
    with cuda_graph.capture(recording):
        layer.forward(bottom, top)
    masks = []
    for _ in range(2):
        recording.graph.launch()
        masks.append(layer.mask.cpu_data().copy())
        layer.mask.data_memory.mark_device_newest()  # as the executor marks written memory
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(first, masks[0])
    assert abs(np.mean(masks[1]) - 0.5) < 0.05


# -- the base ------------------------------------------------------------------------------------
def test_launch_passes_only_the_arrays_a_statement_uses(monkeypatch):
    calls = []

    def elementwise(name, params, body, dtype, preamble=""):
        return lambda *args: calls.append((name, params, args))

    monkeypatch.setattr(backend, "elementwise", elementwise)
    layer = make_layer("type: 'PReLU'")
    layer.setup(blobs([np.zeros((2, 3, 4))]), empty_blobs(1))
    layer.launch("t", "dx[i] = x[i] > 0 ? dy[i] : dy[i] * slope[c]", 24, x=1, y=2, dy=3, dx=4, slope=5)
    assert calls == [("prelu_t", "const Dtype* x, const Dtype* dy, Dtype* dx, const Dtype* slope, "
                      "const int channels, const int dim, const int div", (24, 1, 3, 4, 5, 3, 4, 1))]


def test_in_place_refused_where_backward_needs_the_input():
    layer, (b,) = make_layer("type: 'AbsVal'"), blobs([np.ones(3)])
    with pytest.raises(NetError, match="AbsVal.*in-place"):
        layer.setup([b], [b])
