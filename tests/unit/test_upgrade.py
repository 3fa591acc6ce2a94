"""Upgrading old net definitions and weights as Caffe does: V1 and V0 prototxts, V1 .caffemodels,
data transformation fields, BatchNorm param specs."""

import logging

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.proto import protoio, upgrade
from pycaffe_lite.schema import caffe_pb2

V1_LENET = """
name: "LeNet"
input: "data"
input_dim: 2 input_dim: 1 input_dim: 28 input_dim: 28
input: "label"
input_dim: 2 input_dim: 1 input_dim: 1 input_dim: 1
layers {
  name: "conv1" type: CONVOLUTION bottom: "data" top: "conv1"
  blobs_lr: 1 blobs_lr: 2
  convolution_param { num_output: 20 kernel_size: 5 stride: 1
    weight_filler { type: "xavier" } bias_filler { type: "constant" } }
}
layers { name: "pool1" type: POOLING bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers {
  name: "conv2" type: CONVOLUTION bottom: "pool1" top: "conv2"
  blobs_lr: 1 blobs_lr: 2
  convolution_param { num_output: 50 kernel_size: 5 stride: 1
    weight_filler { type: "xavier" } bias_filler { type: "constant" } }
}
layers { name: "pool2" type: POOLING bottom: "conv2" top: "pool2"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers {
  name: "ip1" type: INNER_PRODUCT bottom: "pool2" top: "ip1"
  blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } bias_filler { type: "constant" } }
}
layers { name: "relu1" type: RELU bottom: "ip1" top: "ip1" }
layers {
  name: "ip2" type: INNER_PRODUCT bottom: "ip1" top: "ip2"
  blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } bias_filler { type: "constant" } }
}
layers { name: "accuracy" type: ACCURACY bottom: "ip2" bottom: "label" top: "accuracy"
  include: { phase: TEST } }
layers { name: "loss" type: SOFTMAX_LOSS bottom: "ip2" bottom: "label" top: "loss" }
"""

V2_LENET = """
name: "LeNet"
layer { name: "input" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 2 dim: 1 dim: 28 dim: 28 } shape { dim: 2 dim: 1 dim: 1 dim: 1 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 20 kernel_size: 5 stride: 1
    weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 50 kernel_size: 5 stride: 1
    weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "accuracy" type: "Accuracy" bottom: "ip2" bottom: "label" top: "accuracy"
  include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def parse(text):
    return protoio.parse_text(text, caffe_pb2.NetParameter(), "<test>")


def test_v1_lenet_matches_v2(tmp_path, caplog):
    v1_file = write(tmp_path, "lenet_v1.prototxt", V1_LENET)
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        old = caffe.Net(v1_file, caffe.TRAIN)
    assert any("V1LayerParameter" in r.getMessage() and v1_file in r.getMessage() for r in caplog.records)
    new = caffe.Net(write(tmp_path, "lenet_v2.prototxt", V2_LENET), caffe.TRAIN)
    assert list(old.params) == list(new.params) == ["conv1", "conv2", "ip1", "ip2"]
    for name in new.params:
        assert [b.shape for b in old.params[name]] == [b.shape for b in new.params[name]]
    assert old.params_lr == new.params_lr == [1, 2, 1, 2, 1, 2, 1, 2]
    assert old.params_weight_decay == new.params_weight_decay == [1, 1, 1, 1, 1, 0, 1, 0]
    assert "accuracy" not in old.blobs  # include { phase: TEST } survived the upgrade
    assert "accuracy" in caffe.Net(v1_file, caffe.TEST).blobs
    x = np.random.default_rng(0).standard_normal((2, 1, 28, 28))
    for name in new.params:
        for a, b in zip(old.params[name], new.params[name]):
            b.data[...] = a.data
    old.blobs["data"].data[...] = new.blobs["data"].data[...] = x
    old.blobs["label"].data[...] = new.blobs["label"].data[...] = [[[[3]]], [[[7]]]]
    assert old.forward()["loss"] == pytest.approx(float(new.forward()["loss"]))


def test_v1_caffemodel_loads_into_v2_net(tmp_path, caplog):
    net = caffe.Net(write(tmp_path, "lenet_v2.prototxt", V2_LENET), caffe.TEST)
    rng = np.random.default_rng(1)
    model = caffe_pb2.NetParameter(name="LeNet")
    expected = {}
    for name, blobs in net.params.items():
        v1 = model.layers.add(name=name, type=caffe_pb2.V1LayerParameter.CONVOLUTION if name.startswith("conv")
                              else caffe_pb2.V1LayerParameter.INNER_PRODUCT)
        v1.blobs_lr.extend([1, 2])
        expected[name] = []
        for blob in blobs:
            values = rng.standard_normal(blob.shape).astype(np.float32)
            expected[name].append(values)
            proto = v1.blobs.add()
            legacy = (1,) * (4 - len(blob.shape)) + blob.shape  # old files: num/channels/height/width
            proto.num, proto.channels, proto.height, proto.width = legacy
            proto.data.extend(values.ravel().tolist())
    model.layers.add(name="relu1", type=caffe_pb2.V1LayerParameter.RELU)
    path = tmp_path / "lenet_v1.caffemodel"
    path.write_bytes(model.SerializeToString())
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        net.copy_from(str(path))
    assert any(str(path) in r.getMessage() for r in caplog.records)
    for name, values in expected.items():
        for blob, v in zip(net.params[name], values):
            np.testing.assert_array_equal(blob.data, v)


def test_v1_param_names_share_modes_and_loss_weight():
    param = parse("""
    layers { name: "a" type: INNER_PRODUCT bottom: "x" top: "y" param: "w" param: "b"
             blob_share_mode: PERMISSIVE blobs_lr: 0.5 weight_decay: 3 loss_weight: 2
             exclude { phase: TRAIN stage: "deploy" } inner_product_param { num_output: 3 } }
    layers { name: "t" type: THRESHOLD bottom: "y" top: "z" threshold_param { threshold: 0.25 }
             transform_param { scale: 0.5 } }
    """)
    assert upgrade.upgrade_net(param, "mem") is True
    assert len(param.layers) == 0 and len(param.layer) == 2
    a, t = param.layer
    assert a.type == "InnerProduct" and t.type == "Threshold"
    assert [s.name for s in a.param] == ["w", "b"]
    assert a.param[0].share_mode == caffe_pb2.ParamSpec.PERMISSIVE
    assert a.param[0].lr_mult == 0.5 and a.param[0].decay_mult == 3
    assert not a.param[1].HasField("lr_mult")
    assert list(a.loss_weight) == [2]
    assert a.exclude[0].phase == caffe_pb2.TRAIN and list(a.exclude[0].stage) == ["deploy"]
    assert a.inner_product_param.num_output == 3
    assert t.threshold_param.threshold == 0.25 and t.transform_param.scale == 0.5


@pytest.mark.parametrize("v1_type,sub", [("DATA", "data_param"), ("IMAGE_DATA", "image_data_param"),
                                         ("WINDOW_DATA", "window_data_param")])
def test_transform_fields_move(v1_type, sub, caplog):
    param = parse(f"""
    layers {{ name: "d" type: {v1_type} top: "data" top: "label"
              {sub} {{ source: "src" batch_size: 4 scale: 0.00390625 mean_file: "m.binaryproto"
                       crop_size: 24 mirror: true }} }}""")
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        upgrade.upgrade_net(param, "old.prototxt")
    assert any("transform_param" in r.getMessage() and "old.prototxt" in r.getMessage() for r in caplog.records)
    layer = param.layer[0]
    tp = layer.transform_param
    assert (tp.scale, tp.mean_file, tp.crop_size, tp.mirror) == (0.00390625, "m.binaryproto", 24, True)
    data = getattr(layer, sub)
    assert data.source == "src" and data.batch_size == 4
    assert not any(data.HasField(f) for f in ("scale", "mean_file", "crop_size", "mirror"))


V0_NET = """
name: "old"
input: "data"
input_dim: 1 input_dim: 2 input_dim: 6 input_dim: 6
layers { layer { name: "pad1" type: "padding" pad: 2 } bottom: "data" top: "pad1" }
layers { layer { name: "conv1" type: "conv" num_output: 4 kernelsize: 3 stride: 1 group: 2
                 biasterm: true blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
                 weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "constant" value: 0.5 } }
         bottom: "pad1" top: "conv1" }
layers { layer { name: "relu1" type: "relu" } bottom: "conv1" top: "conv1" }
layers { layer { name: "pool1" type: "pool" pool: AVE kernelsize: 2 stride: 2 } bottom: "conv1" top: "pool1" }
layers { layer { name: "norm1" type: "lrn" local_size: 3 alpha: 0.0001 beta: 0.75 } bottom: "pool1" top: "norm1" }
layers { layer { name: "fc" type: "innerproduct" num_output: 5 } bottom: "norm1" top: "fc" }
layers { layer { name: "drop" type: "dropout" dropout_ratio: 0.3 } bottom: "fc" top: "fc" }
layers { layer { name: "prob" type: "softmax" } bottom: "fc" top: "prob" }
"""


def test_v0_net_upgrade(tmp_path, caplog):
    param = parse(V0_NET)
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        assert upgrade.upgrade_net(param, "v0.prototxt") is True
    assert any("V0LayerParameter" in r.getMessage() for r in caplog.records)
    names = [layer.name for layer in param.layer]
    assert names == ["input", "conv1", "relu1", "pool1", "norm1", "fc", "drop", "prob"]  # padding folded
    conv = param.layer[1]
    assert conv.type == "Convolution" and list(conv.bottom) == ["data"]
    cp = conv.convolution_param
    assert (cp.num_output, list(cp.kernel_size), list(cp.stride), list(cp.pad), cp.group) == (4, [3], [1], [2], 2)
    assert cp.weight_filler.std == pytest.approx(0.1) and cp.bias_filler.value == 0.5
    assert [(s.lr_mult, s.decay_mult) for s in conv.param] == [(1, 1), (2, 0)]
    pool = param.layer[3].pooling_param
    assert param.layer[3].type == "Pooling" and pool.pool == caffe_pb2.PoolingParameter.AVE
    assert (pool.kernel_size, pool.stride) == (2, 2)
    assert param.layer[4].type == "LRN" and param.layer[4].lrn_param.local_size == 3
    assert param.layer[5].inner_product_param.num_output == 5
    assert param.layer[6].dropout_param.dropout_ratio == pytest.approx(0.3)
    net = caffe.Net(write(tmp_path, "v0.prototxt", V0_NET), caffe.TEST)
    assert net.blobs["conv1"].data.shape == (1, 4, 8, 8)  # 6 + 2·2 - 3 + 1: the pad was applied
    assert net.params["conv1"][0].data.shape == (4, 1, 3, 3)
    assert net.blobs["prob"].data.shape == (1, 5)


def test_v0_data_layer_fields():
    param = parse("""
    layers { layer { name: "d" type: "data" source: "train_lmdb" batchsize: 64 scale: 0.5
                     meanfile: "mean.binaryproto" cropsize: 227 mirror: true rand_skip: 10 }
             top: "data" top: "label" }""")
    upgrade.upgrade_net(param, "v0")
    d = param.layer[0]
    assert d.type == "Data"
    assert (d.data_param.source, d.data_param.batch_size, d.data_param.rand_skip) == ("train_lmdb", 64, 10)
    tp = d.transform_param
    assert (tp.scale, tp.mean_file, tp.crop_size, tp.mirror) == (0.5, "mean.binaryproto", 227, True)


def test_v0_incompatible_field_is_reported(caplog):
    param = parse('input: "x" input_dim: 1 input_dim: 1 input_dim: 1 input_dim: 1 layers { layer { name: "r" type: "relu" num_output: 3 } bottom: "x" top: "y" }')
    with caplog.at_level(logging.ERROR, logger="pycaffe_lite"):
        assert upgrade.upgrade_net(param, "v0") is False
    assert any("num_output" in r.getMessage() for r in caplog.records)
    assert param.layer[-1].type == "ReLU"


def test_v0_errors():
    with pytest.raises(caffe.NetError, match="unknown type 'magic'"):
        upgrade.upgrade_net(parse('layers { layer { name: "m" type: "magic" } }'), "v0")
    bad_pad = parse("""input: "x"
        layers { layer { name: "p" type: "padding" pad: 1 } bottom: "x" top: "px" }
        layers { layer { name: "r" type: "relu" } bottom: "px" top: "y" }""")
    with pytest.raises(caffe.NetError, match="only conv and pool"):
        upgrade.upgrade_net(bad_pad, "v0")


def test_batch_norm_param_specs_upgraded(tmp_path):
    text = """
    layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
    layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y"
            param { lr_mult: 1 name: "m" } param { lr_mult: 1 decay_mult: 2 } param { lr_mult: 1 } }
    """
    param = parse(text)
    assert upgrade.net_needs_upgrade(param)
    upgrade.upgrade_net(param, "bn")
    assert [(s.lr_mult, s.decay_mult) for s in param.layer[1].param] == [(0, 0)] * 3
    assert param.layer[1].param[0].name == "m"  # names (sharing) are kept
    net = caffe.Net(write(tmp_path, "bn.prototxt", text), caffe.TRAIN)
    assert net.params_lr == [0, 0, 0] and net.params_weight_decay == [0, 0, 0]


def test_current_net_untouched(caplog):
    param = parse(V2_LENET)
    before = param.SerializeToString()
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        assert upgrade.upgrade_net(param, "new") is True
    assert param.SerializeToString() == before
    assert not caplog.records


def test_v0_hdf5_output_layer_upgrades(caplog):
    """A V0 hdf5_output layer keeps its hdf5_output_param (was a raw KeyError); on another type
    the field is reported and dropped, as BVLC does."""
    param = parse("""input: "a" input_dim: 1 input_dim: 1 input_dim: 1 input_dim: 1
        input: "b" input_dim: 1 input_dim: 1 input_dim: 1 input_dim: 1
        layers { layer { name: "o" type: "hdf5_output" hdf5_output_param { file_name: "out.h5" } }
                 bottom: "a" bottom: "b" }""")
    assert upgrade.upgrade_net(param, "v0") is True
    out = param.layer[-1]
    assert (out.type, out.hdf5_output_param.file_name, list(out.bottom)) == ("HDF5Output", "out.h5", ["a", "b"])
    wrong = parse('input: "x" input_dim: 1 input_dim: 1 input_dim: 1 input_dim: 1 layers { layer { name: "r" '
                  'type: "relu" hdf5_output_param { file_name: "o.h5" } } bottom: "x" top: "y" }')
    with caplog.at_level(logging.ERROR, logger="pycaffe_lite"):
        assert upgrade.upgrade_net(wrong, "v0") is False
    assert any("hdf5_output_param" in r.getMessage() for r in caplog.records)
