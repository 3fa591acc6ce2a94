"""net_spec: layers/params/NetSpec/to_proto as in BVLC, round-tripping through our parser and Net."""

from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.net import Net
from pycaffe_lite.net_spec import NetSpec, Top, assign_proto, param_name_dict, to_proto
from pycaffe_lite.net_spec import layers as L
from pycaffe_lite.net_spec import params as P
from pycaffe_lite.proto import protoio
from pycaffe_lite.schema import caffe_pb2


def lenet(batch_size):
    n = NetSpec()
    n.data, n.label = L.DummyData(
        shape=[dict(dim=[batch_size, 1, 28, 28]), dict(dim=[batch_size, 1, 1, 1])],
        data_filler=[dict(type="gaussian", std=1.0), dict(type="constant", value=3)],
        ntop=2,
    )
    n.conv1 = L.Convolution(
        n.data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"), param=[dict(lr_mult=1), dict(lr_mult=2)]
    )
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50, weight_filler=dict(type="xavier"))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2 = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    return n.to_proto()


def anon_lenet(batch_size):
    data, label = L.DummyData(
        shape=[dict(dim=[batch_size, 1, 28, 28]), dict(dim=[batch_size, 1, 1, 1])],
        data_filler=dict(type="constant", value=0),
        ntop=2,
    )
    conv1 = L.Convolution(data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    pool1 = L.Pooling(conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    ip1 = L.InnerProduct(pool1, num_output=10, weight_filler=dict(type="xavier"))
    relu1 = L.ReLU(ip1, in_place=True)
    loss = L.SoftmaxWithLoss(relu1, label)
    return loss.to_proto()


def _roundtrip(proto):
    return protoio.parse_text(str(proto), caffe_pb2.NetParameter())


def test_lenet_layers_and_fields():
    proto = lenet(8)
    names = [lp.name for lp in proto.layer]
    assert names == ["data", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2", "loss"]
    conv1 = proto.layer[1]
    assert conv1.type == "Convolution"
    assert list(conv1.bottom) == ["data"] and list(conv1.top) == ["conv1"]
    assert list(conv1.convolution_param.kernel_size) == [5]  # scalar -> repeated field
    assert conv1.convolution_param.num_output == 20
    assert conv1.convolution_param.weight_filler.type == "xavier"
    assert [p.lr_mult for p in conv1.param] == [1, 2]
    assert proto.layer[2].pooling_param.pool == caffe_pb2.PoolingParameter.MAX
    assert proto.layer[2].pooling_param.kernel_size == 2  # optional field stays scalar
    relu = proto.layer[6]
    assert list(relu.bottom) == ["ip1"] and list(relu.top) == ["ip1"]  # in place
    assert list(proto.layer[7].bottom) == ["ip1"]
    assert list(proto.layer[8].bottom) == ["ip2", "label"]
    data = proto.layer[0]
    assert list(data.top) == ["data", "label"]
    assert [list(s.dim) for s in data.dummy_data_param.shape] == [[8, 1, 28, 28], [8, 1, 1, 1]]
    assert [f.type for f in data.dummy_data_param.data_filler] == ["gaussian", "constant"]


def test_lenet_roundtrip_and_build():
    proto = lenet(4)
    parsed = _roundtrip(proto)
    assert parsed == proto
    net = Net(parsed, caffe.TRAIN)
    assert net.blobs["data"].shape == (4, 1, 28, 28)
    assert net.blobs["conv1"].shape == (4, 20, 24, 24)
    assert net.blobs["pool2"].shape == (4, 50, 4, 4)
    assert net.blobs["ip2"].shape == (4, 10)
    assert [b.shape for b in net.params["conv1"]] == [(20, 1, 5, 5), (20,)]
    assert net.blob_loss_weights["loss"] == 1.0
    out = net.forward()
    # The labels are all 3: the loss is the mean of -log softmax(ip2)[:, 3].
    ip2 = net.blobs["ip2"].data.astype(np.float64)
    logp = ip2 - ip2.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    assert float(out["loss"]) == pytest.approx(-logp[:, 3].mean(), rel=1e-4)


def test_lenet_from_file(tmp_path):
    path = tmp_path / "lenet.prototxt"
    path.write_text(str(lenet(2)))
    net = Net(str(path), caffe.TEST)
    assert net.outputs == ["loss"]
    assert list(net.params) == ["conv1", "conv2", "ip1", "ip2"]


def test_anonymous_names():
    proto = anon_lenet(2)
    assert [lp.name for lp in proto.layer] == [
        "DummyData1", "Convolution1", "Pooling1", "InnerProduct1", "ReLU1", "SoftmaxWithLoss1"
    ]
    assert list(proto.layer[0].top) == ["DummyData1", "DummyData2"]
    assert list(proto.layer[5].bottom) == ["InnerProduct1", "DummyData2"]
    assert list(proto.layer[4].top) == ["InnerProduct1"]
    net = Net(_roundtrip(proto), caffe.TRAIN)
    assert float(net.forward()["SoftmaxWithLoss1"]) == pytest.approx(np.log(10), rel=1e-5)


def test_silent_layer_ntop_zero():
    n = NetSpec()
    n.data, n.data2 = L.DummyData(shape=dict(dim=[3]), ntop=2)
    n.silence_data = L.Silence(n.data, ntop=0)
    n.silence_data2 = L.Silence(n.data2, ntop=0)
    proto = n.to_proto()
    assert [lp.name for lp in proto.layer] == ["data", "silence_data", "silence_data2"]
    assert list(proto.layer[1].top) == []
    net = Net(_roundtrip(proto), caffe.TEST)
    assert net.outputs == []


def test_layer_level_fields_and_include():
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3]))
    n.ip = L.InnerProduct(
        n.data, num_output=2, loss_weight=0.5, include=dict(phase=caffe.TRAIN), propagate_down=[True],
        param=[dict(name="shared_w", decay_mult=0)],
    )
    proto = n.to_proto()
    ip = proto.layer[1]
    assert list(ip.loss_weight) == [0.5]
    assert len(ip.include) == 1 and ip.include[0].phase == caffe_pb2.TRAIN
    assert list(ip.propagate_down) == [True]
    assert ip.param[0].name == "shared_w" and ip.param[0].decay_mult == 0
    assert proto.layer[0].input_param.shape[0].dim == [2, 3]
    assert _roundtrip(proto) == proto


def test_explicit_param_messages_and_python_layer():
    n = NetSpec()
    n.data = L.Input(input_param=dict(shape=dict(dim=[1, 2])))
    n.py = L.Python(n.data, module="my_mod", layer="MyLayer", param_str="{'k': 1}")
    n.deconv = L.Deconvolution(n.data, convolution_param=dict(num_output=3, kernel_size=2))
    proto = n.to_proto()
    assert proto.layer[0].input_param.shape[0].dim == [1, 2]
    py = proto.layer[1].python_param
    assert (py.module, py.layer, py.param_str) == ("my_mod", "MyLayer", "{'k': 1}")
    assert proto.layer[2].convolution_param.num_output == 3
    assert _roundtrip(proto) == proto


def test_top_to_proto_and_module_to_proto():
    data = L.Input(shape=dict(dim=[1, 4]))
    ip = L.InnerProduct(data, num_output=3)
    a = ip.to_proto()
    b = to_proto(ip)
    assert a == b
    assert [lp.type for lp in a.layer] == ["Input", "InnerProduct"]


def test_shared_input_emitted_once():
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3]))
    n.a = L.ReLU(n.data)
    n.b = L.Sigmoid(n.data)
    n.c = L.Eltwise(n.a, n.b, operation=P.Eltwise.SUM)
    proto = n.to_proto()
    assert [lp.name for lp in proto.layer] == ["data", "a", "b", "c"]
    assert proto.layer[3].eltwise_param.operation == caffe_pb2.EltwiseParameter.SUM
    net = Net(_roundtrip(proto), caffe.TEST)
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    out = net.forward(data=x)["c"]
    np.testing.assert_allclose(out, np.maximum(x, 0) + 1 / (1 + np.exp(-x)), rtol=1e-5)


def test_params_enum_access_and_errors():
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX
    assert P.Pooling.AVE == caffe_pb2.PoolingParameter.AVE
    assert P.Eltwise.PROD == caffe_pb2.EltwiseParameter.PROD
    with pytest.raises(AttributeError):
        getattr(P.Pooling, "NOT_A_METHOD")  # noqa: B009
    with pytest.raises(AttributeError):
        getattr(P, "NoSuchLayer")  # noqa: B009
    with pytest.raises(AttributeError, match="no_such_field"):
        L.InnerProduct(L.Input(shape=dict(dim=[1])), no_such_field=3).to_proto()
    with pytest.raises(TypeError, match=r"^ReLU input 0 is not a Top \(type is <class 'str'>\)$"):
        L.ReLU("data")


def test_netspec_item_access_and_keys():
    n = NetSpec()
    n["data"] = L.Input(shape=dict(dim=[1]))
    n.relu = L.ReLU(n["data"])
    assert n.keys() == ["data", "relu"]
    assert n.vals() == [n.data, n.relu]
    with pytest.raises(AttributeError):
        getattr(n, "missing")  # noqa: B009


def test_param_name_dict_and_assign_proto():
    d = param_name_dict()
    assert d["Convolution"] == "convolution"
    assert d["InnerProduct"] == "inner_product"
    assert d["Python"] == "python"
    lp = caffe_pb2.LayerParameter()
    assign_proto(lp, "top", "x")
    assign_proto(lp, "convolution_param", dict(pad=[1, 2], bias_filler=dict(type="constant", value=0.5)))
    assert list(lp.top) == ["x"]
    assert list(lp.convolution_param.pad) == [1, 2]
    assert lp.convolution_param.bias_filler.value == 0.5


def test_layers_and_params_modules_are_net_spec_factories():
    """``import pycaffe_lite.layers as L`` and ``from pycaffe_lite import layers as L, params as P``
    both give net_spec's factories, as pycaffe's ``caffe.layers`` / ``caffe.params`` do."""
    import pycaffe_lite.layers as L1

    import pycaffe_lite.params as P1
    from pycaffe_lite import layers as L2
    from pycaffe_lite import params as P2

    assert L1 is L2 is caffe.layers and P1 is P2 is caffe.params
    for lay, par in ((L1, P1), (caffe.layers, caffe.params)):
        x = lay.Input(shape=dict(dim=[1, 1, 4, 4]))
        top = lay.Pooling(lay.Convolution(x, num_output=2, kernel_size=3), pool=par.Pooling.AVE, kernel_size=2)
        assert isinstance(top, Top)
        proto = top.to_proto()
        assert [lp.type for lp in proto.layer] == ["Input", "Convolution", "Pooling"]
        assert proto.layer[2].pooling_param.pool == caffe_pb2.PoolingParameter.AVE
    # lower-case names are the layer modules of the same package, never factories
    assert L1.relu.__name__ == "pycaffe_lite.layers.relu"
    with pytest.raises(AttributeError, match="no_such_module"):
        _ = L1.no_such_module
    with pytest.raises(AttributeError, match="NoSuch"):
        _ = P1.NoSuch.MAX


def test_builtin_layer_modules_live_under_their_own_name():
    import pycaffe_lite.layers.relu as relu_module

    assert relu_module.__name__ == "pycaffe_lite.layers.relu"
    # one name: the top-level layers/ folder is the package caffe.layers, also from a source checkout
    assert Path(caffe.layers.__path__[0]).resolve() == Path(__file__).resolve().parents[2] / "layers"
