"""MVN: mean (and variance) normalization per channel or across channels; Caffe's gradient."""

import numpy as np
import pytest

from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(3)
X = RNG.standard_normal((2, 3, 3, 2)) * 3 + 2


def expect(x, normalize_variance, across_channels, eps=1e-9):
    rows = x.reshape(x.shape[0], -1) if across_channels else x.reshape(x.shape[0] * x.shape[1], -1)
    y = rows - rows.mean(axis=1, keepdims=True)
    if normalize_variance:
        y = y / (np.sqrt((y**2).mean(axis=1, keepdims=True)) + eps)
    return y.reshape(x.shape)


CONFIGS = [
    ("", True, False),
    ("normalize_variance: false", False, False),
    ("across_channels: true", True, True),
    ("across_channels: true normalize_variance: false", False, True),
]


@pytest.mark.parametrize("params,nv,ac", CONFIGS)
def test_forward(mode, params, nv, ac):
    _, _, top = run_layer(f'type: "MVN" mvn_param {{ {params} }}', [X])
    np.testing.assert_allclose(top[0].cpu_data(), expect(X, nv, ac), rtol=1e-9, atol=1e-12)


def test_eps_added_to_std():
    _, _, top = run_layer('type: "MVN" mvn_param { eps: 0.5 }', [X])
    np.testing.assert_allclose(top[0].cpu_data(), expect(X, True, False, eps=0.5), rtol=1e-10)


def test_backward_matches_caffe_formula():
    layer, bottom, top = run_layer('type: "MVN" mvn_param { eps: 0.01 }', [X])
    dy = top[0].cpu_diff().reshape(6, -1)
    y = top[0].cpu_data().reshape(6, -1)
    xr = X.reshape(6, -1)
    std = np.sqrt(((xr - xr.mean(1, keepdims=True)) ** 2).mean(1, keepdims=True)) + layer.eps
    dim = xr.shape[1]
    dx = (dy - (dy.sum(1, keepdims=True) + y * (dy * y).sum(1, keepdims=True)) / dim) / std
    np.testing.assert_allclose(bottom[0].cpu_diff(), dx.reshape(X.shape), rtol=1e-10)


@pytest.mark.parametrize("params,nv,ac", CONFIGS)
def test_gradient(mode, params, nv, ac):
    layer = make_layer(f'type: "MVN" mvn_param {{ {params} }}')
    GradientChecker(1e-3, 1e-4).check(layer, blobs([X]), empty_blobs(1))


def test_in_place(mode):
    layer = make_layer('type: "MVN"')
    (b,) = blobs([X])
    layer.setup([b], [b])
    layer.forward([b], [b])
    np.testing.assert_allclose(b.cpu_data(), expect(X, True, False), rtol=1e-9, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("params,nv,ac", CONFIGS)
def test_cpu_gpu_agree(params, nv, ac):
    assert_cpu_gpu_agree(f'type: "MVN" mvn_param {{ {params} }}', [X])
