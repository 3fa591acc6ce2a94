"""Tile: repeat along an axis, summed backward, errors."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

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
