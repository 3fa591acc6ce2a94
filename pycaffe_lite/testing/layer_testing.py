"""Layer test helpers: build one layer from prototxt (make_layer), run it (run_layer), check that
its CPU and GPU paths agree (assert_cpu_gpu_agree); used by tests/ and next to gradient_check."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import common
from ..blob import Blob
from ..layer import Layer, create_layer
from ..proto.protoio import parse_text
from ..schema import caffe_pb2


def layer_param(text: str) -> caffe_pb2.LayerParameter:
    """A LayerParameter from prototxt text (the body of a ``layer { ... }``)."""
    return parse_text(text, caffe_pb2.LayerParameter(), "<layer text>")


def make_layer(text: str, dtype: np.dtype | type = np.float64) -> Layer:
    """Instantiate a layer from prototxt text; ``name`` defaults to its type."""
    param = layer_param(text)
    if not param.name:
        param.name = param.type.lower() or "layer"
    return create_layer(param, dtype)


def blobs(arrays: Sequence[np.ndarray], dtype: np.dtype | type = np.float64) -> list[Blob]:
    """Blobs holding copies of ``arrays``."""
    out = []
    for a in arrays:
        a = np.asarray(a)
        b = Blob(a.shape, dtype)
        b.mutable_cpu_data()[...] = a
        out.append(b)
    return out


def empty_blobs(n: int, dtype: np.dtype | type = np.float64) -> list[Blob]:
    return [Blob((), dtype) for _ in range(n)]


def run_layer(text, arrays, ntop=1, propagate=None, seed=5, dtype=np.float64):
    """Set up, forward, then backward with fixed random top diffs; returns (layer, bottom, top)."""
    common.set_random_seed(seed)
    layer = make_layer(text, dtype)
    bottom, top = blobs(arrays, dtype), empty_blobs(ntop, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    rng = np.random.default_rng(seed)
    for t in top:
        t.mutable_cpu_diff()[...] = rng.standard_normal(t.shape)
    for p in layer.blobs:
        p.mutable_cpu_diff()[...] = 0.25  # param diffs accumulate onto this
    layer.backward(top, propagate if propagate is not None else [True] * len(bottom), bottom)
    return layer, bottom, top


def assert_cpu_gpu_agree(text, arrays, ntop=1, propagate=None, rtol=1e-9, atol=1e-11, dtype=np.float64):
    """Same layer and inputs on both devices: tops, bottom diffs, param data and diffs agree."""
    results = []
    for gpu in (False, True):
        common.set_mode_gpu() if gpu else common.set_mode_cpu()
        try:
            layer, bottom, top = run_layer(text, arrays, ntop, propagate, dtype=dtype)
            prop = propagate if propagate is not None else [True] * len(bottom)
            out = [t.cpu_data().copy() for t in top]
            out += [b.cpu_diff().copy() for b, p in zip(bottom, prop) if p]
            out += [p.cpu_data().copy() for p in layer.blobs] + [p.cpu_diff().copy() for p in layer.blobs]
            results.append(out)
        finally:
            common.set_mode_cpu()
    assert len(results[0]) == len(results[1])
    for i, (a, b) in enumerate(zip(*results)):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol, err_msg=f"array {i}")


def unpool_reference(x: np.ndarray, mask: np.ndarray, ho: int, wo: int) -> np.ndarray:
    """Max-unpooling of ``x`` (N, C, H, W) by flat indices ``mask`` into (N, C, ho, wo), as a loop
    in source order: the last source naming a cell wins; indices outside the plane are skipped."""
    n, c = x.shape[:2]
    out = np.zeros((n, c, ho * wo))
    for p in np.ndindex(n, c):
        for v, k in zip(x[p].ravel(), mask[p].ravel()):
            if 0 <= int(k) < ho * wo:
                out[p][int(k)] = v
    return out.reshape(n, c, ho, wo)
