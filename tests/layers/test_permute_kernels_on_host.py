"""pycaffe_lite/gpu/permute.cu without a GPU: the file is compiled as host C++ on
``pycaffe_lite.testing.host_kernels.THREADED_SHIM``, which runs each block's threads as OS threads
(``threadIdx``/``blockIdx`` thread-local, ``__shared__`` one static array per kernel,
``__syncthreads`` a barrier, blocks one after another), so the kernels' real index math, tiling and
shared-memory round trip run on host memory. Plans of many shapes and orders (2 to 8 axes, odd sizes, size-1 axes, identity, the benchmark's shapes shrunk) must match
numpy exactly, forward and through the inverse plan; Permute, Transpose and ShuffleChannel run
their forward_gpu/backward_gpu on it too. Marked slow (a compilation and thousands of threads)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite.gpu import backend, permute
from pycaffe_lite.testing import host_kernels as hk
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

pytestmark = [pytest.mark.skipif(hk.CXX is None, reason="no host C++ compiler"), pytest.mark.slow]


@pytest.fixture
def host_kernels(monkeypatch):
    """backend.kernel -> the host build; memcpy_dtod -> memmove. Returns the launches made."""
    launches: list[tuple[str, tuple, int]] = []

    def kernel(path, name, dtype):
        assert Path(path) == permute.KERNELS
        lib, sigs = hk.threaded_library(permute.KERNELS, dtype, ("-I", str(permute.KERNELS.parent)))

        def call(*args, grid, block):
            assert block in (permute.THREADS, permute.NARROW_THREADS, permute.QUAD_THREADS) and grid[1:] == (1, 1) and grid[0] >= 1
            launches.append((name, grid, block))
            hk.launch(lib, sigs[name], args, dtype, grid[0], (block, 1, 1))
        return call

    monkeypatch.setattr(backend, "kernel", kernel)
    monkeypatch.setattr(backend, "memcpy_dtod", lambda dst, src, n: ctypes.memmove(dst, src, n))
    return launches


def _check(shape, order, dtype=np.float64, shift=0):
    x = hk.aligned_copy(np.random.default_rng(len(shape)).standard_normal(shape).astype(dtype), shift)
    plan = permute.plan(shape, order)
    y = hk.aligned_copy(np.full(plan.top_shape, np.nan, dtype), shift)
    plan(x.ctypes.data, y.ctypes.data, dtype)
    np.testing.assert_array_equal(y, x.transpose(order), err_msg=f"{shape} {order} {plan.kind}")
    back = hk.aligned_copy(np.full(shape, np.nan, dtype), shift)
    plan.inverse()(y.ctypes.data, back.ctypes.data, dtype)
    np.testing.assert_array_equal(back, x, err_msg=f"inverse of {shape} {order}")
    return plan


CASES = [
    ((5, 7), (1, 0)),                        # 2 axes, odd, one small tile
    ((33, 65), (1, 0)),                      # ragged edges on both sides
    ((3, 100, 37), (0, 2, 1)),               # batched transpose
    ((2, 16, 6, 7), (0, 2, 3, 1)),           # SSD mbox_loc, shrunk: a 16-wide t axis
    ((2, 84, 7, 5), (0, 2, 3, 1)),           # SSD mbox_conf, shrunk
    ((2, 126, 19, 19), (0, 2, 3, 1)),        # SSD fc7 conf at full spatial size
    ((2, 40, 3, 64), (3, 0, 2, 1)),          # CTPN's Transpose, shrunk
    ((2, 3, 4, 5, 6), (4, 2, 0, 3, 1)),      # 5 axes, nothing collapses
    ((2, 3, 4, 5, 6), (0, 1, 4, 2, 3)),      # 5 axes, collapses to 3
    ((1, 7, 1, 9), (3, 1, 2, 0)),            # size-1 axes
    ((4, 1, 1), (2, 1, 0)),                  # size-1 axes: a copy
    ((3, 4, 5), (0, 1, 2)),                  # identity: a copy
    ((2, 3, 4, 24), (0, 2, 1, 3)),           # runs of 24 (4-wide units)
    ((2, 3, 4, 7), (2, 0, 1, 3)),            # runs of 7 (1-wide units)
    ((2, 3, 5, 4, 6), (3, 1, 0, 2, 4)),      # runs, 5 axes
    ((40, 3, 5), (0, 2, 1)),                 # small planes, a 3-wide side: narrow
    ((3, 5, 70), (0, 2, 1)),                 # narrow t (odd, 5) and back (narrow i), ragged warps
    ((2, 32, 33), (0, 2, 1)),                # narrow at the limit, 2 warps a plane
    ((2, 16, 6, 8), (0, 2, 3, 1)),           # SSD mbox_loc, shrunk to 48 positions: permute_quads
    ((3, 8, 36), (0, 2, 1)),                 # quads, 8-wide t; back: 8-wide i
    ((12, 40), (1, 0)),                      # quads, 2 axes
    ((7, 200), (1, 0)),                      # 2 axes, narrow
    ((2,) * 8, tuple(range(7, -1, -1))),     # 2 x 2 planes, 8 axes: gathered
    ((2, 3, 2, 3, 2, 3, 2), (6, 5, 4, 3, 2, 1, 0)),  # 7 axes: host loop over the outer ones (tiles)
    ((2, 3, 2, 3, 2, 3, 4), (5, 3, 1, 4, 2, 0, 6)),  # 7 axes, runs: host loop too
    ((2, 2, 2, 2, 2, 2, 2, 8), (7, 6, 5, 4, 3, 2, 1, 0)),  # 8 axes
]


@pytest.mark.parametrize("shape,order", CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_plans_match_numpy(host_kernels, shape, order, dtype):
    _check(shape, order, dtype)


def test_kinds_reached(host_kernels):
    kinds = {permute.plan(s, o).kind for s, o in CASES}
    assert kinds == {"copy", "runs", "gather", "tiles", "narrow"}
    assert {ln.kernel for s, o in CASES for p in (permute.plan(s, o), permute.plan(s, o).inverse())
            for ln in p.launches} >= {"permute_narrow_t", "permute_narrow_i"}
    assert any(ln.kernel == "permute_quads" for s, o in CASES for ln in permute.plan(s, o).vector)
    assert permute.plan((2, 3, 4, 24), (0, 2, 1, 3)).vector  # 4-wide runs exist
    assert len(permute.plan(*CASES[-3]).launches) > 1  # the host loop


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_unaligned_pointers_take_the_scalar_runs(host_kernels, dtype):
    _check((2, 3, 4, 24), (0, 2, 1, 3), dtype)
    assert host_kernels[-1][0] == "permute_gather_v4"
    _check((2, 3, 4, 24), (0, 2, 1, 3), dtype, shift=1)
    assert host_kernels[-1][0] == "permute_gather_v1"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_unaligned_pointers_take_the_scalar_narrow_kernels(host_kernels, dtype):
    _check((2, 16, 6, 8), (0, 2, 3, 1), dtype)
    assert [k for k, _, _ in host_kernels[-2:]] == ["permute_quads"] * 2
    _check((2, 16, 6, 8), (0, 2, 3, 1), dtype, shift=1)
    assert [k for k, _, _ in host_kernels[-2:]] == ["permute_narrow_t", "permute_narrow_i"]


def test_empty_does_nothing(host_kernels):
    permute.plan((3, 0, 2), (2, 1, 0))(0, 0, np.float32)  # no launches, pointers never touched
    assert host_kernels == []


@pytest.fixture
def host_blobs(monkeypatch, host_kernels):
    hk.route_blobs_to_host(monkeypatch)


LAYERS = [
    ('type: "Permute" permute_param { order: 0 order: 2 order: 3 order: 1 }', (2, 16, 5, 7)),
    ('type: "Permute" permute_param { order: 0 order: 2 order: 3 order: 1 }', (2, 16, 4, 5)),
    ('type: "Permute" permute_param { order: 1 order: 0 }', (3, 5, 2, 4)),
    ('type: "Permute" permute_param { }', (3, 5, 2)),
    ('type: "Transpose" transpose_param { dim: 3 dim: 0 dim: 2 dim: 1 }', (2, 40, 3, 9)),
    ('type: "ShuffleChannel" shuffle_channel_param { group: 3 }', (2, 12, 4, 5)),
    ('type: "ShuffleChannel" shuffle_channel_param { group: 2 }', (2, 6, 3, 3)),
    ('type: "ShuffleChannel" shuffle_channel_param { group: 1 }', (2, 6, 3, 3)),
    ('type: "ShuffleChannel" shuffle_channel_param { group: 4 }', (3, 8)),
]


@pytest.mark.parametrize("text,shape", LAYERS)
def test_layers_gpu_path_matches_cpu(host_blobs, text, shape):
    x = np.random.default_rng(0).standard_normal(shape)
    outs = []
    for gpu in (False, True):
        layer = make_layer(text)
        bottom, top = blobs([x]), empty_blobs(1)
        layer.setup(bottom, top)
        (layer.forward_gpu if gpu else layer.forward_cpu)(bottom, top)
        top[0].mutable_cpu_diff()[...] = np.arange(top[0].count).reshape(top[0].shape)
        bottom[0].mutable_cpu_diff()[...] = np.nan
        (layer.backward_gpu if gpu else layer.backward_cpu)(top, [True], bottom)
        outs.append((top[0].cpu_data().copy(), bottom[0].cpu_diff().copy()))
    for a, b in zip(*outs):
        np.testing.assert_array_equal(b, a)
