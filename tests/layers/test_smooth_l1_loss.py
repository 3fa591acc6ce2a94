"""SmoothL1Loss: loss and gradients against a per-element reference, sigma, inside/outside weights,
loss weight, gradients, CPU/GPU agreement, errors."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(8)
P = RNG.standard_normal((3, 8, 2, 2)) * 2
T = RNG.standard_normal((3, 8, 2, 2))
WI = RNG.uniform(0, 2, P.shape)
WO = RNG.uniform(0, 2, P.shape)


def reference(p, t, sigma, wi=None, wo=None):
    loss, grad = 0.0, np.zeros_like(p)
    for idx in np.ndindex(p.shape):
        a, b = (wi[idx] if wi is not None else 1.0), (wo[idx] if wo is not None else 1.0)
        d = a * (p[idx] - t[idx])
        if abs(d) < 1 / sigma**2:
            loss += b * 0.5 * (sigma * d) ** 2
            grad[idx] = a * b * sigma**2 * d
        else:
            loss += b * (abs(d) - 0.5 / sigma**2)
            grad[idx] = a * b * np.sign(d)
    return loss / p.shape[0], grad / p.shape[0]


@pytest.mark.parametrize("sigma", [1.0, 3.0, 0.5])
@pytest.mark.parametrize("weighted", [False, True])
def test_forward_backward(mode, sigma, weighted):
    arrays = [P, T, WI, WO] if weighted else [P, T]
    text = f'type: "SmoothL1Loss" smooth_l1_loss_param {{ sigma: {sigma} }} loss_weight: 2'
    layer, bottom, top = run_layer(text, arrays, propagate=[True, True] + [False] * (len(arrays) - 2))
    loss, grad = reference(P, T, sigma, *(arrays[2:] if weighted else []))
    np.testing.assert_allclose(float(top[0].cpu_data()), loss, rtol=1e-12)
    # run_layer gave the top a random diff: the gradient scales with it (the loss weight).
    w = float(top[0].cpu_diff())
    np.testing.assert_allclose(bottom[0].cpu_diff(), w * grad, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(bottom[1].cpu_diff(), -w * grad, rtol=1e-12, atol=1e-15)


def test_errors():
    with pytest.raises(caffe.NetError, match="4 bottoms"):
        run_layer('type: "SmoothL1Loss"', [P, T, WI])
    with pytest.raises(caffe.CaffeError, match="shape of bottom 0"):
        run_layer('type: "SmoothL1Loss"', [P, T[:, :4]])


def test_weights_take_no_gradient():
    layer, bottom, top = run_layer('type: "SmoothL1Loss"', [P, T, WI, WO], propagate=[True, False, True, True])
    np.testing.assert_array_equal(bottom[2].cpu_diff(), 0)
    np.testing.assert_array_equal(bottom[3].cpu_diff(), 0)
    assert [layer.allow_force_backward(i) for i in range(4)] == [True, True, False, False]


@pytest.mark.parametrize("weighted", [False, True])
def test_gradient(mode, weighted):
    p = P[:2, :3].copy()
    p[np.abs(np.abs(p - T[:2, :3]) - 1) < 0.05] += 0.2  # away from the |d| = 1 kink
    arrays = [p, T[:2, :3]] + ([np.ones_like(p), WO[:2, :3]] if weighted else [])
    layer = make_layer('type: "SmoothL1Loss"')
    GradientChecker(1e-4, 1e-5).check(layer, blobs(arrays), empty_blobs(1), check_bottom=[0, 1])


@pytest.mark.gpu
@pytest.mark.parametrize("weighted", [False, True])
def test_cpu_gpu_agree(weighted):
    arrays = [P, T, WI, WO] if weighted else [P, T]
    prop = [True, True] + [False] * (len(arrays) - 2)
    assert_cpu_gpu_agree('type: "SmoothL1Loss" smooth_l1_loss_param { sigma: 3 }', arrays, propagate=prop)
