"""LRN: ACROSS_CHANNELS and WITHIN_CHANNEL against naive loops (forward and the backward
formula), gradient checks, errors, CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def f32(v):
    return float(np.float32(v))  # alpha, beta, k are float fields


def naive_across(x, size, alpha, beta, k):
    N, C, H, W = x.shape
    pre = (size - 1) // 2
    y = np.empty_like(x)
    for n in range(N):
        for c in range(C):
            for h in range(H):
                for w in range(W):
                    lo, hi = max(0, c - pre), min(C, c + pre + 1)
                    s = k + alpha / size * sum(x[n, j, h, w] ** 2 for j in range(lo, hi))
                    y[n, c, h, w] = x[n, c, h, w] * s**-beta
    return y


def naive_within(x, size, alpha, beta):
    """Caffe's composition: AVE pool of x² (pad (size-1)/2, stride 1, divisor size²), then
    (1 + alpha·avg)^-beta, times x."""
    N, C, H, W = x.shape
    pre = (size - 1) // 2
    y = np.empty_like(x)
    for n in range(N):
        for c in range(C):
            for h in range(H):
                for w in range(W):
                    acc = 0.0
                    for hh in range(h - pre, h + pre + 1):
                        for ww in range(w - pre, w + pre + 1):
                            if 0 <= hh < H and 0 <= ww < W:
                                acc += x[n, c, hh, ww] ** 2
                    y[n, c, h, w] = x[n, c, h, w] * (1 + alpha * acc / (size * size)) ** -beta
    return y


def text(region="ACROSS_CHANNELS", size=5, alpha=1.0, beta=0.75, k=1.0):
    return (
        f"type: 'LRN' lrn_param {{ norm_region: {region} local_size: {size} alpha: {alpha} beta: {beta} k: {k} }}"
    )


def run(t, x, dtype=np.float64, dy=None):
    layer = make_layer(t, dtype)
    bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    if dy is not None:
        top[0].diff[...] = dy
        layer.backward(top, [True], bottom)
    return layer, bottom, top


@pytest.mark.parametrize(
    "size,alpha,beta,k,shape",
    [(5, 1.0, 0.75, 1.0, (2, 7, 3, 3)), (3, 0.5, 0.6, 2.0, (1, 4, 2, 5)), (1, 2.0, 1.0, 1.5, (2, 3, 2, 2)),
     (7, 1e-4, 0.75, 2.0, (1, 3, 2, 2))],
)
def test_across_channels_forward(mode, size, alpha, beta, k, shape):
    x = np.random.default_rng(0).standard_normal(shape) * 2
    _, _, top = run(text("ACROSS_CHANNELS", size, alpha, beta, k), x)
    np.testing.assert_allclose(top[0].data, naive_across(x, size, f32(alpha), f32(beta), f32(k)), rtol=1e-12)


@pytest.mark.parametrize("size,alpha,beta,shape", [(3, 1.0, 0.75, (2, 2, 5, 4)), (5, 2.0, 0.5, (1, 3, 3, 6)),
                                                   (1, 1.0, 1.0, (1, 1, 2, 3))])
def test_within_channel_forward(mode, size, alpha, beta, shape):
    x = np.random.default_rng(1).standard_normal(shape) * 2
    # k is ignored WITHIN_CHANNEL (Caffe's power layer uses shift 1)
    _, _, top = run(text("WITHIN_CHANNEL", size, alpha, beta, k=7.0), x)
    np.testing.assert_allclose(top[0].data, naive_within(x, size, f32(alpha), f32(beta)), rtol=1e-12)


def test_hand_checked_single_pixel():
    # one pixel, 3 channels, size 3: scale_c = 1 + (2/3)·(neighbouring squares), beta 1
    x = np.array([1.0, 2.0, 3.0]).reshape(1, 3, 1, 1)
    _, _, top = run(text(size=3, alpha=2.0, beta=1.0), x)
    scales = 1 + 2 / 3 * np.array([1 + 4, 1 + 4 + 9, 4 + 9])
    np.testing.assert_allclose(top[0].data.ravel(), [1 / scales[0], 2 / scales[1], 3 / scales[2]], rtol=1e-14)


def numeric_backward(fn, x, dy, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = ((fn(xp) - fn(xm)) * dy).sum() / (2 * eps)
    return g


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_backward_matches_naive_numeric(mode, region):
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((1, 4, 3, 3)), rng.standard_normal((1, 4, 3, 3))
    _, bottom, _ = run(text(region, 3, 1.5, 0.75, 2.0), x, dy=dy)
    if region == "ACROSS_CHANNELS":
        fn = lambda v: naive_across(v, 3, 1.5, 0.75, 2.0)  # noqa: E731
    else:
        fn = lambda v: naive_within(v, 3, 1.5, 0.75)  # noqa: E731
    np.testing.assert_allclose(bottom[0].diff, numeric_backward(fn, x, dy), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    "t,shape",
    [(text(size=3, alpha=1.0, beta=0.75, k=2.0), (2, 5, 2, 2)), (text(size=5, alpha=3.0, beta=0.6), (1, 4, 2, 3)),
     (text("WITHIN_CHANNEL", 3, 1.0, 0.75), (1, 2, 3, 4)), (text("WITHIN_CHANNEL", 5, 2.0, 1.2), (2, 1, 3, 3))],
)
def test_gradient(mode, t, shape):
    x = np.random.default_rng(3).standard_normal(shape)
    GradientChecker(1e-3, 1e-4).check(make_layer(t), blobs([x]), empty_blobs(1))


def test_even_size_and_wrong_axes_are_clear():
    with pytest.raises(NetError, match="odd values for local_size"):
        make_layer(text(size=4)).setup(blobs([np.zeros((1, 4, 2, 2))]), empty_blobs(1))
    with pytest.raises(ShapeError, match="4 axes"):
        make_layer(text(size=3)).setup(blobs([np.zeros((2, 4, 3))]), empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "t", [text(), text(size=3, alpha=1e-4, beta=0.75, k=2.0), text("WITHIN_CHANNEL", 3, 1.0, 0.75),
          text("WITHIN_CHANNEL", 5, 5e-2, 0.75)],
)
def test_cpu_gpu_agree(dtype, t):
    x = np.random.default_rng(4).standard_normal((2, 7, 5, 6)) * 3
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert_cpu_gpu_agree(t, [x], rtol=tol, atol=tol, dtype=dtype)
