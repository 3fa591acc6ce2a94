"""MAX pooling CPU path: Caffe's per-window loop semantics on hard inputs (ties, NaN, -inf,
-FLT_MAX, signed zeros, non-finite top diffs) for tiling, ceil/floor remainders, padding, gaps and
overlapping windows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

FLT_MAX = float(np.finfo(np.float32).max)


def caffe_max_pool(x, kernel, pad, stride, pooled):
    """Caffe's CPU loop: -FLT_MAX start, strictly-greater update, windows clipped to the image."""
    n, c, h, w = x.shape
    top = np.full((n, c) + pooled, -FLT_MAX, dtype=x.dtype)
    mask = np.full((n, c) + pooled, -1, dtype=np.int64)
    for py in range(pooled[0]):
        for px in range(pooled[1]):
            hs, ws = py * stride[0] - pad[0], px * stride[1] - pad[1]
            he, we = min(hs + kernel[0], h), min(ws + kernel[1], w)
            hs, ws = max(hs, 0), max(ws, 0)
            for b in range(n):
                for ch in range(c):
                    for yy in range(hs, he):
                        for xx in range(ws, we):
                            if x[b, ch, yy, xx] > top[b, ch, py, px]:
                                top[b, ch, py, px], mask[b, ch, py, px] = x[b, ch, yy, xx], yy * w + xx
    return top, mask


def caffe_max_backward(x_shape, dy, mask):
    n, c, h, w = x_shape
    dx = np.zeros(x_shape, dtype=dy.dtype)
    for idx in np.ndindex(dy.shape):
        if mask[idx] >= 0:
            dx[idx[0], idx[1], mask[idx] // w, mask[idx] % w] += dy[idx]
    return dx


def out_size(size, k, pad, stride, ceil_mode):
    out = (math.ceil if ceil_mode else math.floor)((size + 2 * pad - k) / stride) + 1
    if pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


# (input shape, pooling_param body, kernel, pad, stride, ceil mode)
CASES = [
    ((2, 3, 8, 8), "kernel_size: 2 stride: 2", (2, 2), (0, 0), (2, 2), True),  # exact tiling
    ((2, 3, 7, 9), "kernel_size: 2 stride: 2", (2, 2), (0, 0), (2, 2), True),  # ceil remainder windows
    ((2, 3, 7, 9), "kernel_size: 2 stride: 2 round_mode: FLOOR", (2, 2), (0, 0), (2, 2), False),  # gaps
    ((2, 2, 9, 9), "kernel_size: 3 stride: 3", (3, 3), (0, 0), (3, 3), True),
    ((2, 2, 9, 8), "kernel_h: 3 kernel_w: 2 stride_h: 3 stride_w: 2", (3, 2), (0, 0), (3, 2), True),
    ((2, 2, 9, 9), "kernel_size: 3 stride: 2", (3, 3), (0, 0), (2, 2), True),  # overlapping
    ((2, 2, 6, 7), "kernel_size: 3 stride: 1 pad: 1", (3, 3), (1, 1), (1, 1), True),  # heavy overlap
    ((2, 2, 6, 6), "kernel_size: 2 stride: 2 pad: 1", (2, 2), (1, 1), (2, 2), True),
    ((1, 2, 8, 8), "kernel_size: 2 stride: 3", (2, 2), (0, 0), (3, 3), True),  # stride > kernel
    ((2, 3, 4, 5), "global_pooling: true", (4, 5), (0, 0), (1, 1), True),
]


def hard_input(shape, dtype, seed):
    """Few distinct values (many ties) plus NaN, -inf, -FLT_MAX and zeros of both signs."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, size=shape).astype(dtype)
    special = np.array([np.nan, -np.inf, -FLT_MAX, 0.0, -0.0, np.inf], dtype=dtype)
    pick = rng.random(shape) < 0.2
    x[pick] = rng.choice(special, size=int(pick.sum()))
    x[0, 0] = np.nan  # a whole plane of NaN: every window keeps -FLT_MAX and mask -1
    x[-1, -1] = -np.inf
    if x.shape[2] > 2:
        x[0, -1, :2, :2] = -0.0  # a -0.0 window, then a tie with +0.0 after it
        x[0, -1, 1, 1] = 0.0
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,body,kernel,pad,stride,ceil_mode", CASES)
def test_max_pool_matches_caffe_loop(dtype, shape, body, kernel, pad, stride, ceil_mode):
    x = hard_input(shape, dtype, seed=len(body))
    if "global" in body:
        kernel = shape[2:]
    pooled = tuple(out_size(s, k, p, st, ceil_mode) for s, k, p, st in zip(shape[2:], kernel, pad, stride))
    layer = make_layer(f'type: "Pooling" pooling_param {{ pool: MAX {body} }}', dtype)
    bottom, top = blobs([x], dtype), empty_blobs(2, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    want_top, want_mask = caffe_max_pool(x, kernel, pad, stride, pooled)
    got_top = top[0].data
    assert got_top.shape == want_top.shape
    np.testing.assert_array_equal(got_top, want_top)
    np.testing.assert_array_equal(np.signbit(got_top), np.signbit(want_top))
    np.testing.assert_array_equal(top[1].data, want_mask)
    # top diffs with NaN/inf: each must reach only its own window's winner
    rng = np.random.default_rng(1)
    dy = rng.standard_normal(want_top.shape).astype(dtype)
    dy.reshape(-1)[::7] = np.inf
    dy.reshape(-1)[3::11] = np.nan
    dy.reshape(-1)[5::13] = -0.0
    top[0].diff[...] = dy
    bottom[0].diff[...] = 12345.0  # backward assigns the bottom diff
    layer.backward(top, [True], bottom)
    want_dx = caffe_max_backward(x.shape, dy, want_mask)
    np.testing.assert_allclose(bottom[0].diff, want_dx, rtol=1e-6, atol=0)
    numbers = ~np.isnan(want_dx)
    np.testing.assert_array_equal(np.signbit(bottom[0].diff)[numbers], np.signbit(want_dx)[numbers])


def test_backward_after_reshape_needs_forward():
    layer = make_layer('type: "Pooling" pooling_param { pool: MAX kernel_size: 2 stride: 2 }', np.float32)
    bottom, top = blobs([np.zeros((1, 1, 4, 4))], np.float32), empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    bottom[0].reshape(1, 1, 6, 6)
    layer.reshape(bottom, top)
    with pytest.raises(Exception, match="forward_cpu"):
        layer.backward(top, [True], bottom)
