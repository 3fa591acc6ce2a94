"""Interp's GPU path without a GPU: ``layers/interp.cu`` compiled as host C++ on the serial shim
(pycaffe_lite.testing.host_kernels) plus one warp: its 32 lanes run one after another inside each
``FOR_LANE`` phase, so the forward's grid-stride task loop covers every task; the backward's block
of 32 threads runs each ``FOR_THREAD`` stage thread after thread over every tile. Device pointers are
the host arrays' addresses. forward_gpu and backward_gpu then run as written (tables, tiling,
pointer offsets, launch arguments) and must agree with the CPU path, with the default tiling,
one-row bands, narrow column tiles and one-column chunks (INTERP_TILINGS in tests/conftest.py). Marked slow
(two compilations); run with ``python -m pytest -q tests/layers/test_interp_kernels_on_host.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite import common
from pycaffe_lite.gpu import backend
from pycaffe_lite.testing import host_kernels as hk
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

CU = Path(__file__).resolve().parents[2] / "layers" / "interp.cu"
pytestmark = [pytest.mark.skipif(hk.CXX is None, reason="no host C++ compiler"), pytest.mark.slow]

ONE_WARP = """struct Dim3 { unsigned x, y, z; };
static const Dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, gridDim = {1, 1, 1}, blockDim = {32, 1, 1};
#define FOR_LANE(lane) for (int lane = 0; lane < 32; ++lane)
#define FOR_THREAD(tid) for (int tid = 0; tid < 32; ++tid)
#define INTERP_SHARED(name) static Mtype name[1 << 14]
static inline void __syncthreads() {}
"""


@pytest.fixture
def host_gpu(monkeypatch):
    hk.route_blobs_to_host(monkeypatch)
    launched: list[str] = []

    def kernel(path, name, dtype):
        assert Path(path) == CU
        lib, sigs = hk.serial_library(CU, dtype, ONE_WARP)
        fn = getattr(lib, name)

        def call(*args, grid=None, block=None, shared=0):
            if grid is not None:  # whole warps
                assert block % 32 == 0 and 0 < block <= 1024 and grid >= 1
            assert shared <= (1 << 14) * np.dtype(dtype).itemsize
            launched.append(name)
            fn(*hk.kernel_args(sigs[name], args, dtype))
        call.max_threads = 1024
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


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("param,x", CASES, ids=[c[0] for c in CASES])
def test_gpu_path_on_host_matches_cpu(host_gpu, interp_tiling, param, x, dtype):
    common.set_mode_cpu()
    y_cpu, dx_cpu = _run(param, x, False, dtype)
    y_gpu, dx_gpu = _run(param, x, True, dtype)
    assert host_gpu == ["interp_forward", "interp_backward"]
    tol = dict(rtol=1e-12, atol=1e-13) if dtype == np.float64 else dict(rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(y_gpu, y_cpu, **tol)
    np.testing.assert_allclose(dx_gpu, dx_cpu, **tol)
