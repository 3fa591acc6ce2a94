"""MemoryData layer: setup shapes, reset/forward walking through the arrays batch by batch with
wrap-around, set_input_arrays checks, and use inside a net (CPU and GPU mode)."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.net import Net
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer

PARAM = 'type: "MemoryData" memory_data_param { batch_size: 2 channels: 3 height: 2 width: 1 }'

NET = """
name: "mem"
layer { name: "data" type: "MemoryData" top: "data" top: "label"
        memory_data_param { batch_size: 2 channels: 3 height: 2 width: 1 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
"""


def _arrays(n, dtype=np.float32):
    data = np.arange(n * 6, dtype=dtype).reshape(n, 3, 2, 1)
    labels = np.arange(n, dtype=dtype) + 100
    return data, labels


def test_setup_shapes():
    layer = make_layer(PARAM)
    top = empty_blobs(2)
    layer.setup([], top)
    assert top[0].shape == (2, 3, 2, 1)
    assert top[1].shape == (2,)
    assert (layer.batch_size, layer.channels, layer.height, layer.width) == (2, 3, 2, 1)


def test_forward_walks_and_wraps(mode):
    layer = make_layer(PARAM)
    top = empty_blobs(2)
    layer.setup([], top)
    data, labels = _arrays(6, np.float64)
    layer.reset(data, labels, 6)
    seen = []
    for step in range(5):
        layer.forward([], top)
        start = (2 * step) % 6
        np.testing.assert_array_equal(top[0].data, data[start : start + 2])
        np.testing.assert_array_equal(top[1].data, labels[start : start + 2])
        seen.append(top[1].data.tolist())
    assert seen[3] == seen[0]  # wrapped around after three batches


def test_arrays_kept_by_reference():
    layer = make_layer(PARAM)
    top = empty_blobs(2)
    layer.setup([], top)
    data, labels = _arrays(2, np.float64)
    layer.reset(data, labels, 2)
    data[...] = -7.0
    layer.forward([], top)
    assert np.all(top[0].data == -7.0)


def test_errors():
    with pytest.raises(NetError, match="positive batch_size"):
        make_layer('type: "MemoryData" memory_data_param { batch_size: 2 channels: 0 height: 1 width: 1 }').setup(
            [], empty_blobs(2)
        )
    layer = make_layer(PARAM)
    top = empty_blobs(2)
    layer.setup([], top)
    with pytest.raises(NetError, match="set_input_arrays"):
        layer.forward([], top)
    data, labels = _arrays(3, np.float64)
    with pytest.raises(NetError, match="multiple of batch_size"):
        layer.reset(data, labels, 3)
    with pytest.raises(NetError, match="exactly 2 top"):
        make_layer(PARAM).setup([], empty_blobs(1))


def test_transform_param_warns():
    layer = make_layer(PARAM + " transform_param { scale: 0.5 }")
    top = empty_blobs(2)
    layer.setup([], top)
    data, labels = _arrays(2, np.float64)
    with pytest.warns(UserWarning, match="does not apply transform_param"):
        layer.reset(data, labels, 2)
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].data, data)  # unscaled, as in Caffe


def test_set_input_arrays_in_net(mode, tmp_path):
    path = tmp_path / "mem.prototxt"
    path.write_text(NET)
    net = Net(str(path), caffe.TEST)
    data, labels = _arrays(4)
    net.set_input_arrays(data, labels)  # 1-d labels are accepted
    w = net.params["ip"][0].data.astype(np.float64)
    b = net.params["ip"][1].data
    for step in range(3):
        out = net.forward()
        start = (2 * step) % 4
        np.testing.assert_allclose(out["ip"], data[start : start + 2].reshape(2, -1) @ w.T + b, rtol=1e-5)
        np.testing.assert_array_equal(net.blobs["label"].data, labels[start : start + 2])
    net.set_input_arrays(data[2:].copy(), labels[2:, None, None, None].copy())
    net.forward()
    np.testing.assert_array_equal(net.blobs["label"].data, labels[2:])


def test_set_input_arrays_checks(tmp_path):
    path = tmp_path / "mem.prototxt"
    path.write_text(NET)
    net = Net(str(path), caffe.TEST)
    data, labels = _arrays(4)
    with pytest.raises(ValueError, match="C contiguous"):
        net.set_input_arrays(np.asfortranarray(data), labels)
    with pytest.raises(ValueError, match="float32"):
        net.set_input_arrays(data.astype(np.float64), labels)
    with pytest.raises(ValueError, match="4-d"):
        net.set_input_arrays(data.reshape(4, 6), labels)
    with pytest.raises(ValueError, match=r"expected \(N, 3, 2, 1\)"):
        net.set_input_arrays(data.reshape(4, 2, 3, 1), labels)
    with pytest.raises(ValueError, match="same first dimension"):
        net.set_input_arrays(data, labels[:2])
    with pytest.raises(ValueError, match="multiple of batch size"):
        net.set_input_arrays(data[:3].copy(), labels[:3].copy())
    other = tmp_path / "input.prototxt"
    other.write_text('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }')
    with pytest.raises(NetError, match="first layer is a MemoryData"):
        Net(str(other), caffe.TEST).set_input_arrays(data, labels)
