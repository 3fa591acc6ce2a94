"""ROIPooling: forward max and argmax against a naive reference (the fork's rounding and bins),
backward routing, gradient, CPU/GPU agreement, errors."""

import math

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(9)
X = RNG.permutation(2 * 3 * 12 * 10).reshape(2, 3, 12, 10) + 1.0  # distinct, nonzero (0 marks empty bins)
ROIS = np.array([
    [0, 0, 0, 9, 11],      # the whole map
    [1, 2, 3, 7, 8],
    [0, 4.5, 2.5, 5.5, 3.5],  # halves round away from zero
    [1, 8, 8, 4, 4],       # inverted: one-pixel region
    [0, -6, -6, 30, 3],    # partly outside: clipped
    [1, 20, 20, 30, 30],   # fully outside: empty bins
    [0, 0, 0, 19, 23],     # with spatial_scale 0.5 the whole map
])


def c_round(v):
    return math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5)


def naive(x, rois, ph, pw, scale):
    out = np.zeros((len(rois), x.shape[1], ph, pw))
    H, W = x.shape[2:]
    for r, (b, x1, y1, x2, y2) in enumerate(rois):
        x1, y1, x2, y2 = (c_round(v * scale) for v in (x1, y1, x2, y2))
        rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        for i in range(ph):
            for j in range(pw):
                hs = min(max(math.floor(i * rh / ph) + y1, 0), H)
                he = min(max(math.ceil((i + 1) * rh / ph) + y1, 0), H)
                ws = min(max(math.floor(j * rw / pw) + x1, 0), W)
                we = min(max(math.ceil((j + 1) * rw / pw) + x1, 0), W)
                if he > hs and we > ws:
                    out[r, :, i, j] = x[int(b), :, hs:he, ws:we].max(axis=(1, 2))
    return out


@pytest.mark.parametrize("ph,pw,scale", [(2, 2, 1.0), (3, 4, 1.0), (7, 7, 1.0), (2, 3, 0.5)])
def test_forward_backward(mode, ph, pw, scale):
    text = f'type: "ROIPooling" roi_pooling_param {{ pooled_h: {ph} pooled_w: {pw} spatial_scale: {scale} }}'
    layer, bottom, top = run_layer(text, [X, ROIS], propagate=[True, False])
    np.testing.assert_array_equal(top[0].cpu_data(), naive(X, ROIS, ph, pw, scale))
    # Backward: every top gradient lands on the input holding that maximum (values are distinct).
    dy, expected = top[0].cpu_diff(), np.zeros_like(X)
    y = top[0].cpu_data()
    for r, c, i, j in np.ndindex(y.shape):
        b = int(ROIS[r, 0])
        hit = np.argwhere(X[b, c] == y[r, c, i, j])
        if len(hit):
            expected[b, c, hit[0][0], hit[0][1]] += dy[r, c, i, j]
    np.testing.assert_allclose(bottom[0].cpu_diff(), expected, rtol=1e-12)


def test_ties_take_the_first():
    x = np.ones((1, 1, 2, 2))
    layer, bottom, top = run_layer('type: "ROIPooling" roi_pooling_param { pooled_h: 1 pooled_w: 1 }',
                                   [x, np.array([[0, 0, 0, 1, 1]])], propagate=[True, False])
    np.testing.assert_array_equal(layer.argmax.cpu_data(), [[[[0]]]])
    np.testing.assert_array_equal(bottom[0].cpu_diff()[0, 0], [[top[0].cpu_diff()[0, 0, 0, 0], 0], [0, 0]])


def test_errors():
    with pytest.raises(caffe.NetError, match="pooled_h and pooled_w must be > 0"):
        run_layer('type: "ROIPooling" roi_pooling_param { pooled_h: 0 pooled_w: 2 }', [X, ROIS])
    with pytest.raises(caffe.NetError, match="rows"):
        run_layer('type: "ROIPooling" roi_pooling_param { pooled_h: 2 pooled_w: 2 }', [X, ROIS[:, :4]])
    with pytest.raises(caffe.NetError, match="batch index 2"):
        run_layer('type: "ROIPooling" roi_pooling_param { pooled_h: 2 pooled_w: 2 }', [X, [[2, 0, 0, 3, 3]]],
                  propagate=[True, False])


def test_no_rois(mode):
    layer, bottom, top = run_layer('type: "ROIPooling" roi_pooling_param { pooled_h: 2 pooled_w: 2 }',
                                   [X, np.zeros((0, 5))], propagate=[True, False])
    assert top[0].shape == (0, 3, 2, 2)
    np.testing.assert_array_equal(bottom[0].cpu_diff(), 0)


def test_gradient(mode):
    layer = make_layer('type: "ROIPooling" roi_pooling_param { pooled_h: 2 pooled_w: 2 spatial_scale: 0.5 }')
    x = X[:, :2, :6, :6] / 10.0  # distinct values, well separated relative to the step
    rois = np.array([[0, 0, 0, 10, 10], [1, 2, 2, 8, 6]])
    GradientChecker(1e-4, 1e-6).check(layer, blobs([x, rois]), empty_blobs(1), check_bottom=[0])


@pytest.mark.gpu
@pytest.mark.parametrize("ph,pw,scale", [(2, 2, 1.0), (7, 7, 1.0), (3, 2, 0.5), (6, 6, 0.0625)])
def test_cpu_gpu_agree(ph, pw, scale):
    text = f'type: "ROIPooling" roi_pooling_param {{ pooled_h: {ph} pooled_w: {pw} spatial_scale: {scale} }}'
    rois = np.concatenate([ROIS, [[1, 0, 0, 150, 170], [0, 16, 32, 100, 60]]])
    assert_cpu_gpu_agree(text, [X, rois], propagate=[True, False])
    assert_cpu_gpu_agree(text, [X, rois], propagate=[True, False], dtype=np.float32, rtol=1e-6, atol=1e-6)
