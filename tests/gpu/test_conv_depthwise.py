"""Depthwise convolution engine (``conv_depthwise``) against cpu_conv in float64: every pass on a grid of
geometries (kernel 3/5, stride 1/2, pad 0/1/2, dilation 1/2, odd sizes, batch 1/3, multiplier 1/2),
poisoned outputs, accumulating and bitwise-reproducible weight gradients, what ``supports`` refuses,
and the engine through the Convolution layer (forced, gradient-checked, autotuned)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.conv import cpu as cpu_conv
from pycaffe_lite.conv import depthwise as conv_depthwise
from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.conv.registry import bias_backward
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_mode")]  # conftest's: GPU mode, then CPU


def _geometries():
    """(num, channels, H, W, mult, kernel, pad, stride, dilation) over the grid, valid outputs only."""
    out = []
    for i, (k, s, p, d) in enumerate(itertools.product((3, 5), (1, 2), (0, 1, 2), (1, 2))):
        num, (h, w) = (1, (9, 7)) if i % 2 else (3, (11, 10))
        if min(h, w) + 2 * p > d * (k - 1):
            out.append((num, 3 + i % 3, h, w, 1 + (i % 5 == 0), (k, k), (p, p), (s, s), (d, d)))
    out.append((2, 4, 8, 9, 1, (3, 1), (1, 0), (2, 1), (1, 1)))  # non-square kernel, stride, pad
    out.append((3, 6, 64, 64, 1, (3, 3), (1, 1), (1, 1), (1, 1)))  # several weight-gradient chunks
    out.append((3, 6, 28, 28, 1, (3, 3), (1, 1), (2, 2), (1, 1)))
    return out


GEOMETRIES = _geometries()


def _problem(geo, dtype) -> ConvProblem:
    num, c, h, w, mult, kernel, pad, stride, dil = geo
    return ConvProblem(num, c, h, w, c * mult, c, kernel, pad, stride, dil, np.dtype(dtype).str)


def _data(prob, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((prob.num, prob.channels, prob.height, prob.width))
    w = rng.standard_normal((prob.num_output, 1) + prob.kernel)
    bias = rng.standard_normal(prob.num_output)
    dy = rng.standard_normal((prob.num, prob.num_output) + prob.out_hw)
    return x, w, bias, dy


def _reference(prob, x, w, bias, dy):
    """float64 (y, dx, dw, db) with dw and db accumulated onto 0.5 and 0.25."""
    y = np.empty(dy.shape)
    cpu_conv.forward(x, w, bias, prob.kernel, prob.pad, prob.stride, prob.dilation, prob.group, y)
    dx, dw, db = np.empty(x.shape), np.full(w.shape, 0.5), np.full(bias.shape, 0.25)
    cpu_conv.backward(x, w, dy, prob.kernel, prob.pad, prob.stride, prob.dilation, prob.group,
                      dweight=dw, dbias=db, dx=dx)
    return y, dx, dw, db


def _engine_run(prob, x, w, bias, dy, dtype, with_bias=True):
    """The engine's (y, dx, dw, db): y and dx poisoned with NaN first, dw/db start at 0.5/0.25."""
    X, W, B, DY = blobs([x, w, bias, dy], dtype)
    Y, DX, DW, DB = blobs([np.full(dy.shape, np.nan), np.full(x.shape, np.nan), np.full(w.shape, 0.5),
                           np.full(bias.shape, 0.25)], dtype)
    choice = conv_engines.Choice("depthwise", "depthwise", "depthwise")  # scratch from the workspace
    conv_engines.run(prob, choice, "forward", X.gpu_data(), W.gpu_data(), B.gpu_data() if with_bias else None,
                     Y.mutable_gpu_data())
    conv_engines.run(prob, choice, "backward_data", W.gpu_data(), DY.gpu_data(), DX.mutable_gpu_data())
    conv_engines.run(prob, choice, "backward_weight", X.gpu_data(), DY.gpu_data(), DW.mutable_gpu_data(),
                     DB.mutable_gpu_data() if with_bias else None)
    return [b.cpu_data().copy() for b in (Y, DX, DW, DB)]


def _tol(dtype):
    return dict(rtol=1e-10, atol=1e-10) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-3)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("geo", GEOMETRIES)
def test_passes_match_reference(geo, dtype):
    prob = _problem(geo, dtype)
    assert conv_depthwise.supports(prob)
    x, w, bias, dy = _data(prob)
    want = _reference(prob, x, w, bias, dy)
    got = _engine_run(prob, x, w, bias, dy, dtype)
    for what, g, r in zip(("y", "dx", "dw", "db"), got, want):
        assert np.all(np.isfinite(g)), f"{what}: unwritten elements"
        np.testing.assert_allclose(g, r, err_msg=what, **_tol(dtype))


@pytest.mark.parametrize("min_chunk", [1, 1 << 30])
@pytest.mark.parametrize("geo", [GEOMETRIES[0], GEOMETRIES[3], GEOMETRIES[-1]])
def test_weight_gradient_accumulates_and_is_reproducible(monkeypatch, geo, min_chunk):
    """Forced many chunks (partials + fixed-order reduction) or a single one (direct accumulation):
    dw and db add onto what is there; two runs agree bit for bit; without bias db is untouched."""
    monkeypatch.setattr(conv_depthwise, "MIN_CHUNK", min_chunk)
    prob = _problem(geo, np.float32)
    assert (conv_depthwise.chunking(prob)[1] > 1) == (min_chunk == 1)
    x, w, bias, dy = _data(prob, seed=1)
    want = _reference(prob, x, w, bias, dy)
    runs = [_engine_run(prob, x, w, bias, dy, np.float32) for _ in range(2)]
    for a, b in zip(*runs):
        assert np.array_equal(a, b)
    np.testing.assert_allclose(runs[0][2], want[2], **_tol(np.float32))
    np.testing.assert_allclose(runs[0][3], want[3], **_tol(np.float32))
    y, _, dw, db = _engine_run(prob, x, w, bias, dy, np.float32, with_bias=False)
    np.testing.assert_allclose(y, want[0] - bias[:, None, None], **_tol(np.float32))
    np.testing.assert_allclose(dw, want[2], **_tol(np.float32))
    assert np.all(db == 0.25)


def test_partial_backward():
    """Only dx; only db (no dw); each leaves the other buffers alone."""
    prob = _problem(GEOMETRIES[1], np.float64)
    x, w, bias, dy = _data(prob)
    _, want_dx, _, want_db = _reference(prob, x, w, bias, dy)
    X, W, DY = blobs([x, w, dy])
    DX, DW, DB = blobs([np.full(x.shape, np.nan), np.full(w.shape, 0.5), np.full(bias.shape, 0.25)])
    conv_depthwise.DepthwiseEngine().backward_data(prob, W.gpu_data(), DY.gpu_data(), DX.mutable_gpu_data(), [])
    np.testing.assert_allclose(DX.cpu_data(), want_dx, rtol=1e-10, atol=1e-10)
    bias_backward(prob, DY.gpu_data(), DB.mutable_gpu_data())  # what a layer runs for db without dw
    np.testing.assert_allclose(DB.cpu_data(), want_db, rtol=1e-10, atol=1e-10)
    assert np.all(DW.cpu_data() == 0.5)


@pytest.mark.parametrize("channels,num_output,group,ok", [(4, 4, 2, False), (4, 4, 1, False), (6, 3, 3, False),
                                                         (4, 8, 4, True), (1, 3, 1, True)])
def test_supports_only_depthwise(channels, num_output, group, ok):
    prob = ConvProblem(2, channels, 8, 8, num_output, group, (3, 3), (1, 1), (1, 1), (1, 1), "<f4")
    assert conv_depthwise.supports(prob) == ok
    assert conv_engines.ENGINES["depthwise"].supports(prob) == ok


# -- through the Convolution layer ------------------------------------------------------------
def _layer(body: str, dtype=np.float64):
    return make_layer(f'name: "dw" type: "Convolution" convolution_param {{ {body} '
                      'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "uniform" min: -1 max: 1 } }',
                      dtype)


@pytest.mark.parametrize("body", ["num_output: 3 group: 3 kernel_size: 3 stride: 2 pad: 1",
                                  "num_output: 6 group: 3 kernel_size: 3 pad: 1 dilation: 2"])
def test_gradient_check_forced_depthwise(body):
    caffe.set_random_seed(4)
    layer = _layer(body + " engine: DEPTHWISE")
    bottom, top = blobs([np.random.default_rng(1).standard_normal((2, 3, 6, 5))]), empty_blobs(1)
    layer.setup(bottom, top)
    GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)
    assert layer.engine_choice().forward == "depthwise"


def test_layer_forced_depthwise_matches_reference():
    layer = _layer("num_output: 8 group: 8 kernel_size: 3 stride: 2 pad: 1 engine: DEPTHWISE")
    x = np.random.default_rng(2).standard_normal((3, 8, 13, 11))
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    w, b = layer.blobs[0].data.copy(), layer.blobs[1].data.copy()
    want = np.empty(top[0].shape)
    cpu_conv.forward(x, w, b, (3, 3), (1, 1), (2, 2), (1, 1), 8, want)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-10, atol=1e-10)


def test_autotune_offers_depthwise_for_depthwise_layers():
    conv_engines.clear_cache()
    layer = _layer("num_output: 16 group: 16 kernel_size: 3 pad: 1", np.float32)
    bottom, top = blobs([np.ones((4, 16, 14, 14))], np.float32), empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    tried = {(p, n) for p, n, _ in layer.engine_choice().timings}
    for p in ("forward", "backward_data", "backward_weight"):
        assert (p, "depthwise") in tried and (p, "gemm") in tried
