"""SPP: output against a naive loop over pyramid bins, shapes, reshape, gradients, CPU-vs-GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def spp_text(height: int, pool: str = "MAX") -> str:
    return f'name: "spp" type: "SPP" spp_param {{ pyramid_height: {height} pool: {pool} }}'


def _bins(size: int, level: int) -> list[tuple[int, int, int]]:
    """(start, end, divisor extent) of every bin along one axis, from Caffe's pooling rules."""
    n = 2 ** level
    k = math.ceil(size / n)
    pad = (k * n - size + 1) // 2
    count = math.ceil((size + 2 * pad - k) / k) + 1
    if pad and (count - 1) * k >= size + pad:
        count -= 1
    out = []
    for b in range(count):
        start = b * k - pad
        end = min(start + k, size + pad)
        out.append((max(start, 0), min(end, size), end - start))
    return out


def naive_spp(x, height, pool):
    n, c, h, w = x.shape
    levels = []
    for level in range(height):
        bh, bw = _bins(h, level), _bins(w, level)
        out = np.zeros((n, c, len(bh), len(bw)))
        for i, (h0, h1, dh) in enumerate(bh):
            for j, (w0, w1, dw) in enumerate(bw):
                window = x[:, :, h0:h1, w0:w1]
                if pool == "MAX":
                    out[:, :, i, j] = window.max(axis=(2, 3))
                else:
                    out[:, :, i, j] = window.sum(axis=(2, 3)) / (dh * dw)
        levels.append(out)
    if height == 1:
        return levels[0]
    return np.concatenate([lv.reshape(n, -1) for lv in levels], axis=1)


def _run(shape, height, pool, seed=0, dtype=np.float64):
    x = np.random.default_rng(seed).standard_normal(shape)
    layer = make_layer(spp_text(height, pool), dtype)
    bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


CASES = [((2, 3, 13, 13), 3), ((2, 2, 8, 8), 3), ((1, 2, 7, 10), 2), ((2, 3, 6, 5), 1), ((1, 1, 9, 6), 2)]


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,height", CASES)
def test_forward_matches_naive(mode, shape, height, pool):
    _, bottom, top = _run(shape, height, pool)
    expected = naive_spp(bottom[0].data, height, pool)
    assert top[0].shape == expected.shape
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12, atol=1e-12)


def test_standard_pyramid_sizes():
    _, _, top = _run((2, 3, 13, 13), 3, "MAX")
    assert top[0].shape == (2, 3 * (1 + 4 + 16))
    _, _, top = _run((2, 3, 6, 5), 1, "AVE")
    assert top[0].shape == (2, 3, 1, 1)  # one level: the pooling output itself


def test_level_one_is_global_pooling():
    _, bottom, top = _run((2, 3, 5, 7), 2, "AVE")
    np.testing.assert_allclose(top[0].data[:, :3], bottom[0].data.mean(axis=(2, 3)), rtol=1e-12)


def test_reshape_rebuilds_pooling(mode):
    layer, bottom, top = _run((2, 2, 8, 8), 3, "MAX")
    x = np.random.default_rng(3).standard_normal((3, 2, 11, 9))
    bottom2 = blobs([x])
    layer.forward(bottom2, top)
    assert top[0].shape == naive_spp(x, 3, "MAX").shape
    np.testing.assert_allclose(top[0].data, naive_spp(x, 3, "MAX"), rtol=1e-12)


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,height", [((1, 2, 6, 6), 3), ((1, 2, 4, 6), 2), ((2, 1, 3, 4), 1)])
@pytest.mark.slow
def test_gradient(mode, shape, height, pool):
    x = np.random.default_rng(5).standard_normal(shape)
    layer = make_layer(spp_text(height, pool))
    GradientChecker(1e-4, 1e-4).check(layer, blobs([x]), empty_blobs(1))


def test_backward_sums_levels():
    layer, bottom, top = _run((1, 1, 4, 4), 2, "AVE")
    top[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    # level 0: 1/16 everywhere; level 1: 2x2 bins of 4 pixels, 1/4 each
    np.testing.assert_allclose(bottom[0].diff, np.full((1, 1, 4, 4), 1 / 16 + 1 / 4))


@pytest.mark.parametrize(
    "text,shape,match",
    [
        (spp_text(0), (1, 1, 4, 4), "pyramid_height must be 1 to 32, got 0"),
        (spp_text(4294967295), (1, 1, 4, 4), "pyramid_height must be 1 to 32, got 4294967295"),
        (spp_text(2, "STOCHASTIC"), (1, 1, 4, 4), "only MAX and AVE"),
        (spp_text(2), (1, 4, 4), "must have 4 axes"),
        (spp_text(3), (1, 1, 1, 4), "pyramid_height 3 pools the top level into 4 bins per side, more than the 1x4"),
        (spp_text(3), (1, 1, 5, 5), "pad 2x2 must be smaller than the kernel 2x2"),  # 4 bins of 5: BVLC refuses too
    ],
)
def test_errors(text, shape, match):
    layer = make_layer(text)
    with pytest.raises(NetError, match=match):
        layer.setup(blobs([np.zeros(shape)]), empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pool", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,height", CASES[:4])
def test_cpu_gpu_agree(dtype, pool, shape, height):
    x = np.random.default_rng(6).standard_normal(shape)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert_cpu_gpu_agree(spp_text(height, pool), [x], rtol=tol, atol=tol, dtype=dtype)
