"""Parameter layer: a param blob exposed as the top, sharing data and diff; in a net."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer


def test_top_shares_param(mode):
    layer = make_layer('type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } }')
    top = empty_blobs(1)
    layer.setup([], top)
    assert layer.blobs[0].shape == (2, 3) and top[0].shape == (2, 3)
    assert np.all(top[0].cpu_data() == 0)
    layer.blobs[0].mutable_cpu_data()[...] = np.arange(6).reshape(2, 3)
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].cpu_data(), np.arange(6).reshape(2, 3))
    top[0].mutable_cpu_diff()[...] = 7.0  # a consumer's gradient is the param's gradient
    layer.backward(top, [], [])
    np.testing.assert_array_equal(layer.blobs[0].cpu_diff(), 7.0)


def test_in_net_learns_through_consumer(tmp_path):
    f = tmp_path / "p.prototxt"
    f.write_text(
        'layer { name: "p" type: "Parameter" top: "w" parameter_param { shape { dim: 4 } } }\n'
        'layer { name: "r" type: "Reduction" bottom: "w" top: "s" reduction_param { operation: SUMSQ } loss_weight: 1 }\n'
    )
    net = caffe.Net(str(f), caffe.TRAIN)
    net.params["p"][0].data[...] = [1.0, -2.0, 3.0, 0.5]
    net.forward()
    assert float(net.blobs["s"].data) == pytest.approx(14.25)
    net.backward()
    np.testing.assert_allclose(net.params["p"][0].diff, [2.0, -4.0, 6.0, 1.0])


def test_wrong_loaded_shape():
    layer = make_layer('type: "Parameter" parameter_param { shape { dim: 3 } } blobs { shape { dim: 2 } data: 1 data: 2 }')
    with pytest.raises(caffe.NetError, match="shape"):
        layer.setup([], empty_blobs(1))
