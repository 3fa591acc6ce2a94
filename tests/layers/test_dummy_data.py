"""DummyData layer: shapes (new and legacy), fillers, refill rules."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer


def _setup(param, n_top):
    layer = make_layer(f'type: "DummyData" dummy_data_param {{ {param} }}')
    top = empty_blobs(n_top)
    layer.setup([], top)
    return layer, top


def test_default_is_zero_with_shared_shape(mode):
    layer, top = _setup("shape { dim: 2 dim: 3 }", 2)
    for t in top:
        np.testing.assert_array_equal(t.data, 0.0)
        t.data[...] = 5.0  # constant fillers are not refilled...
    layer.forward([], top)
    for t in top:
        assert t.shape == (2, 3)
        np.testing.assert_array_equal(t.data, 5.0)  # ...so the values stay


def test_constant_filled_at_setup():
    layer, top = _setup("shape { dim: 4 } data_filler { type: 'constant' value: 2.5 }", 1)
    np.testing.assert_array_equal(top[0].data, 2.5)


def test_legacy_shape_fields():
    layer, top = _setup("num: 2 channels: 3 height: 4 width: 5 num: 1 channels: 1 height: 1 width: 7", 2)
    assert top[0].shape == (2, 3, 4, 5)
    assert top[1].shape == (1, 1, 1, 7)
    layer, top = _setup("num: 2 channels: 3 height: 1 width: 1", 3)
    assert [t.shape for t in top] == [(2, 3, 1, 1)] * 3


def test_per_top_shapes_and_fillers(mode):
    caffe.set_random_seed(3)
    param = (
        "shape { dim: 3 dim: 4 } shape { dim: 50 dim: 40 } "
        "data_filler { type: 'constant' value: 1 } data_filler { type: 'uniform' min: 2 max: 3 }"
    )
    layer, top = _setup(param, 2)
    assert top[0].shape == (3, 4) and top[1].shape == (50, 40)
    first = top[1].data.copy()
    assert first.min() >= 2 and first.max() <= 3 and first.std() > 0.1
    top[0].data[...] = -1
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].data, -1)  # constant: not refilled
    second = top[1].data
    assert second.min() >= 2 and second.max() <= 3
    assert not np.array_equal(first, second)  # non-constant: refilled every forward


def test_single_random_filler_refills_all_tops():
    caffe.set_random_seed(1)
    layer, top = _setup("shape { dim: 100 } data_filler { type: 'gaussian' std: 1 }", 2)
    before = [t.data.copy() for t in top]
    layer.forward([], top)
    for b, t in zip(before, top):
        assert not np.array_equal(b, t.data)
        assert 0.6 < t.data.std() < 1.4


@pytest.mark.parametrize(
    "param,n_top,match",
    [
        ("shape { dim: 2 } shape { dim: 3 }", 3, "shape"),
        ("shape { dim: 2 } num: 2 channels: 1 height: 1 width: 1", 1, "not both"),
        ("num: 2 num: 3 channels: 1 height: 1 width: 1", 3, "num"),
        ("num: 2 channels: 1 height: 1", 1, "width"),
        ("shape { dim: 2 } data_filler { } data_filler { }", 3, "data_filler"),
    ],
)
def test_errors(param, n_top, match):
    with pytest.raises(NetError, match=match):
        _setup(param, n_top)


def test_no_bottoms_allowed():
    from pycaffe_lite.testing.layer_testing import blobs

    layer = make_layer('type: "DummyData" dummy_data_param { shape { dim: 1 } }')
    with pytest.raises(NetError, match="bottom"):
        layer.setup(blobs([np.zeros(1)]), empty_blobs(1))
