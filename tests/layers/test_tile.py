"""Tile: repeat along an axis, summed backward, errors."""

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


RNG = np.random.default_rng(6)
X = RNG.standard_normal((2, 3, 4))


@pytest.mark.parametrize("axis,tiles", [(0, 2), (1, 3), (2, 1), (-1, 4)])
def test_forward_backward(mode, axis, tiles):
    layer, bottom, top = run_layer(f'type: "Tile" tile_param {{ axis: {axis} tiles: {tiles} }}', [X])
    reps = [1] * X.ndim
    reps[axis] = tiles
    np.testing.assert_array_equal(top[0].cpu_data(), np.tile(X, reps))
    dy = top[0].cpu_diff()
    ax = axis % X.ndim
    split = dy.reshape(X.shape[:ax] + (tiles,) + X.shape[ax:])
    np.testing.assert_allclose(bottom[0].cpu_diff(), split.sum(axis=ax), rtol=1e-12)


def test_errors():
    with pytest.raises(caffe.NetError, match="required"):
        run_layer('type: "Tile"', [X])
    with pytest.raises(caffe.NetError, match="positive"):
        run_layer('type: "Tile" tile_param { tiles: 0 }', [X])


def test_gradient(mode):
    layer = make_layer('type: "Tile" tile_param { axis: 1 tiles: 3 }')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([X[:, :2, :2]]), empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("axis,tiles", [(0, 3), (1, 2), (2, 5)])
def test_cpu_gpu_agree(axis, tiles):
    assert_cpu_gpu_agree(f'type: "Tile" tile_param {{ axis: {axis} tiles: {tiles} }}', [X])
