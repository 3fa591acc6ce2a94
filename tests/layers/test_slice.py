"""Slice: axis / slice_dim, slice_point or equal split, backward concatenation, errors."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.gradient_check import GradientChecker
from pycaffe_lite.testing import blobs, empty_blobs, make_layer


def run_layer(text, arrays, ntop=1, propagate=None, seed=5, dtype=np.float64):
    """Set up, forward, then backward with fixed random top diffs; returns (layer, bottom, top)."""
    caffe.set_random_seed(seed)
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
        caffe.set_mode_gpu() if gpu else caffe.set_mode_cpu()
        try:
            layer, bottom, top = run_layer(text, arrays, ntop, propagate, dtype=dtype)
            prop = propagate if propagate is not None else [True] * len(bottom)
            out = [t.cpu_data().copy() for t in top]
            out += [b.cpu_diff().copy() for b, p in zip(bottom, prop) if p]
            out += [p.cpu_data().copy() for p in layer.blobs] + [p.cpu_diff().copy() for p in layer.blobs]
            results.append(out)
        finally:
            caffe.set_mode_cpu()
    assert len(results[0]) == len(results[1])
    for i, (a, b) in enumerate(zip(*results)):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol, err_msg=f"array {i}")


RNG = np.random.default_rng(5)
X = RNG.standard_normal((4, 6, 2, 3))


@pytest.mark.parametrize("params,ntop,axis,points", [
    ("", 3, 1, [2, 4]),
    ("slice_point: 1 slice_point: 5", 3, 1, [1, 5]),
    ("axis: 0 slice_point: 3", 2, 0, [3]),
    ("slice_dim: 3", 3, 3, [1, 2]),
    ("axis: -2", 2, 2, [1]),
    ("axis: 2", 1, 2, []),
])
def test_forward_backward(mode, params, ntop, axis, points):
    layer, bottom, top = run_layer(f'type: "Slice" slice_param {{ {params} }}', [X], ntop=ntop)
    parts = np.split(X, points, axis=axis)
    assert len(top) == len(parts)
    for t, p in zip(top, parts):
        np.testing.assert_array_equal(t.cpu_data(), p)
    np.testing.assert_array_equal(bottom[0].cpu_diff(), np.concatenate([t.cpu_diff() for t in top], axis=axis))


@pytest.mark.parametrize("params,ntop,match", [
    ("", 4, "equal parts"),
    ("slice_point: 2", 3, "slice_point values for 3 tops"),
    ("slice_point: 3 slice_point: 2", 3, "increasing"),
    ("slice_point: 7", 2, "beyond"),
    ("axis: 1 slice_dim: 1", 2, "not both"),
])
def test_errors(params, ntop, match):
    with pytest.raises(caffe.NetError, match=match):
        run_layer(f'type: "Slice" slice_param {{ {params} }}', [X], ntop=ntop)


def test_gradient(mode):
    layer = make_layer('type: "Slice" slice_param { slice_point: 1 slice_point: 4 }')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([X[:2, :, :1]]), empty_blobs(3))


@pytest.mark.gpu
@pytest.mark.parametrize("params,ntop", [("", 3), ("axis: 3 slice_point: 1", 2), ("axis: 0 slice_point: 1 slice_point: 3", 3)])
def test_cpu_gpu_agree(params, ntop):
    assert_cpu_gpu_agree(f'type: "Slice" slice_param {{ {params} }}', [X], ntop=ntop)
