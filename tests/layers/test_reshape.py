"""Reshape layer: 0 (copy) and -1 (infer) dims, axis/num_axes windows, shared memory, errors."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer


def _setup(param, shape):
    x = np.random.default_rng(0).standard_normal(shape)
    layer = make_layer(f'type: "Reshape" reshape_param {{ {param} }}')
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    return x, layer, bottom, top


def _shape(dims):
    return "shape { " + " ".join(f"dim: {d}" for d in dims) + " }"


@pytest.mark.parametrize(
    "param,shape,expected",
    [
        (_shape([6, 4]), (2, 3, 4), (6, 4)),
        (_shape([0, -1]), (2, 3, 4), (2, 12)),
        (_shape([-1, 0, 2]), (2, 3, 4), (4, 3, 2)),
        (_shape([0, 0, 0]), (2, 3, 4), (2, 3, 4)),
        (_shape([0, 2, -1, 1]), (2, 3, 4), (2, 2, 6, 1)),
        (_shape([2, 2]) + " axis: 1 num_axes: 1", (3, 4, 5), (3, 2, 2, 5)),
        (_shape([-1]) + " axis: 1", (3, 4, 5), (3, 20)),
        (_shape([1]) + " axis: 0 num_axes: 0", (3, 4), (1, 3, 4)),
        (_shape([1]) + " axis: -1 num_axes: 0", (3, 4), (3, 4, 1)),
        (_shape([1, -1]) + " axis: -2", (3, 4), (3, 1, 4)),
        (_shape([0, -1]) + " axis: 1", (2, 3, 4, 5), (2, 3, 20)),
        (_shape([]), (1, 1), ()),
    ],
)
def test_shapes_and_values(mode, param, shape, expected):
    x, layer, bottom, top = _setup(param, shape)
    layer.forward(bottom, top)
    assert top[0].shape == expected
    np.testing.assert_array_equal(top[0].data, x.reshape(expected))


def test_shares_data_and_diff_and_backward():
    _, layer, bottom, top = _setup(_shape([-1]), (2, 3))
    assert top[0].data_memory is bottom[0].data_memory
    assert top[0].diff_memory is bottom[0].diff_memory
    top[0].diff[...] = np.arange(6.0)
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, np.arange(6.0).reshape(2, 3))


def test_gradient(mode):
    layer = make_layer(f'type: "Reshape" reshape_param {{ {_shape([0, -1])} }}')
    bottom, top = blobs([np.random.default_rng(1).standard_normal((2, 3, 2))]), empty_blobs(1)
    GradientChecker().check(layer, bottom, top)


def test_inferred_dim_follows_bottom_reshape():
    _, layer, bottom, top = _setup(_shape([0, -1]), (2, 3, 4))
    bottom[0].reshape(5, 2, 2)
    layer.forward(bottom, top)
    assert top[0].shape == (5, 4)


@pytest.mark.parametrize(
    "param,shape,match",
    [
        (_shape([5, -1]), (2, 3, 4), "infer"),
        (_shape([5, 5]), (2, 3, 4), "25 elements"),
        (_shape([0, 0, 0, 0]), (2, 3, 4), "copy"),
        (_shape([2]) + " axis: 4", (2, 3), "axis"),
        (_shape([2]) + " axis: 1 num_axes: 3", (2, 3), "num_axes"),
    ],
)
def test_shape_errors(param, shape, match):
    with pytest.raises(ShapeError, match=match) as exc:
        _setup(param, shape)
    assert "Reshape" in str(exc.value)


@pytest.mark.parametrize("dims,match", [([-1, -1], "more than one"), ([2, -3], "invalid")])
def test_param_errors(dims, match):
    with pytest.raises(NetError, match=match):
        _setup(_shape(dims), (2, 3))


def test_in_place_rejected():
    layer = make_layer(f'type: "Reshape" reshape_param {{ {_shape([-1])} }}')
    b = blobs([np.zeros((2, 3))])
    with pytest.raises(NetError, match="in place"):
        layer.setup(b, b)
