"""Input layer: top shapes from input_param, one shared or one per top; no bottoms."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer


def test_one_shape_per_top(mode):
    layer = make_layer('type: "Input" input_param { shape { dim: 2 dim: 3 } shape { dim: 4 } }')
    top = empty_blobs(2)
    layer.setup([], top)
    assert top[0].shape == (2, 3) and top[1].shape == (4,)
    top[0].data[...] = 7
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].data, 7)  # forward leaves user data alone


def test_shared_shape():
    layer = make_layer('type: "Input" input_param { shape { dim: 1 dim: 3 dim: 5 dim: 5 } }')
    top = empty_blobs(3)
    layer.setup([], top)
    assert [t.shape for t in top] == [(1, 3, 5, 5)] * 3


def test_reshape_keeps_user_shape():
    layer = make_layer('type: "Input" input_param { shape { dim: 2 } }')
    top = empty_blobs(1)
    layer.setup([], top)
    top[0].reshape(6, 2)
    layer.forward([], top)
    assert top[0].shape == (6, 2)


def test_errors():
    with pytest.raises(NetError, match="shapes"):
        make_layer('type: "Input" input_param { shape { dim: 1 } shape { dim: 2 } }').setup([], empty_blobs(3))
    with pytest.raises(NetError, match="bottom"):
        make_layer('type: "Input" input_param { shape { dim: 1 } }').setup(blobs([np.zeros(1)]), empty_blobs(1))
    with pytest.raises(NetError, match="top"):
        make_layer('type: "Input"').setup([], [])
