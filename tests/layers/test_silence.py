"""Silence layer: no tops; backward zeroes the diffs of bottoms flagged in propagate_down."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer


def test_forward_leaves_bottoms_and_backward_zeroes_diffs(mode):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((2, 3)), rng.standard_normal((4,))]
    layer = make_layer('type: "Silence"')
    bottom = blobs(arrays)
    layer.setup(bottom, [])
    assert layer.forward(bottom, []) == 0.0
    for b, a in zip(bottom, arrays):
        np.testing.assert_array_equal(b.data, a)
        b.diff[...] = 3.0
    layer.backward([], [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 0.0)
    np.testing.assert_array_equal(bottom[1].diff, 3.0)


def test_counts():
    with pytest.raises(NetError, match="bottom"):
        make_layer('type: "Silence"').setup([], [])
    with pytest.raises(NetError, match="top"):
        make_layer('type: "Silence"').setup(blobs([np.zeros(2)]), empty_blobs(1))


def test_in_a_net(tmp_path):
    import pycaffe_lite as caffe

    path = tmp_path / "net.prototxt"
    path.write_text(
        'force_backward: true\n'
        'layer { name: "in" type: "Input" top: "a" top: "b" input_param { shape { dim: 2 dim: 3 } } }\n'
        'layer { name: "s" type: "Silence" bottom: "a" bottom: "b" }\n'
    )
    net = caffe.Net(str(path), caffe.TRAIN)
    assert net.outputs == []
    net.blobs["a"].diff[...] = 9.0
    net.forward()
    net.backward()
    np.testing.assert_array_equal(net.blobs["a"].diff, 0.0)
