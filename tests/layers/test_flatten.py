"""Flatten layer: output shapes for axis/end_axis, shared memory, errors, GPU round trip."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer


def _setup(param, shape):
    x = np.random.default_rng(0).standard_normal(shape)
    layer = make_layer(f'type: "Flatten" {param}')
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    return x, layer, bottom, top


@pytest.mark.parametrize(
    "param,shape,expected",
    [
        ("", (2, 3, 4, 5), (2, 60)),
        ("flatten_param { axis: 2 }", (2, 3, 4, 5), (2, 3, 20)),
        ("flatten_param { axis: 1 end_axis: 2 }", (2, 3, 4, 5), (2, 12, 5)),
        ("flatten_param { axis: 0 }", (2, 3, 4), (24,)),
        ("flatten_param { axis: -2 end_axis: -2 }", (2, 3, 4), (2, 3, 4)),
        ("flatten_param { axis: 0 end_axis: 1 }", (2, 3, 4), (6, 4)),
    ],
)
def test_shapes_and_values(mode, param, shape, expected):
    x, layer, bottom, top = _setup(param, shape)
    layer.forward(bottom, top)
    assert top[0].shape == expected
    np.testing.assert_array_equal(top[0].data, x.reshape(expected))


def test_shares_data_and_diff():
    x, layer, bottom, top = _setup("", (2, 3, 2))
    assert top[0].data_memory is bottom[0].data_memory
    assert top[0].diff_memory is bottom[0].diff_memory
    top[0].diff[...] = np.arange(12.0).reshape(2, 6)
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, np.arange(12.0).reshape(2, 3, 2))


def test_gradient(mode):
    layer = make_layer('type: "Flatten" flatten_param { axis: 1 end_axis: 2 }')
    bottom, top = blobs([np.random.default_rng(1).standard_normal((2, 2, 3, 2))]), empty_blobs(1)
    GradientChecker().check(layer, bottom, top)


def test_follows_bottom_reshape():
    _, layer, bottom, top = _setup("", (2, 3, 2))
    bottom[0].reshape(5, 2, 2)
    bottom[0].data[...] = 1.5
    layer.forward(bottom, top)
    assert top[0].shape == (5, 4)
    np.testing.assert_array_equal(top[0].data, 1.5)


def test_errors():
    with pytest.raises(ShapeError, match="Flatten"):
        _setup("flatten_param { axis: 3 }", (2, 3))
    with pytest.raises(ShapeError, match="end_axis"):
        _setup("flatten_param { axis: 2 end_axis: 1 }", (2, 3, 4))
    layer = make_layer('type: "Flatten"')
    b = blobs([np.zeros((2, 3))])
    with pytest.raises(NetError, match="in place"):
        layer.setup(b, b)
