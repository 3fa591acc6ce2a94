"""The fused GPU passes of runtime/fusion.py without a GPU: BatchNorm's chain kernels
(layers/batch_norm.cu, with the statistics and the block sums of gpu/math_functions.cu), Eltwise's
sum + ReLU (layers/eltwise.cu) and the ReLU + bias-sum reduction (``reduce_relu_sum``) compiled as
host C++ on ``host_kernels.THREADED_SHIM`` (a block's threads as OS threads, warp shuffles an
exchange between barriers), against the layers' own CPU passes run one after another. This checks
index math, the chunked per-channel sums and the formulas; the device run is the GPU tests' job.
Marked slow (compilations)."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.testing import host_kernels as hk
from pycaffe_lite.testing.layer_testing import blobs, make_layer

pytestmark = [pytest.mark.skipif(hk.CXX is None, reason="no host C++ compiler"), pytest.mark.slow]

DTYPES = [np.float64, np.float32]
SHAPE = (3, 4, 5, 8)  # spatial 40: the 4-wide kernels where the host arrays are aligned


def tol(dtype) -> dict:
    return {"rtol": 1e-10, "atol": 1e-12} if dtype == np.float64 else {"rtol": 2e-5, "atol": 2e-6}


def _layers(dtype, stats: str, bias: bool):
    bn = make_layer(f'type: "BatchNorm" batch_norm_param {{ eps: 0.001 {stats} }}', dtype)
    scale = make_layer(f'type: "Scale" scale_param {{ bias_term: {str(bias).lower()} filler {{ type: "gaussian" }} '
                       'bias_filler { type: "gaussian" } }', dtype)
    relu = make_layer('type: "ReLU"', dtype)
    return bn, scale, relu


def _copy_params(src, dst) -> None:
    for a, b in zip(src.blobs, dst.blobs):
        b.data[...] = a.data


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("stats", "relu", "bias"), [
    ("", True, True), ("use_global_stats: true", True, True), ("", False, True), ("", True, False)])
def test_norm_chain_equals_the_layers(monkeypatch, dtype, stats, relu, bias):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(SHAPE) * 2 + 0.5
    dy = rng.standard_normal(SHAPE)
    running = (rng.standard_normal(SHAPE[1]), rng.random(SHAPE[1]) + 0.5, np.array([2.0]))

    # the layers one by one on the CPU, in place on one blob
    ref = blobs([x], dtype)
    bn, scale, relu_layer = _layers(dtype, stats, bias)
    for layer in (bn, scale, relu_layer):
        layer.setup(ref, ref)
    for blob, value in zip(bn.blobs, running):
        blob.data[...] = value
    scale.param_propagate_down = [True] * len(scale.blobs)
    chain = [bn, scale] + ([relu_layer] if relu else [])
    for layer in chain:
        layer.reshape(ref, ref)
        layer.forward_cpu(ref, ref)
    ref[0].diff[...] = dy
    for layer in reversed(chain):
        layer.backward_cpu(ref, [True], ref)

    # the chain's two GPU passes on the host
    hk.threaded_device(monkeypatch)
    got = blobs([x], dtype)
    bn2, scale2, relu2 = _layers(dtype, stats, bias)
    for layer in (bn2, scale2, relu2):
        layer.setup(got, got)
    _copy_params(scale, scale2)
    for blob, value in zip(bn2.blobs, running):
        blob.data[...] = value
    for blob in scale2.blobs:
        blob.diff[...] = 0
    scale2.param_propagate_down = [True] * len(scale2.blobs)
    bn2.reshape(got, got)
    scale2.reshape(got, got)
    xhat = bn2.saved_normalized()
    bn2.chain_forward_gpu(got[0], xhat, got[0], scale2, relu)
    np.testing.assert_allclose(got[0].data, ref[0].data, **tol(dtype))
    for a, b in zip(bn2.blobs, bn.blobs):  # the running sums (batch statistics update them)
        np.testing.assert_allclose(a.data, b.data, **tol(dtype))
    got[0].diff[...] = dy
    bn2.chain_backward_gpu(got[0], xhat, got[0], scale2, relu)
    np.testing.assert_allclose(got[0].diff, ref[0].diff, **tol(dtype))
    for a, b in zip(scale2.blobs, scale.blobs):
        np.testing.assert_allclose(a.diff, b.diff, **tol(dtype))
    assert got[0].diff.any() and (not relu or (got[0].data == 0).any())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("coeff", "tops", "down"), [("", 2, (True, True)), ("coeff: 0.5 coeff: -2", 3, (True, False)),
                                                     ("", 1, (False, True))])
def test_sum_relu_chain_equals_the_layers(monkeypatch, dtype, coeff, tops, down):
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(SHAPE) for _ in range(2)]
    grads = [rng.standard_normal(SHAPE) for _ in range(tops)]
    eltwise = make_layer(f'type: "Eltwise" eltwise_param {{ {coeff} }}', dtype)
    relu = make_layer('type: "ReLU"', dtype)

    ref_bottom, ref_top = blobs(xs, dtype), blobs([np.zeros(SHAPE)], dtype)
    eltwise.setup(ref_bottom, ref_top)
    eltwise.forward_cpu(ref_bottom, ref_top)
    relu.setup(ref_top, ref_top)
    relu.forward_cpu(ref_top, ref_top)
    ref_top[0].diff[...] = sum(grads)  # the Split's backward
    relu.backward_cpu(ref_top, [True], ref_top)
    eltwise.backward_cpu(ref_top, list(down), ref_bottom)

    hk.threaded_device(monkeypatch)
    bottom, top = blobs(xs, dtype), blobs([np.zeros(SHAPE)], dtype)
    for b in bottom:
        b.diff[...] = 7.0  # a bottom not propagated to keeps its diff
    eltwise.chain_forward_relu_gpu(bottom, top)
    np.testing.assert_allclose(top[0].data, ref_top[0].data, **tol(dtype))
    if tops == 1:
        sources = top
        top[0].diff[...] = grads[0]
    else:
        sources = blobs([np.zeros(SHAPE)] * tops, dtype)
        for s, g in zip(sources, grads):
            s.diff[...] = g
    eltwise.chain_backward_relu_gpu(sources, top, list(down), bottom)
    np.testing.assert_allclose(top[0].diff, ref_top[0].diff, **tol(dtype))
    for b, r, d in zip(bottom, ref_bottom, down):
        np.testing.assert_allclose(b.diff, r.diff if d else np.full(SHAPE, 7.0), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 4, 40), (2, 3, 7)])
def test_relu_backward_channel_sum(monkeypatch, dtype, shape):
    rng = np.random.default_rng(3)
    dy = rng.standard_normal(shape).astype(dtype)
    y = np.maximum(rng.standard_normal(shape), 0).astype(dtype)
    out0 = rng.standard_normal(shape[1]).astype(dtype)
    hk.threaded_device(monkeypatch)
    d_dy, d_y, d_out = (hk.aligned_copy(a) for a in (dy, y, out0))
    gm.relu_backward_channel_sum(*shape, d_dy.ctypes.data, d_y.ctypes.data, d_dy.ctypes.data, d_out.ctypes.data,
                                 dtype, beta=1.0)
    np.testing.assert_array_equal(d_dy, dy * (y > 0))
    np.testing.assert_allclose(d_out, out0 + (dy * (y > 0)).sum(axis=(0, 2)), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stats", ["", "use_global_stats: true"])
@pytest.mark.parametrize("in_place", [True, False])
def test_batch_norm_own_passes_equal_the_cpu(monkeypatch, dtype, stats, in_place):
    """BatchNorm's own forward_gpu / backward_gpu (in place they share the chain's kernels) against
    its CPU passes, with the running sums."""
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal(SHAPE) * 3 - 1, rng.standard_normal(SHAPE)
    running = (rng.standard_normal(SHAPE[1]), rng.random(SHAPE[1]) + 0.5, np.array([2.0]))
    out = {}
    for side in ("cpu", "gpu"):
        if side == "gpu":
            hk.threaded_device(monkeypatch)
        bottom = blobs([x], dtype)
        top = bottom if in_place else blobs([np.zeros(SHAPE)], dtype)
        bn = make_layer(f'type: "BatchNorm" batch_norm_param {{ eps: 0.001 {stats} }}', dtype)
        bn.setup(bottom, top)
        for blob, value in zip(bn.blobs, running):
            blob.data[...] = value
        bn.reshape(bottom, top)
        (bn.forward_cpu if side == "cpu" else bn.forward_gpu)(bottom, top)
        y = top[0].data.copy()
        top[0].diff[...] = dy
        (bn.backward_cpu if side == "cpu" else bn.backward_gpu)(top, [True], bottom)
        out[side] = (y, bottom[0].diff.copy(), *(b.data.copy() for b in bn.blobs))
    for a, b in zip(out["gpu"], out["cpu"]):
        np.testing.assert_allclose(a, b, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [2, 4, 6])
def test_weighted_sum(monkeypatch, dtype, k):
    """The plain sum the fused one shares its loop with (weighted_sum.cuh): more than four inputs
    take a second pass over the partial sum."""
    rng = np.random.default_rng(k)
    xs = [hk.aligned_copy(rng.standard_normal(960).astype(dtype)) for _ in range(k)]
    coeffs = list(rng.standard_normal(k))
    y = hk.aligned_copy(np.zeros(960, dtype))
    hk.threaded_device(monkeypatch)
    gm.weighted_sum(960, [x.ctypes.data for x in xs], coeffs, y.ctypes.data, dtype)
    np.testing.assert_allclose(y, sum(c * x for c, x in zip(coeffs, xs)), **tol(dtype))
