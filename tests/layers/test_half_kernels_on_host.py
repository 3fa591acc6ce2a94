"""The half-kernel layers' GPU code on half storage without a GPU: the ``.cu`` files and the string
kernels are built as host C++ (``testing.host_kernels``: ``THREADED_SHIM``, blocks of OS threads;
``Dtype`` the compiler's ``_Float16`` for fp16, a 16-bit struct rounding as cuda_bf16.h does for
bf16; ``Mtype`` float), the device API runs on host memory, and each layer of
``test_half_kernels.CASES``, created as a half net built in GPU mode creates it (``dtype`` = the
storage type), runs its ``forward_gpu`` / ``backward_gpu`` through ``testing.half_check`` against
float64 on the CPU with the same bounds as on the GPU. This runs the kernels' half paths (loads,
stores, Mtype scalars and partial sums, BatchNorm's float statistics); the host's float math and
conversions stand in for the device's. Marked slow (compilations)."""

from __future__ import annotations

import numpy as np
import pytest
from test_half_kernels import CASES

from pycaffe_lite import common, memcheck
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.testing import host_kernels as hk
from pycaffe_lite.testing.half_check import check_half_gpu

pytestmark = [pytest.mark.skipif(hk.CXX is None, reason="no host C++ compiler (g++ or c++) on PATH"),
              pytest.mark.slow]


@pytest.fixture
def host_gpu(monkeypatch):
    """GPU mode on the host: kernels built by the host compiler, blobs' device pointers their host
    arrays (``host_kernels.threaded_device``); GPU mode switched on without a device."""
    hk.threaded_device(monkeypatch)
    monkeypatch.setattr(common, "set_mode_gpu", lambda: setattr(common.context(), "mode", common.Mode.GPU))
    monkeypatch.setattr(backend, "device_memory_bytes", memcheck.host_limit)

    def sum_rows_into(rows, cols, x, y, dt, beta=1.0):  # (cuBLAS's GEMV: not on the host)
        raise AssertionError("no GEMV expected: the cases have spatial sizes > 1")

    monkeypatch.setattr(gm, "sum_rows_into", sum_rows_into)
    yield
    common.context().mode = common.Mode.CPU


@pytest.mark.parametrize("dtype", [pytest.param(np.float16, id="fp16"), pytest.param(np.uint16, id="bf16")])
@pytest.mark.parametrize(("text", "bottoms", "k", "ntop", "propagate", "params"),
                         [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_half_kernels_on_the_host_match_float64(host_gpu, text, bottoms, k, ntop, propagate, params, dtype):
    ratios = check_half_gpu(text, bottoms, dtype, k, ntop=ntop, propagate=propagate, params=params)
    assert ratios and max(ratios.values()) <= 1.0
