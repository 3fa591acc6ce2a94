"""The precision fields of the schema (NVCaffe 0.17's, docs/precision.md): their numbers, the
text form NVCaffe's prototxts use, and NVCaffe-written binary nets whose layers carry the types on
NVCaffe's numbers 145-148 (BVLC's parameter_param, recurrent_param, swish_param, clip_param)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format, unknown_fields

import pycaffe_lite as caffe
from pycaffe_lite.errors import PrototxtError
from pycaffe_lite.proto import caffe_pb2, nvcaffe, protoio

FDP_ENUM = 14  # FieldDescriptor.TYPE_ENUM


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


@pytest.mark.parametrize(("message", "field", "number"), [
    ("NetParameter", "default_forward_type", 11),
    ("NetParameter", "default_backward_type", 12),
    ("NetParameter", "default_forward_math", 13),
    ("NetParameter", "default_backward_math", 14),
    ("SolverParameter", "store_blobs_in_old_format", 45),
    ("BlobProto", "raw_data_type", 10),
    ("BlobProto", "raw_diff_type", 11),
    ("BlobProto", "raw_data", 12),
    ("BlobProto", "raw_diff", 13),
    # NVCaffe's numbers are taken by BVLC's (145-148) and the SSD fork's (44) fields: ours.
    ("LayerParameter", "forward_type", 9700),
    ("LayerParameter", "backward_type", 9701),
    ("LayerParameter", "forward_math", 9702),
    ("LayerParameter", "backward_math", 9703),
    ("SolverParameter", "solver_data_type", 9704),
])
def test_field_numbers(message: str, field: str, number: int) -> None:
    fd = getattr(caffe_pb2, message).DESCRIPTOR.fields_by_name[field]
    assert fd.number == number


def test_colliding_numbers_keep_bvlc_and_fork_fields() -> None:
    by_number = caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_number
    assert [by_number[n].name for n in (145, 146, 147, 148)] == [
        "parameter_param", "recurrent_param", "swish_param", "clip_param"]
    assert caffe_pb2.SolverParameter.DESCRIPTOR.fields_by_number[44].name == "show_per_class_result"


def test_type_enum_and_defaults() -> None:
    assert [(v.name, v.number) for v in caffe_pb2.Type.DESCRIPTOR.values] == [
        ("DOUBLE", 0), ("FLOAT", 1), ("FLOAT16", 2), ("INT", 3), ("UINT", 4), ("BOOL", 5), ("BFLOAT16", 6)]
    net = caffe_pb2.NetParameter()
    assert (net.default_forward_type, net.default_backward_math) == (caffe_pb2.FLOAT, caffe_pb2.FLOAT)
    assert net.global_grad_scale == 1.0 and not net.global_grad_scale_adaptive
    layer = caffe_pb2.LayerParameter()
    assert layer.forward_type == caffe_pb2.FLOAT and not layer.HasField("forward_type")
    solver = caffe_pb2.SolverParameter()
    assert solver.solver_data_type == caffe_pb2.FLOAT and not solver.store_blobs_in_old_format
    for message, name in (("NetParameter", "default_forward_type"), ("LayerParameter", "backward_math"),
                          ("SolverParameter", "solver_data_type"), ("BlobProto", "raw_data_type")):
        fd = getattr(caffe_pb2, message).DESCRIPTOR.fields_by_name[name]
        assert fd.type == FDP_ENUM and fd.enum_type.full_name == "caffe.Type"


NVCAFFE_TEXT = """
name: "fp16net"
default_forward_type: FLOAT16
default_backward_type: FLOAT16
default_forward_math: FLOAT
global_grad_scale: 256
global_grad_scale_adaptive: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" forward_type: FLOAT
        backward_type: BFLOAT16 forward_math: DOUBLE backward_math: FLOAT
        inner_product_param { num_output: 2 } }
"""


def test_nvcaffe_text_fields_parse() -> None:
    net = text_format.Parse(NVCAFFE_TEXT, caffe_pb2.NetParameter())
    assert net.default_forward_type == caffe_pb2.FLOAT16 and net.default_backward_type == caffe_pb2.FLOAT16
    assert net.default_forward_math == caffe_pb2.FLOAT and not net.HasField("default_backward_math")
    assert net.global_grad_scale == 256.0 and net.global_grad_scale_adaptive
    ip = net.layer[1]
    assert (ip.forward_type, ip.backward_type, ip.forward_math, ip.backward_math) == (
        caffe_pb2.FLOAT, caffe_pb2.BFLOAT16, caffe_pb2.DOUBLE, caffe_pb2.FLOAT)
    solver = text_format.Parse("solver_data_type: FLOAT store_blobs_in_old_format: true",
                               caffe_pb2.SolverParameter())
    assert solver.HasField("solver_data_type") and solver.store_blobs_in_old_format


DEPLOY = """
name: "nv"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 4 } }
layer { name: "clip" type: "Clip" bottom: "ip" top: "ip" clip_param { min: -1 max: 1 } }
"""

# (field number, value) of NVCaffe's forward_type, backward_type, forward_math, backward_math.
NV_TYPES = [(145, caffe_pb2.FLOAT16), (146, caffe_pb2.FLOAT16), (147, caffe_pb2.FLOAT), (148, caffe_pb2.DOUBLE)]


def _nvcaffe_model(tmp_path: Path) -> tuple[Path, Path, np.ndarray]:
    """A deploy prototxt and a binary net as NVCaffe writes it: the InnerProduct layer carries its
    four types as varints on 145-148 (after its other fields, in number order, as C++ writes)."""
    deploy = tmp_path / "deploy.prototxt"
    deploy.write_text(DEPLOY)
    param = text_format.Parse(DEPLOY, caffe_pb2.NetParameter())
    weights = np.arange(12, dtype=np.float32).reshape(4, 3) / 8
    ip = param.layer[1]
    for values in (weights, np.linspace(-1, 1, 4, dtype=np.float32)):
        blob = ip.blobs.add()
        blob.shape.dim.extend(values.shape)
        blob.data.extend(values.ravel().tolist())
    data = _key(1, 2) + _varint(len(param.name)) + param.name.encode()
    for layer in param.layer:
        body = layer.SerializeToString()
        if layer.name == "ip":
            body += b"".join(_key(n, 0) + _varint(v) for n, v in NV_TYPES)
        data += _key(100, 2) + _varint(len(body)) + body
    model = tmp_path / "nv.caffemodel"
    model.write_bytes(data)
    return deploy, model, weights


def test_protobuf_keeps_mismatched_wire_type_as_unknown(tmp_path: Path) -> None:
    """Why the pre-pass exists: parsed as is, the varints land in neither field."""
    _, model, _ = _nvcaffe_model(tmp_path)
    net = caffe_pb2.NetParameter.FromString(model.read_bytes())
    ip = net.layer[1]
    assert not ip.HasField("parameter_param") and not ip.HasField("clip_param")
    assert not ip.HasField("forward_type")
    assert [(f.field_number, f.wire_type, f.data) for f in unknown_fields.UnknownFieldSet(ip)] == [
        (n, 0, v) for n, v in NV_TYPES]


def test_nvcaffe_binary_layer_types_load(tmp_path: Path) -> None:
    deploy, model, weights = _nvcaffe_model(tmp_path)
    net = protoio.read_binary(model, caffe_pb2.NetParameter(), "caffemodel")
    ip = net.layer[1]
    assert (ip.forward_type, ip.backward_type, ip.forward_math, ip.backward_math) == tuple(v for _, v in NV_TYPES)
    assert all(ip.HasField(f) for f in ("forward_type", "backward_type", "forward_math", "backward_math"))
    assert not ip.HasField("parameter_param") and not ip.HasField("clip_param")
    assert len(unknown_fields.UnknownFieldSet(ip)) == 0
    assert list(ip.blobs[0].data) == weights.ravel().tolist()
    # The other layers are untouched, BVLC's clip_param included.
    assert net.layer[2].clip_param.max == 1.0 and not net.layer[2].HasField("forward_type")
    # And the weights reach a net built from the deploy file.
    caffe.set_mode_cpu()
    cnet = caffe.Net(str(deploy), str(model), caffe.TEST)
    np.testing.assert_array_equal(cnet.params["ip"][0].data, weights)


def test_bvlc_bytes_are_not_rewritten() -> None:
    """A BVLC net with messages on 145-148 scans to the very same object (no copy)."""
    text = """
    layer { name: "p" type: "Parameter" top: "p" parameter_param { shape { dim: 2 } } }
    layer { name: "s" type: "Swish" bottom: "p" top: "s" swish_param { beta: 2 } }
    layer { name: "c" type: "Clip" bottom: "s" top: "c" clip_param { min: 0 max: 6 } }
    layer { name: "r" type: "RNN" bottom: "c" top: "r" recurrent_param { num_output: 3 } }
    """
    data = text_format.Parse(text, caffe_pb2.NetParameter()).SerializeToString()
    assert nvcaffe.move_layer_types(data) is data


def test_rewrite_keeps_every_other_byte() -> None:
    """The moved bytes are what our schema writes for the same layer: only the key changes."""
    layer = caffe_pb2.LayerParameter(name="conv", type="Convolution")
    layer.convolution_param.num_output = 7
    body = layer.SerializeToString() + _key(146, 0) + _varint(2)
    head, tail = _key(1, 2) + b"\x01n", _key(5, 0) + b"\x01"
    moved = nvcaffe.move_layer_types(head + _key(100, 2) + _varint(len(body)) + body + tail)
    layer.backward_type = caffe_pb2.FLOAT16
    ours = layer.SerializeToString()
    assert moved == head + _key(100, 2) + _varint(len(ours)) + ours + tail
    net = caffe_pb2.NetParameter.FromString(moved)
    assert net.layer[0].backward_type == caffe_pb2.FLOAT16 and net.force_backward


@pytest.mark.parametrize("data", [b"\xff\xff\xff", _key(100, 2) + b"\x10abc", b"hello, not a model\n"])
def test_malformed_bytes_still_a_clear_error(tmp_path: Path, data: bytes) -> None:
    assert nvcaffe.move_layer_types(data) is data
    path = tmp_path / "bad.caffemodel"
    path.write_bytes(data)
    with pytest.raises(PrototxtError, match="bad.caffemodel: corrupt or not a caffemodel"):
        protoio.read_binary(path, caffe_pb2.NetParameter(), "caffemodel")
