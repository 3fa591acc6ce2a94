"""Pooling's GPU path without a GPU: forward_gpu/backward_gpu run with every pooling.cu kernel
replaced by a pure-Python emulation that walks the launch's grid-stride loop thread by thread with
the kernel's own int arithmetic (C division, POOL_BACKWARD_PLANES read from the .cu), and are
compared with the CPU layer. Arguments are bound by the .cu signatures' parameter names, so a wrong
work-item count, argument order or window range fails here; each bottom diff must be written once."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.gpu.signatures import parse_signatures
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

GRID, BLOCK = 3, 32  # a small launch, so the grid-stride loop takes several turns
LOWEST = -np.finfo(np.float32).max


def cdiv(a: int, b: int) -> int:
    """C's int division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def grid_stride(count: int):
    for thread in range(GRID * BLOCK):
        yield from range(thread, count, GRID * BLOCK)


def ave_pool_size(ph, pw, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, **_):
    hstart, wstart = ph * stride_h - pad_h, pw * stride_w - pad_w
    return (min(hstart + kernel_h, height + pad_h) - hstart) * (min(wstart + kernel_w, width + pad_w) - wstart)


def window(index, height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, **_):
    pw, ph, plane = index % pooled_w, cdiv(index, pooled_w) % pooled_h, cdiv(index, pooled_w * pooled_h)
    hs, ws = max(ph * stride_h - pad_h, 0), max(pw * stride_w - pad_w, 0)
    he, we = min(ph * stride_h - pad_h + kernel_h, height), min(pw * stride_w - pad_w + kernel_w, width)
    return ph, pw, plane * height * width, [(h, w) for h in range(hs, he) for w in range(ws, we)]


def max_pool_forward(a, dt):
    x, top, mask = a["bottom"], a["top"], a["mask"]
    for index in grid_stride(a["count"]):
        _, _, base, cells = window(index, **a)
        best, arg = dt(LOWEST), -1
        for h, w in cells:
            if x[base + h * a["width"] + w] > best:
                best, arg = x[base + h * a["width"] + w], h * a["width"] + w
        top[index], mask[index] = best, arg


def ave_pool_forward(a, dt):
    x, top = a["bottom"], a["top"]
    for index in grid_stride(a["count"]):
        ph, pw, base, cells = window(index, **a)
        total = dt(0)
        for h, w in cells:
            total += x[base + h * a["width"] + w]
        top[index] = total / dt(ave_pool_size(ph, pw, **a)) if cells else dt(0)


def pool_mask_to_dtype(a, dt):
    for index in grid_stride(a["count"]):
        a["out"][index] = a["mask"][index]


def pool_backward(a, dt, planes_per_thread, is_max):
    """pool_backward<MAX> of pooling.cu; returns how often each bottom diff element was written."""
    height, width, pooled_h, pooled_w = a["height"], a["width"], a["pooled_h"], a["pooled_w"]
    (kh, kw), (sh, sw), (pad_h, pad_w) = (a["kernel_h"], a["kernel_w"]), (a["stride_h"], a["stride_w"]), \
        (a["pad_h"], a["pad_w"])
    dy, dx = a["top_diff"], a["bottom_diff"]
    top_plane, bottom_plane = pooled_h * pooled_w, height * width
    writes = np.zeros(dx.size, dtype=int)
    for index in grid_stride(a["count"]):
        row = cdiv(index, width)
        w = index - row * width
        group = cdiv(row, height)
        h = row - group * height
        plane0 = group * planes_per_thread
        nplanes = min(a["planes"] - plane0, planes_per_thread)
        assert nplanes > 0, "no idle work items: count = ceil(planes / POOL_BACKWARD_PLANES) * height * width"
        phstart = 0 if h + pad_h < kh else cdiv(h + pad_h - kh, sh) + 1
        phend = min(cdiv(h + pad_h, sh) + 1, pooled_h)
        pwstart = 0 if w + pad_w < kw else cdiv(w + pad_w - kw, sw) + 1
        pwend = min(cdiv(w + pad_w, sw) + 1, pooled_w)
        target, top0 = h * width + w, plane0 * top_plane
        grad = [dt(0)] * planes_per_thread
        for ph in range(phstart, phend):
            for pw in range(pwstart, pwend):
                t = top0 + ph * pooled_w + pw
                size = None if is_max else dt(ave_pool_size(ph, pw, **a))
                for k in range(nplanes):
                    if not is_max:
                        grad[k] += dy[t + k * top_plane] / size
                    elif a["mask"][t + k * top_plane] == target:
                        grad[k] += dy[t + k * top_plane]
        for k in range(nplanes):
            dx[(plane0 + k) * bottom_plane + target] = grad[k]
            writes[(plane0 + k) * bottom_plane + target] += 1
    return writes


def pool_backward_blocked(a, dt, S: int, WD: int, is_max: bool) -> np.ndarray:
    """pool_backward_blocked<MAX, S, WD>: one thread per (plane, bh, bw) block of S x S pixels."""
    dy, dx = a["top_diff"], a["bottom_diff"]
    height, width, pooled_h, pooled_w = a["height"], a["width"], a["pooled_h"], a["pooled_w"]
    bh_n, bw_n = a["blocks_h"], a["blocks_w"]
    writes = np.zeros(dx.size, np.int64)
    for index in grid_stride(a["count"]):
        bw, row = index % bw_n, cdiv(index, bw_n)
        bh, plane = row % bh_n, cdiv(row, bh_n)
        h0, w0 = bh * S - a["pad_h"], bw * S - a["pad_w"]
        grad = [[dt(0)] * S for _ in range(S)]
        for ph in range(bh - WD + 1, bh + 1):
            for pw in range(bw - WD + 1, bw + 1):
                if not (0 <= ph < pooled_h and 0 <= pw < pooled_w):
                    continue
                t = plane * pooled_h * pooled_w + ph * pooled_w + pw
                if is_max:
                    for i in range(S):
                        for j in range(S):
                            if a["mask"][t] == (h0 + i) * width + (w0 + j):
                                grad[i][j] += dy[t]
                    continue
                d = dy[t] / dt(ave_pool_size(ph, pw, **a))
                top, left = ph * a["stride_h"] - a["pad_h"], pw * a["stride_w"] - a["pad_w"]
                for i in range(S):
                    for j in range(S):
                        if top <= h0 + i < top + a["kernel_h"] and left <= w0 + j < left + a["kernel_w"]:
                            grad[i][j] += d
        for i in range(S):
            for j in range(S):
                if 0 <= h0 + i < height and 0 <= w0 + j < width:
                    k = plane * height * width + (h0 + i) * width + w0 + j
                    dx[k] = grad[i][j]
                    writes[k] += 1
    return writes


def ave_pool_backward_quad(a, dt, S: int, WD: int, NW: int, R: int) -> np.ndarray:
    """ave_pool_backward_quad<S, WD, NW, R>: one thread per (plane, strip of R block rows, 4 columns)."""
    dy, dx = a["top_diff"], a["bottom_diff"]
    height, width, pooled_h, pooled_w = a["height"], a["width"], a["pooled_h"], a["pooled_w"]
    kh, kw, pad_h, pad_w = a["kernel_h"], a["kernel_w"], a["pad_h"], a["pad_w"]
    assert width % 4 == 0 and NW >= -(-(kw + 3) // S)
    quads, strips = width // 4, a["strips"]
    writes = np.zeros(dx.size, np.int64)
    for index in grid_stride(a["count"]):
        q, row = index % quads, cdiv(index, quads)
        strip, plane = row % strips, cdiv(row, strips)
        h0, c0 = strip * R * S - pad_h, 4 * q
        pw0 = 0 if c0 + pad_w < kw else cdiv(c0 + pad_w - kw, S) + 1
        grad = [[dt(0)] * 4 for _ in range(R * S)]
        for ph in range(strip * R - WD + 1, strip * R + R):
            for pw in range(pw0, pw0 + NW):
                top, left = ph * S - pad_h, pw * S - pad_w
                if not (0 <= ph < pooled_h and pw < pooled_w and left <= c0 + 3):
                    continue
                d = dy[plane * pooled_h * pooled_w + ph * pooled_w + pw] / dt(ave_pool_size(ph, pw, **a))
                for y in range(R * S):
                    for j in range(4):
                        if top <= h0 + y < top + kh and left <= c0 + j < left + kw:
                            grad[y][j] += d
        for y in range(R * S):
            if 0 <= h0 + y < height:
                for j in range(4):
                    k = plane * height * width + (h0 + y) * width + c0 + j
                    dx[k] = grad[y][j]
                    writes[k] += 1
    return writes


class Emulated:
    """Stands in for a compiled kernel: binds a flat launch's arguments by the signature's names."""

    def __init__(self, source: str, name: str, dtype, log: list) -> None:
        self.sig, self.dtype, self.log = parse_signatures(source)[name], np.dtype(dtype).type, log
        self.planes = int(re.search(r"#define POOL_BACKWARD_PLANES (\d+)", source).group(1))

    def __call__(self, *args, **launch):
        assert not launch, "pooling kernels are launched from their work-item count"
        assert len(args) == len(self.sig.params)
        a = {}
        for p, v in zip(self.sig.params, args):
            if p.kind == "ptr":  # host arrays stand in for device pointers; int* views the raw bits
                v = v.reshape(-1).view(np.int32) if p.name == "mask" else v.reshape(-1)
            a[p.name] = v
        name = self.sig.name
        blocked = re.search(r"_backward_s(\d+)_w(\d+)$", name)
        quad = re.search(r"_backward_q_s(\d+)_w(\d+)_n(\d+)_r(\d+)$", name)
        if quad:
            self.log.append(ave_pool_backward_quad(a, self.dtype, *map(int, quad.groups())))
        elif blocked:
            self.log.append(pool_backward_blocked(a, self.dtype, int(blocked[1]), int(blocked[2]),
                                                  name.startswith("max")))
        elif name.endswith("backward"):
            self.log.append(pool_backward(a, self.dtype, self.planes, name.startswith("max")))
        else:
            globals()[name](a, self.dtype)


def emulate_gpu(monkeypatch, layer, log: list) -> None:
    """Route the layer's device pointers to host arrays and its kernels to the emulations."""
    for gpu, cpu in (("gpu_data", "cpu_data"), ("gpu_diff", "cpu_diff"),
                     ("mutable_gpu_data", "mutable_cpu_data"), ("mutable_gpu_diff", "mutable_cpu_diff")):
        monkeypatch.setattr(Blob, gpu, getattr(Blob, cpu))
    vec_width = gm.vec_width  # host arrays stand in for pointers: their addresses decide
    monkeypatch.setattr(gm, "vec_width", lambda inner, dtype, *ptrs: vec_width(
        inner, dtype, *(p.ctypes.data if isinstance(p, np.ndarray) else p for p in ptrs)))
    source = Path(inspect.getfile(type(layer))).with_suffix(".cu").read_text()
    monkeypatch.setattr(layer, "_k", lambda name: Emulated(source, name, layer.dtype, log))


GEOMETRIES = [
    ((2, 3, 7, 9), "kernel_size: 3 stride: 2 pad: 1"),  # kernel > stride, padding, 6 planes: a partial group
    ((1, 5, 6, 7), "kernel_h: 3 kernel_w: 2 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 0"),  # non-square, heavy overlap rows
    ((1, 2, 4, 4), "kernel_size: 3 stride: 3 pad: 2"),  # last window clipped by the pad rule
    ((1, 3, 8, 8), "kernel_size: 2 stride: 3"),  # stride > kernel: gaps that get zero
    ((2, 2, 9, 8), "kernel_h: 3 kernel_w: 2 stride_h: 3 stride_w: 2"),  # exact non-square tiling
    ((2, 2, 7, 9), "kernel_size: 2 stride: 2 round_mode: FLOOR"),  # floor: trailing rows/cols in no window
    ((1, 1, 5, 5), "kernel_size: 4 stride: 1 pad: 2"),  # up to 16 windows per pixel, one plane
    ((3, 3, 4, 5), "global_pooling: true"),  # 9 planes
    ((1, 2, 7, 6), "kernel_size: 3 stride: 1 pad: 1"),  # blocked S=1, WD=3
    ((2, 2, 7, 8), "kernel_size: 2 stride: 2 pad: 1"),  # blocked S=2, WD=1, a block row all padding
    ((2, 3, 7, 12), "kernel_size: 3 stride: 2 pad: 1"),  # AVE 4-wide: S=2, WD=2
    ((1, 2, 6, 8), "kernel_size: 3 stride: 1 pad: 1"),  # AVE 4-wide: S=1, WD=3
]


@pytest.mark.parametrize("blocked", [True, False], ids=["blocked", "gather"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,body", GEOMETRIES)
def test_emulated_gpu_kernels_match_cpu(monkeypatch, shape, body, method, dtype, blocked):
    rng = np.random.default_rng(7)
    x = rng.integers(-3, 4, size=shape).astype(dtype)  # many ties: the first maximum must win
    text = f'type: "Pooling" pooling_param {{ pool: {method} {body} }}'
    ntop = 2 if method == "MAX" else 1
    results = []
    for gpu in (False, True):
        layer = make_layer(text, dtype)
        layer.use_blocked_backward = blocked
        bottom, top = blobs([x], dtype), empty_blobs(ntop, dtype)
        layer.setup(bottom, top)
        log: list = []
        if gpu:
            emulate_gpu(monkeypatch, layer, log)
        (layer.forward_gpu if gpu else layer.forward_cpu)(bottom, top)
        dy = np.random.default_rng(1).standard_normal(top[0].shape).astype(dtype)
        if method == "MAX":  # non-finite diffs must reach only their own window's winner
            dy.reshape(-1)[::7], dy.reshape(-1)[3::11] = np.inf, np.nan
        top[0].mutable_cpu_diff()[...] = dy
        bottom[0].mutable_cpu_diff()[...] = 12345.0  # backward assigns every element
        (layer.backward_gpu if gpu else layer.backward_cpu)(top, [True], bottom)
        if gpu:
            assert len(log) == 1 and (log[0] == 1).all(), "every bottom diff element written exactly once"
        results.append([t.cpu_data().copy() for t in top] + [bottom[0].cpu_diff().copy()])
        monkeypatch.undo()
    tol = 1e-6 if dtype == np.float32 else 1e-13
    for cpu, gpu in zip(*results):
        np.testing.assert_allclose(gpu, cpu, rtol=tol, atol=tol)
