"""Upsample: SegNet max-unpooling with a Pooling mask (sizes, scatter, gather backward), the
one-bottom nearest-neighbour form of YOLOv3 ports, gradients, CPU/GPU agreement, errors."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import (
    assert_cpu_gpu_agree,
    blobs,
    empty_blobs,
    make_layer,
    run_layer,
    unpool_reference,
)

RNG = np.random.default_rng(10)


def pool_with_mask(x, kernel=2, stride=2):
    layer = make_layer(f'type: "Pooling" pooling_param {{ pool: MAX kernel_size: {kernel} stride: {stride} }}')
    bottom, top = blobs([x]), empty_blobs(2)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return top[0].cpu_data().copy(), top[1].cpu_data().copy()


@pytest.mark.parametrize("hw,param,out", [
    ((8, 6), "scale: 2", (8, 6)),
    ((7, 5), "upsample_h: 7 upsample_w: 5", (7, 5)),
    ((7, 5), "scale: 2 pad_out_h: true pad_out_w: true", (7, 5)),
    ((8, 6), "scale_h: 2 scale_w: 2", (8, 6)),
])
def test_unpool_after_pooling(mode, hw, param, out):
    x = RNG.standard_normal((2, 3) + hw)
    pooled, mask = pool_with_mask(x)
    layer, bottom, top = run_layer(f'type: "Upsample" upsample_param {{ {param} }}', [pooled, mask],
                                   propagate=[True, False])
    y = top[0].cpu_data()
    assert y.shape == (2, 3) + out
    expected = np.zeros((2, 3) + out)
    for n, c, i, j in np.ndindex(pooled.shape):
        k = int(mask[n, c, i, j])
        expected[n, c, k // out[1], k % out[1]] = pooled[n, c, i, j]
    np.testing.assert_array_equal(y, expected)
    # Maxima return to where the pooling found them.
    nz = expected != 0
    np.testing.assert_array_equal(y[nz], x[nz])
    dy = top[0].cpu_diff()
    dx = np.array([dy[n, c].ravel()[int(mask[n, c, i, j])] for n, c, i, j in np.ndindex(pooled.shape)])
    np.testing.assert_array_equal(bottom[0].cpu_diff().ravel(), dx)


@pytest.mark.parametrize("param,s", [("scale: 2", (2, 2)), ("scale: 3", (3, 3)), ("scale_h: 2 scale_w: 3", (2, 3)),
                                     ("", (1, 1))])
def test_nearest(mode, param, s):
    x = RNG.standard_normal((2, 3, 4, 5))
    layer, bottom, top = run_layer(f'type: "Upsample" upsample_param {{ {param} }}', [x])
    y = top[0].cpu_data()
    assert y.shape == (2, 3, 4 * s[0], 5 * s[1])
    for h in range(y.shape[2]):
        for w in range(y.shape[3]):
            np.testing.assert_array_equal(y[:, :, h, w], x[:, :, h // s[0], w // s[1]])
    dy = top[0].cpu_diff()
    dx = np.zeros_like(x)
    for h in range(y.shape[2]):
        for w in range(y.shape[3]):
            dx[:, :, h // s[0], w // s[1]] += dy[:, :, h, w]
    np.testing.assert_allclose(bottom[0].cpu_diff(), dx, rtol=1e-12, atol=1e-14)


def test_errors():
    x = RNG.standard_normal((1, 1, 2, 2))
    with pytest.raises(caffe.NetError, match="outside the 4 x 4 output"):
        run_layer('type: "Upsample" upsample_param { scale: 2 }', [x, np.full(x.shape, 16.0)],
                  propagate=[True, False])
    with pytest.raises(caffe.NetError, match="shape of bottom 0"):
        run_layer('type: "Upsample"', [x, np.zeros((1, 1, 2, 3))])
    with pytest.raises(caffe.NetError, match="scale of 2"):
        run_layer('type: "Upsample" upsample_param { scale: 3 pad_out_h: true }', [x, np.zeros(x.shape)])
    with pytest.raises(caffe.NetError, match="both scale_h and scale_w"):
        run_layer('type: "Upsample" upsample_param { scale_h: 2 }', [x])


def test_gradient(mode):
    x = RNG.standard_normal((1, 2, 4, 4))
    pooled, mask = pool_with_mask(x)
    layer = make_layer('type: "Upsample" upsample_param { scale: 2 }')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([pooled, mask]), empty_blobs(1), check_bottom=[0])
    layer = make_layer('type: "Upsample" upsample_param { scale: 2 }')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([pooled]), empty_blobs(1))


@pytest.mark.gpu
def test_cpu_gpu_agree():
    x = RNG.standard_normal((2, 3, 9, 7))
    pooled, mask = pool_with_mask(x)
    assert_cpu_gpu_agree('type: "Upsample" upsample_param { upsample_h: 9 upsample_w: 7 }', [pooled, mask],
                         propagate=[True, False])
    assert_cpu_gpu_agree('type: "Upsample" upsample_param { scale: 2 }', [x])
    assert_cpu_gpu_agree('type: "Upsample" upsample_param { scale_h: 3 scale_w: 2 }', [x], dtype=np.float32,
                         rtol=1e-6, atol=1e-6)


# The GPU's fast path writes each window from its owner; indices outside their source's window
# (3x3/2 pooling masks, random ones), several sources on one cell and indices outside the plane
# (skipped on the GPU, an error on the CPU) go through its second pass.
@pytest.mark.gpu
@pytest.mark.parametrize("param,hw,out", [
    ("scale: 2", (4, 6), (8, 12)),
    ("scale: 2", (3, 5), (6, 10)),  # odd width: the general first pass
    ("scale: 2 pad_out_h: true pad_out_w: true", (4, 3), (7, 5)),
    ("upsample_h: 11 upsample_w: 13", (4, 3), (11, 13)),
    ("upsample_h: 3 upsample_w: 5", (4, 5), (3, 5)),
    ("scale_h: 3 scale_w: 2", (3, 5), (9, 10)),
])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_unpool_any_mask(gpu_mode, param, hw, out, dtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3) + hw)
    t = out[0] * out[1]
    masks = [rng.integers(-2, t + 2, x.shape).astype(float),  # strays, duplicates, out of range
             np.full(x.shape, float(t // 2)),  # every source on one cell
             rng.integers(0, t, x.shape) + 0.5]  # truncated
    for mask in masks:
        layer, bottom, top = run_layer(f'type: "Upsample" upsample_param {{ {param} }}', [x, mask],
                                       propagate=[True, False], dtype=dtype)
        m = mask.astype(np.int64)
        np.testing.assert_array_equal(top[0].cpu_data(), unpool_reference(x.astype(dtype), m, *out))
        dy = top[0].cpu_diff().reshape(6, -1)
        mm = m.reshape(6, -1)
        dx = np.where((mm >= 0) & (mm < t), dy[np.arange(6)[:, None], np.clip(mm, 0, t - 1)], 0)
        np.testing.assert_array_equal(bottom[0].cpu_diff(), dx.reshape(x.shape))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,stride,hw", [(2, 2, (9, 7)), (3, 2, (9, 7)), (2, 2, (8, 10))])
def test_cpu_gpu_agree_pooling_masks(kernel, stride, hw):
    """Masks of real MAX pooling: 2x2/2 (all in their windows, ceil-mode edges) and 3x3/2 (overlapping
    windows: indices outside the 2x2 window of their source)."""
    x = RNG.standard_normal((2, 3) + hw)
    pooled, mask = pool_with_mask(x, kernel, stride)
    text = f'type: "Upsample" upsample_param {{ upsample_h: {hw[0]} upsample_w: {hw[1]} }}'
    assert_cpu_gpu_agree(text, [pooled, mask], propagate=[True, False])
    assert_cpu_gpu_agree(text, [pooled, mask], propagate=[True, False], dtype=np.float32, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [2, 3])
def test_cpu_gpu_agree_large_planes(gpu_mode, kernel):
    """SegNet-like sizes: the 4-cell vector stores (Wo % 4 == 0), and with 3x3/2 masks (strays) the
    claim/write fallback over more sources than its capped grid holds; the flag resets after."""
    x = RNG.standard_normal((4, 32, 92, 120)).astype(np.float32)
    pooled, mask = pool_with_mask(x, kernel, 2)
    ho, wo = x.shape[2:]
    text = f'type: "Upsample" upsample_param {{ upsample_h: {ho} upsample_w: {wo} }}'
    assert_cpu_gpu_agree(text, [pooled, mask], propagate=[True, False], dtype=np.float32, rtol=0, atol=0)
    layer, _, top = run_layer(text, [pooled, mask], propagate=[True, False], dtype=np.float32)
    assert layer.stray.cpu_data().view(np.int32).tolist() == [0, 0]
    np.testing.assert_array_equal(top[0].cpu_data(), unpool_reference(pooled, mask.astype(np.int64), ho, wo))
