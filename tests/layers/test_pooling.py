"""Pooling: Caffe's output sizes and window clipping against a naive loop, gradients, masks, errors,
CPU-vs-GPU agreement."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer

FLT_MAX = float(np.finfo(np.float32).max)


def pool_text(body: str) -> str:
    return f'name: "pool" type: "Pooling" pooling_param {{ {body} }}'


def naive_out(size, k, pad, stride, ceil_mode=True, any_pad=None):
    any_pad = pad > 0 if any_pad is None else any_pad
    out = (math.ceil if ceil_mode else math.floor)((size + 2 * pad - k) / stride) + 1
    if any_pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def naive_pool(x, method, kernel, pad, stride, pooled):
    """Per-window loops with Caffe's clipping; returns (top, mask) (mask only for MAX)."""
    n, c, h, w = x.shape
    top = np.zeros((n, c) + pooled)
    mask = np.full((n, c) + pooled, -1.0)
    for py in range(pooled[0]):
        for px in range(pooled[1]):
            hs, ws = py * stride[0] - pad[0], px * stride[1] - pad[1]
            he, we = min(hs + kernel[0], h + pad[0]), min(ws + kernel[1], w + pad[1])
            area = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            for b in range(n):
                for ch in range(c):
                    if method == "MAX":
                        best, arg = -FLT_MAX, -1
                        for yy in range(hs, he):
                            for xx in range(ws, we):
                                if x[b, ch, yy, xx] > best:
                                    best, arg = x[b, ch, yy, xx], yy * w + xx
                        top[b, ch, py, px], mask[b, ch, py, px] = best, arg
                    else:
                        top[b, ch, py, px] = x[b, ch, hs:he, ws:we].sum() / area
    return top, mask


def naive_backward(x_shape, dy, method, mask, kernel, pad, stride):
    n, c, h, w = x_shape
    dx = np.zeros(x_shape)
    pooled = dy.shape[2:]
    for b in range(n):
        for ch in range(c):
            for py in range(pooled[0]):
                for px in range(pooled[1]):
                    if method == "MAX":
                        m = int(mask[b, ch, py, px])
                        if m >= 0:
                            dx[b, ch, m // w, m % w] += dy[b, ch, py, px]
                        continue
                    hs, ws = py * stride[0] - pad[0], px * stride[1] - pad[1]
                    he, we = min(hs + kernel[0], h + pad[0]), min(ws + kernel[1], w + pad[1])
                    area = (he - hs) * (we - ws)
                    dx[b, ch, max(hs, 0):min(he, h), max(ws, 0):min(we, w)] += dy[b, ch, py, px] / area
    return dx


def distinct_input(shape, seed=0):
    """Values at least 0.01 apart, so MAX has no ties and no kinks within the gradient step."""
    rng = np.random.default_rng(seed)
    return (rng.permutation(int(np.prod(shape))).reshape(shape) - 20) * 0.01


# (input shape, pooling_param body, kernel, pad, stride, expected pooled (PH, PW))
CASES = [
    ((2, 2, 6, 6), "kernel_size: 2 stride: 2", (2, 2), (0, 0), (2, 2), (3, 3)),
    ((2, 2, 6, 6), "kernel_size: 3 stride: 2", (3, 3), (0, 0), (2, 2), (3, 3)),  # ceil: floor gives 2
    ((1, 2, 5, 5), "kernel_size: 3 stride: 2 pad: 1", (3, 3), (1, 1), (2, 2), (3, 3)),
    ((1, 2, 4, 4), "kernel_size: 3 stride: 3 pad: 2", (3, 3), (2, 2), (3, 3), (2, 2)),  # clipped from 3
    ((1, 2, 7, 5), "kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0", (3, 2), (1, 0), (2, 1),
     (4, 4)),
    ((2, 2, 6, 6), "kernel_size: 3 stride: 2 round_mode: FLOOR", (3, 3), (0, 0), (2, 2), (2, 2)),
    ((1, 2, 5, 5), "kernel_size: 2 stride: 2 pad: 1 round_mode: FLOOR", (2, 2), (1, 1), (2, 2), (3, 3)),
    ((2, 3, 4, 5), "global_pooling: true", (4, 5), (0, 0), (1, 1), (1, 1)),
    ((1, 1, 3, 3), "kernel_size: 3 stride: 2", (3, 3), (0, 0), (2, 2), (1, 1)),
    # stride > kernel without pad: the last ceil window starts past the image and holds no input
    ((1, 2, 5, 5), "kernel_size: 1 stride: 3", (1, 1), (0, 0), (3, 3), (3, 3)),
]


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,body,kernel,pad,stride,pooled", CASES)
def test_forward_matches_naive(mode, method, shape, body, kernel, pad, stride, pooled):
    x = distinct_input(shape)
    ntop = 2 if method == "MAX" else 1
    layer = make_layer(pool_text(f"pool: {method} {body}"))
    bottom, top = blobs([x]), empty_blobs(ntop)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape[2:] == pooled
    assert pooled == tuple(naive_out(s, k, p, st, "FLOOR" not in body, any(pad))
                           for s, k, p, st in zip(shape[2:], kernel, pad, stride))
    expected, mask = naive_pool(x, method, kernel, pad, stride, pooled)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12, atol=1e-12)
    if method == "MAX":
        np.testing.assert_array_equal(top[1].data, mask)


def test_ave_divisor_counts_padding_by_hand(mode):
    x = np.ones((1, 1, 3, 3))
    layer = make_layer(pool_text("pool: AVE kernel_size: 3 stride: 1 pad: 1"))
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data[0, 0], np.array([[4, 6, 4], [6, 9, 6], [4, 6, 4]]) / 9)
    # ceil window at the bottom-right: area clipped to H + pad = 5 (2x2), one real pixel
    layer = make_layer(pool_text("pool: AVE kernel_size: 3 stride: 2 pad: 1"))
    bottom, top = blobs([np.ones((1, 1, 4, 4))]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape == (1, 1, 3, 3)
    np.testing.assert_allclose(top[0].data[0, 0, 0, 0], 4 / 9)
    np.testing.assert_allclose(top[0].data[0, 0, 2, 2], 1 / 4)


def test_max_ties_pick_first_and_mask_values(mode):
    x = np.zeros((1, 1, 4, 4))
    x[0, 0, 1, 0] = x[0, 0, 1, 1] = 5.0  # tie inside window (0, 0): row-major first wins
    x[0, 0, 3, 3] = -1.0
    x[0, 0, 2:, 2:] = [[-3, -2], [-4, -1]]
    layer = make_layer(pool_text("pool: MAX kernel_size: 2 stride: 2"))
    bottom, top = blobs([x]), empty_blobs(2)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data[0, 0], [[5, 0], [0, -1]])
    np.testing.assert_array_equal(top[1].data[0, 0], [[4, 2], [8, 15]])


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,body,kernel,pad,stride,pooled", CASES)
def test_backward_matches_naive(mode, method, shape, body, kernel, pad, stride, pooled):
    """MAX: each top diff goes to its mask position; AVE: spread by Caffe's divisor."""
    x = distinct_input(shape, seed=1)
    layer = make_layer(pool_text(f"pool: {method} {body}"))
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    dy = np.random.default_rng(2).standard_normal(top[0].shape)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    _, mask = naive_pool(x, method, kernel, pad, stride, pooled)
    expected = naive_backward(x.shape, dy, method, mask, kernel, pad, stride)
    np.testing.assert_allclose(bottom[0].diff, expected, rtol=1e-12, atol=1e-12)


GRAD_CASES = [
    ((2, 3, 5, 5), "kernel_size: 3 stride: 2"),
    ((2, 3, 5, 5), "kernel_size: 3 stride: 2 pad: 1"),
    ((1, 2, 4, 4), "kernel_size: 3 stride: 3 pad: 2"),
    ((1, 2, 5, 4), "kernel_h: 2 kernel_w: 3 stride_h: 1 stride_w: 2 pad_w: 1 pad_h: 0"),
    ((2, 2, 3, 4), "global_pooling: true"),
]


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,body", GRAD_CASES)
@pytest.mark.slow
def test_gradient(mode, method, shape, body):
    layer = make_layer(pool_text(f"pool: {method} {body}"))
    bottom, top = blobs([distinct_input(shape, seed=3)]), empty_blobs(1)
    checked = GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)
    assert checked == bottom[0].count


def test_float32_forward_smoke():
    x = distinct_input((2, 3, 7, 7)).astype(np.float32)
    for method in ("MAX", "AVE"):
        layer = make_layer(pool_text(f"pool: {method} kernel_size: 3 stride: 2 pad: 1"), np.float32)
        bottom, top = blobs([x], np.float32), empty_blobs(1, np.float32)
        layer.setup(bottom, top)
        layer.forward(bottom, top)
        assert top[0].data.dtype == np.float32 and top[0].shape == (2, 3, 4, 4)
        expected, _ = naive_pool(x.astype(np.float64), method, (3, 3), (1, 1), (2, 2), (4, 4))
        np.testing.assert_allclose(top[0].data, expected, rtol=1e-6, atol=1e-6)


def test_reshape_follows_input_size(mode):
    layer = make_layer(pool_text("pool: AVE global_pooling: true"))
    bottom, top = blobs([np.ones((1, 2, 3, 3))]), empty_blobs(1)
    layer.setup(bottom, top)
    x = np.arange(2 * 2 * 5 * 4, dtype=float).reshape(2, 2, 5, 4)
    bottom = blobs([x])
    layer.forward(bottom, top)
    assert top[0].shape == (2, 2, 1, 1)
    np.testing.assert_allclose(top[0].data[..., 0, 0], x.mean(axis=(2, 3)))


@pytest.mark.parametrize(
    "body,ntop,shape,match",
    [
        ("pool: MAX kernel_size: 2 pad: 2", 1, (1, 1, 5, 5), "pad 2x2 must be smaller than the kernel 2x2"),
        ("pool: AVE kernel_h: 3 kernel_w: 2 pad_h: 1 pad_w: 2", 1, (1, 1, 5, 5), "must be smaller than the kernel"),
        ("pool: MAX global_pooling: true kernel_size: 2", 1, (1, 1, 5, 5), "global_pooling takes the kernel"),
        ("pool: MAX global_pooling: true stride: 2", 1, (1, 1, 5, 5), "global_pooling requires pad 0 and stride 1"),
        ("pool: STOCHASTIC kernel_size: 2 pad: 1", 1, (1, 1, 5, 5), "STOCHASTIC pooling takes no padding"),
        ("pool: AVE kernel_size: 2", 2, (1, 1, 5, 5), "only MAX pooling has a second"),
        ("pool: MAX stride: 2", 1, (1, 1, 5, 5), "give kernel_size, or kernel_h and kernel_w"),
        ("pool: MAX kernel_size: 2 kernel_h: 2 kernel_w: 2", 1, (1, 1, 5, 5), "not both"),
        ("pool: MAX kernel_h: 2", 1, (1, 1, 5, 5), "kernel_h and kernel_w must be given together"),
        ("pool: MAX kernel_size: 2 stride: 0", 1, (1, 1, 5, 5), "stride must be positive"),
        ("pool: MAX kernel_size: 2", 1, (1, 5), "at least one spatial axis"),
        ("pool: MAX kernel_size: 7", 1, (1, 1, 5, 5), "output would be empty"),
    ],
)
def test_errors(body, ntop, shape, match):
    layer = make_layer(pool_text(body))
    with pytest.raises(NetError, match=match) as info:
        layer.setup(blobs([np.zeros(shape)]), empty_blobs(ntop))
    assert "layer 'pool'" in str(info.value)


# -- GPU agreement ----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,body", [(c[0], c[1]) for c in CASES] + [
    ((3, 4, 13, 11), "kernel_size: 3 stride: 2"),
    ((2, 3, 37, 70), "kernel_size: 3 stride: 2 pad: 1"),  # 6 planes: the backward's last plane group is partial
    ((1, 66001, 2, 3), "kernel_size: 2 stride: 1"),  # many planes, the last group holds one
])
def test_cpu_gpu_agree(method, shape, body, dtype):
    x = np.random.default_rng(8).standard_normal(shape)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert_cpu_gpu_agree(pool_text(f"pool: {method} {body}"), [x], ntop=2 if method == "MAX" else 1,
                         rtol=tol, atol=tol, dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,body", [
    ((2, 3, 14, 14), "kernel_size: 2 stride: 2"),
    ((2, 3, 13, 15), "kernel_size: 2 stride: 2 pad: 1"),
    ((2, 3, 15, 13), "kernel_size: 3 stride: 2"),
    ((2, 3, 16, 17), "kernel_size: 3 stride: 2 pad: 1"),
    ((2, 3, 9, 9), "kernel_size: 3 stride: 2 pad: 2"),
    ((2, 3, 12, 11), "kernel_size: 3 stride: 2 round_mode: FLOOR"),
    ((2, 3, 11, 12), "kernel_size: 3 stride: 1 pad: 1"),
    ((2, 3, 10, 10), "kernel_size: 2 stride: 1"),
    ((1, 2, 7, 9), "kernel_h: 1 kernel_w: 3 stride: 2 pad_h: 0 pad_w: 1"),
    # widths of multiples of 4: AVE takes the 4-wide kernels (ave_pool_backward_q_*)
    ((2, 3, 16, 16), "kernel_size: 3 stride: 2 pad: 1"),
    ((2, 3, 15, 12), "kernel_size: 3 stride: 2"),
    ((2, 3, 9, 20), "kernel_size: 3 stride: 2 pad: 2"),
    ((2, 3, 14, 16), "kernel_size: 2 stride: 2"),
    ((2, 3, 13, 8), "kernel_size: 2 stride: 2 pad: 1"),
    ((2, 3, 11, 8), "kernel_size: 3 stride: 1 pad: 1"),
    ((2, 8, 112, 112), "kernel_size: 3 stride: 2 pad: 1"),  # ResNet's pool1 geometry
])
def test_blocked_backward_equals_gather(gpu_mode, method, shape, body):
    """The blocked backward kernels give the generic gather's diffs bit for bit (and are used)."""
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    x[:, :, ::3, ::2] = x[:, :, 1::3, 1::2].max()  # ties between windows' candidates
    text = pool_text(f"pool: {method} {body}")
    got = []
    for blocked in (True, False):
        layer = make_layer(text, np.float32)
        layer.use_blocked_backward = blocked
        bottom, top = blobs([x], np.float32), empty_blobs(1, np.float32)
        layer.setup(bottom, top)
        assert layer._blocked_backward() is not None
        layer.forward(bottom, top)
        top[0].mutable_cpu_diff()[...] = np.random.default_rng(4).standard_normal(top[0].shape)
        bottom[0].mutable_cpu_diff()[...] = np.nan  # every pixel must be written
        layer.backward(top, [True], bottom)
        got.append(bottom[0].cpu_diff().copy())
    assert np.isfinite(got[0]).all()
    np.testing.assert_array_equal(got[0], got[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,body", [
    ((2, 3, 16, 16), "kernel_size: 3 stride: 2 pad: 1"),
    ((2, 3, 14, 16), "kernel_size: 2 stride: 2"),
    ((2, 3, 11, 8), "kernel_size: 3 stride: 1 pad: 1"),
    ((32, 4, 112, 112), "kernel_size: 3 stride: 2 pad: 1"),
])
def test_ave_quad_backward_equals_blocked(gpu_mode, monkeypatch, dtype, shape, body):
    """AVE's 4-wide blocked backward (taken for these shapes) gives the 2-wide blocked kernel's bits."""
    from pycaffe_lite.gpu import backend

    x = np.random.default_rng(6).standard_normal(shape).astype(dtype)
    names: list[str] = []
    kernel = backend.kernel
    monkeypatch.setattr(backend, "kernel", lambda path, name, dt: names.append(name) or kernel(path, name, dt))
    got = []
    for quad in (True, False):
        layer = make_layer(pool_text(f"pool: AVE {body}"), dtype)
        layer.use_quad_backward = quad
        bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
        layer.setup(bottom, top)
        layer.forward(bottom, top)
        top[0].mutable_cpu_diff()[...] = np.random.default_rng(4).standard_normal(top[0].shape)
        bottom[0].mutable_cpu_diff()[...] = np.nan
        names.clear()
        layer.backward(top, [True], bottom)
        assert any(n.startswith("ave_pool_backward_q_" if quad else "ave_pool_backward_s") for n in names), names
        got.append(bottom[0].cpu_diff().copy())
    assert np.isfinite(got[0]).all()
    np.testing.assert_array_equal(got[0], got[1])
