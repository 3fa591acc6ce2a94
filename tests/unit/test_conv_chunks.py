"""CPU convolution in chunks of images (pycaffe_lite.conv.cpu / cpu_nd under WORKSPACE_BYTES): the
chunked passes equal the whole-batch ones, and the scratch the memory checks count is what the
passes really allocate (numpy's allocations, traced by tracemalloc)."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from pycaffe_lite.conv import cpu as cpu_conv
from pycaffe_lite.conv import cpu_nd as cpu_conv_nd
from pycaffe_lite.conv.geometry import out_shape, out_shape_nd

# (x shape, num_output, kernel, pad, stride, dilation, group)
CASES_2D = [
    ((7, 3, 9, 9), 4, (3, 3), (1, 1), (2, 2), (1, 1), 1),     # "hwn" layout (small plane)
    ((5, 4, 20, 18), 6, (3, 3), (1, 1), (1, 1), (1, 1), 2),   # "nchw" layout
    ((3, 2, 1, 1), 2, (2, 2), (0, 0), (2, 2), (1, 1), 1),     # overhanging window (BVLC's truncation)
]
CASES_ND = [
    ((5, 3, 4, 5, 6), 4, (3, 2, 3), (1, 0, 1), (2, 1, 2), (1, 1, 1), 1),
    ((4, 4, 7), 6, (3,), (2,), (1,), (2,), 2),
    ((3, 2, 1, 1, 1), 2, (2, 2, 2), (0, 0, 0), (2, 2, 2), (1, 1, 1), 1),
]


def run_2d(x, w, b, dy, geo, group):
    out = np.empty(dy.shape)
    cpu_conv.forward(x, w, b, *geo, group, out)
    dw, db, dx = np.zeros(w.shape), np.zeros(b.shape), np.empty(x.shape)
    cpu_conv.backward(x, w, dy, *geo, group, dweight=dw, dbias=db, dx=dx)
    return out, dw, db, dx


def run_nd(x, w, b, dy, geo, group):
    out = np.empty(dy.shape)
    cpu_conv_nd.forward(x, w, b, *geo, group, out)
    dw, db, dx = np.zeros(w.shape), np.zeros(b.shape), np.empty(x.shape)
    cpu_conv_nd.backward(x, w, dy, *geo, group, dweight=dw, dbias=db, dx=dx)
    return out, dw, db, dx


def make(shape, m, kernel, pad, stride, dilation, group, nd):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape)
    w = rng.standard_normal((m, shape[1] // group) + kernel)
    b = rng.standard_normal(m)
    spatial = out_shape_nd(shape[2:], kernel, pad, stride, dilation) if nd else \
        out_shape(shape[2], shape[3], kernel, pad, stride, dilation)
    dy = rng.standard_normal((shape[0], m) + tuple(spatial))
    return x, w, b, dy


@pytest.mark.parametrize("nd", [False, True])
@pytest.mark.parametrize("index", range(3))
def test_chunked_passes_equal_the_whole_batch(monkeypatch, nd, index):
    shape, m, kernel, pad, stride, dilation, group = (CASES_ND if nd else CASES_2D)[index]
    x, w, b, dy = make(shape, m, kernel, pad, stride, dilation, group, nd)
    run = run_nd if nd else run_2d
    geo = (kernel, pad, stride, dilation)
    whole = run(x, w, b, dy, geo, group)
    calls = []
    inner = cpu_conv_nd._forward if nd else cpu_conv._forward
    monkeypatch.setattr(cpu_conv_nd if nd else cpu_conv, "_forward", lambda x, *a: calls.append(len(x)) or inner(x, *a))
    fixed, per = (cpu_conv_nd if nd else cpu_conv).scratch_bytes(
        ["forward"], shape[1], shape[2:], m, group, *geo, x.itemsize)
    monkeypatch.setattr(cpu_conv, "WORKSPACE_BYTES", fixed + 2 * per)  # two images a chunk
    chunked = run(x, w, b, dy, geo, group)
    assert calls == [2] * (shape[0] // 2) + [shape[0] % 2] * (shape[0] % 2)
    for got, want in zip(chunked, whole):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(cpu_conv, "WORKSPACE_BYTES", 1)  # below one image's need: still one image a chunk
    calls.clear()
    for got, want in zip(run(x, w, b, dy, geo, group), whole):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert calls == [1] * shape[0]


def traced_peak(fn) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("nd", [False, True])
def test_counted_scratch_is_what_the_passes_allocate(monkeypatch, nd):
    """chunk_bytes (what Convolution's reshape and the Net check) bounds the memory a forward and a
    backward really allocate, chunked or not, and is not a gross over-estimate."""
    shape, m, kernel, pad, stride, dilation, group = (12, 8, 24, 24), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1
    if nd:
        shape, kernel, pad, stride, dilation = (12, 8, 6, 8, 12), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)
    x, w, b, dy = make(shape, m, kernel, pad, stride, dilation, group, nd)
    mod = cpu_conv_nd if nd else cpu_conv
    geo = (kernel, pad, stride, dilation)
    for budget in (cpu_conv.WORKSPACE_BYTES, 3 * x[0].nbytes * int(np.prod(kernel))):
        monkeypatch.setattr(cpu_conv, "WORKSPACE_BYTES", budget)
        counted = mod.chunk_bytes(shape[0], cpu_conv.PASSES, shape[1], shape[2:], m, group, *geo, x.itemsize)
        cpu_conv._workspace.buffers = {}  # the 2-D scratch starts empty, as in a fresh process
        out, dw, db, dx = np.empty(dy.shape), np.zeros(w.shape), np.zeros(b.shape), np.empty(x.shape)

        def passes(out=out, dw=dw, db=db, dx=dx):
            mod.forward(x, w, b, *geo, group, out)
            mod.backward(x, w, dy, *geo, group, dweight=dw, dbias=db, dx=dx)

        peak = traced_peak(passes)
        assert peak <= counted * 1.05 + (256 << 10), (budget, peak, counted)  # + numpy ufunc buffers
        assert peak >= counted * 0.4, (budget, peak, counted)
        if budget < cpu_conv.WORKSPACE_BYTES:
            assert counted < budget + x[0].nbytes * 2 * int(np.prod(kernel)), "chunks stay near the budget"


def test_held_bytes_of_two_convolutions_bounds_what_they_allocate():
    """Two 2-D convolutions of different shapes one after the other (a net's layers): the scratch
    buffers they share by name stay allocated at the larger of each, and held_bytes counts that."""
    cases = [((6, 4, 30, 30), 8, (5, 5), (2, 2), (1, 1)),   # "nchw": large columns
             ((6, 16, 8, 8), 32, (3, 3), (1, 1), (1, 1))]   # "hwn": its own y / dy buffers
    arrays, parts = [], []
    for shape, m, kernel, pad, stride in cases:
        x, w, b, dy = make(shape, m, kernel, pad, stride, (1, 1), 1, False)
        arrays.append((x, w, b, dy, (kernel, pad, stride, (1, 1))))
        parts.append(cpu_conv.chunk_buffers(shape[0], cpu_conv.PASSES, shape[1], shape[2:], m, 1, kernel, pad,
                                            stride, (1, 1), 8))
    counted = cpu_conv.held_bytes(parts)
    assert counted < sum(sum(p.values()) for p in parts)  # shared names are not counted twice
    cpu_conv._workspace.buffers = {}

    def passes():
        for x, w, b, dy, geo in arrays:
            out, dw, db, dx = np.empty(dy.shape), np.zeros(w.shape), np.zeros(b.shape), np.empty(x.shape)
            cpu_conv.forward(x, w, b, *geo, 1, out)
            cpu_conv.backward(x, w, dy, *geo, 1, dweight=dw, dbias=db, dx=dx)

    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        passes()
        held, peak = (v - base for v in tracemalloc.get_traced_memory())
    finally:
        tracemalloc.stop()
    kept = sum(buf.nbytes for buf in cpu_conv._workspace.buffers.values())
    assert held >= kept  # the scratch buffers are what stays allocated
    assert kept == sum(max(p.get(k, 0) for p in parts) for k in {*parts[0], *parts[1]} if k.startswith("scratch:"))
    assert peak <= counted * 1.05 + (256 << 10) + sum(a[3].nbytes + a[0].nbytes + a[1].nbytes for a in arrays)
