"""Direct small-batch convolution engine (``conv_direct``, forward only) against cpu_conv in float64 on
a grid of the geometries it accepts, poisoned outputs, what ``supports`` refuses, and the engine through
the Convolution layer (forced for the forward, gradients through its gemm fallback, autotuned)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.conv import cpu as cpu_conv
from pycaffe_lite.conv import direct as conv_direct
from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_mode")]  # conftest's: GPU mode, then CPU


def _geometries():
    """(num, channels, H, W, num_output, k, pad, stride): every kernel size and stride, pads 0..2,
    batches 1/3/4, odd sizes spanning several 16x16 tiles and several 8-channel tiles."""
    out = []
    for i, (k, s, p) in enumerate(itertools.product((1, 3, 5, 7), (1, 2), (0, 1, 2))):
        num, c, (h, w), m = ((1, 3, (19, 17), 9), (3, 5, (9, 11), 4), (4, 2, (35, 18), 17))[i % 3]
        out.append((num, c, h, w, m, k, p, s))
    return out


GEOMETRIES = _geometries()


def _problem(geo, dtype) -> ConvProblem:
    num, c, h, w, m, k, p, s = geo
    return ConvProblem(num, c, h, w, m, 1, (k, k), (p, p), (s, s), (1, 1), np.dtype(dtype).str)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("geo", GEOMETRIES)
def test_forward_matches_reference(geo, dtype):
    prob = _problem(geo, dtype)
    assert conv_direct.supports(prob)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((prob.num, prob.channels, prob.height, prob.width))
    w = rng.standard_normal((prob.num_output, prob.channels) + prob.kernel)
    bias = rng.standard_normal(prob.num_output)
    want = np.empty((prob.num, prob.num_output) + prob.out_hw)
    cpu_conv.forward(x, w, bias, prob.kernel, prob.pad, prob.stride, prob.dilation, 1, want)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == np.float64 else dict(rtol=1e-4, atol=1e-4)
    X, W, B, Y = blobs([x, w, bias, np.full(want.shape, np.nan)], dtype)
    for with_bias in (True, False):
        conv_direct.DirectEngine().forward(prob, X.gpu_data(), W.gpu_data(), B.gpu_data() if with_bias else None,
                                           Y.mutable_gpu_data(), [])
        got = Y.cpu_data().copy()
        assert np.all(np.isfinite(got)), "unwritten outputs"
        np.testing.assert_allclose(got, want if with_bias else want - bias[:, None, None], **tol)
        Y.mutable_cpu_data()[...] = np.nan


@pytest.mark.parametrize("change", [{"num": 5}, {"group": 2, "channels": 4}, {"kernel": (3, 5)}, {"kernel": (9, 9)},
                                    {"stride": (3, 3)}, {"stride": (1, 2)}, {"dilation": (2, 2)}])
def test_supports_refuses(change):
    args = dict(num=1, channels=4, height=16, width=16, num_output=8, group=1, kernel=(3, 3), pad=(1, 1),
                stride=(1, 1), dilation=(1, 1), dtype="<f4")
    assert conv_direct.supports(ConvProblem(**args))
    prob = ConvProblem(**(args | change))
    assert not conv_direct.supports(prob)
    assert not conv_engines.ENGINES["direct"].supports(prob)


# -- through the Convolution layer ------------------------------------------------------------
def _layer(body: str, dtype=np.float64):
    return make_layer(f'name: "dc" type: "Convolution" convolution_param {{ {body} '
                      'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "uniform" min: -1 max: 1 } }',
                      dtype)


@pytest.mark.parametrize("body", ["num_output: 3 kernel_size: 3 pad: 1", "num_output: 9 kernel_size: 5 stride: 2 pad: 2"])
def test_gradient_check_forced_direct(body):
    """Forward by the direct engine, gradients by its gemm fallback (the engine's own backward)."""
    caffe.set_random_seed(4)
    layer = _layer(body + " engine: DIRECT")
    bottom, top = blobs([np.random.default_rng(1).standard_normal((2, 2, 7, 6))]), empty_blobs(1)
    layer.setup(bottom, top)
    GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)
    assert layer.engine_choice().forward == "direct"


def test_autotune_offers_direct_for_small_batches():
    conv_engines.clear_cache()
    layer = _layer("num_output: 16 kernel_size: 3 pad: 1", np.float32)
    bottom, top = blobs([np.ones((1, 8, 20, 20))], np.float32), empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert ("forward", "direct") in {(p, n) for p, n, _ in layer.engine_choice().timings}
