"""Tests for the Caffe protobuf schema (proto/caffe.proto) and its generated caffe_pb2."""

from __future__ import annotations

import ast
import importlib.util
import struct
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, text_format

from pycaffe_lite.schema import caffe_pb2

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO_ROOT / "proto"
FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "caffe-fixtures"

FDP = descriptor_pb2.FieldDescriptorProto
OPT, REP, REQ = FDP.LABEL_OPTIONAL, FDP.LABEL_REPEATED, FDP.LABEL_REQUIRED


def _file_proto() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto()
    caffe_pb2.DESCRIPTOR.CopyToProto(fdp)
    return fdp


def _fields() -> dict[str, dict[str, descriptor_pb2.FieldDescriptorProto]]:
    """Map 'Message' / 'Outer.Inner' -> field name -> FieldDescriptorProto."""
    out: dict[str, dict[str, descriptor_pb2.FieldDescriptorProto]] = {}

    def walk(msgs, prefix: str) -> None:
        for msg in msgs:
            name = prefix + msg.name
            out[name] = {f.name: f for f in msg.field}
            walk(msg.nested_type, name + ".")

    walk(_file_proto().message_type, "")
    return out


# --------------------------------------------------------------------------- (1) in sync
def _normalise(fdp: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """Drop what protoc adds or the runtime re-spells, so two descriptors compare by meaning.

    protoc's --descriptor_set_out fills json_name (Python gencode strips it), and
    CopyToProto may re-print float defaults (``1e-08`` as ``9.99999994e-09``).
    """
    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(fdp)
    out.ClearField("source_code_info")

    def walk(msgs) -> None:
        for msg in msgs:
            for field in msg.field:
                field.ClearField("json_name")
                if field.HasField("default_value") and field.type in (
                    FDP.TYPE_FLOAT,
                    FDP.TYPE_DOUBLE,
                ):
                    value = float(field.default_value)
                    if field.type == FDP.TYPE_FLOAT:
                        value = struct.unpack("<f", struct.pack("<f", value))[0]
                    field.default_value = repr(value)
            walk(msg.nested_type)

    walk(out.message_type)
    return out


def _compile_proto(tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpc_tools (grpcio-tools, in the 'test' extra) is not installed")
    from grpc_tools import protoc

    out = tmp_path / "caffe.desc"
    rc = protoc.main(
        [
            "protoc",
            f"--proto_path={PROTO_DIR}",
            f"--descriptor_set_out={out}",
            str(PROTO_DIR / "caffe.proto"),
        ]
    )
    assert rc == 0, "protoc failed to compile proto/caffe.proto"
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    assert len(fds.file) == 1
    return fds.file[0]


def test_caffe_pb2_in_sync_with_proto(tmp_path: Path) -> None:
    fresh = _normalise(_compile_proto(tmp_path))
    ours = _normalise(_file_proto())

    assert ours.name == fresh.name
    assert ours.package == fresh.package == "caffe"
    assert list(ours.enum_type) == list(fresh.enum_type)
    ours_msgs = {m.name: m for m in ours.message_type}
    fresh_msgs = {m.name: m for m in fresh.message_type}
    assert sorted(ours_msgs) == sorted(fresh_msgs), "message set differs: run tools/gen_proto.py"
    stale = [n for n in fresh_msgs if ours_msgs[n] != fresh_msgs[n]]
    assert not stale, f"caffe_pb2 is stale for {stale}: run tools/gen_proto.py"
    assert ours == fresh, "caffe_pb2 is stale: run tools/gen_proto.py"


def _embedded_descriptor_bytes() -> bytes:
    """The serialized FileDescriptorProto literal that protoc wrote into caffe_pb2.py."""
    tree = ast.parse(Path(caffe_pb2.__file__).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
        ):
            value = ast.literal_eval(node.args[0])
            assert isinstance(value, bytes)
            return value
    raise AssertionError("no AddSerializedFile(...) call in caffe_pb2.py")


def test_embedded_descriptor_matches_proto_exactly(tmp_path: Path) -> None:
    """The bytes protoc embedded in caffe_pb2.py equal a fresh compile, json_name aside."""
    fresh = _compile_proto(tmp_path)
    embedded = descriptor_pb2.FileDescriptorProto.FromString(_embedded_descriptor_bytes())

    def strip(fdp: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
        def walk(msgs) -> None:
            for msg in msgs:
                for field in msg.field:
                    field.ClearField("json_name")
                walk(msg.nested_type)

        walk(fdp.message_type)
        fdp.ClearField("source_code_info")
        return fdp

    assert strip(embedded) == strip(fresh), "caffe_pb2 is stale: run tools/gen_proto.py"


def test_generated_runtime_check_accepts_protobuf_6_31() -> None:
    """The gencode must not demand a runtime newer than the declared protobuf>=6.31."""
    src = Path(caffe_pb2.__file__).read_text(encoding="utf-8")
    marker = "ValidateProtobufRuntimeVersion("
    assert marker in src
    args = src.split(marker, 1)[1].split(")", 1)[0].replace("\n", " ").split(",")
    major, minor = int(args[1]), int(args[2])
    assert (major, minor) <= (6, 31)


# --------------------------------------------------------------------------- (2) BVLC numbers
# (message, field, number, label, type) as in BVLC Caffe's caffe.proto.
BVLC_FIELDS = [
    ("BlobShape", "dim", 1, REP, FDP.TYPE_INT64),
    ("BlobProto", "shape", 7, OPT, FDP.TYPE_MESSAGE),
    ("BlobProto", "data", 5, REP, FDP.TYPE_FLOAT),
    ("BlobProto", "diff", 6, REP, FDP.TYPE_FLOAT),
    ("BlobProto", "double_data", 8, REP, FDP.TYPE_DOUBLE),
    ("BlobProto", "num", 1, OPT, FDP.TYPE_INT32),
    ("BlobProto", "width", 4, OPT, FDP.TYPE_INT32),
    ("Datum", "data", 4, OPT, FDP.TYPE_BYTES),
    ("Datum", "label", 5, OPT, FDP.TYPE_INT32),
    ("Datum", "encoded", 7, OPT, FDP.TYPE_BOOL),
    ("NetParameter", "name", 1, OPT, FDP.TYPE_STRING),
    ("NetParameter", "layers", 2, REP, FDP.TYPE_MESSAGE),
    ("NetParameter", "input", 3, REP, FDP.TYPE_STRING),
    ("NetParameter", "input_dim", 4, REP, FDP.TYPE_INT32),
    ("NetParameter", "input_shape", 8, REP, FDP.TYPE_MESSAGE),
    ("NetParameter", "layer", 100, REP, FDP.TYPE_MESSAGE),
    ("LayerParameter", "name", 1, OPT, FDP.TYPE_STRING),
    ("LayerParameter", "type", 2, OPT, FDP.TYPE_STRING),
    ("LayerParameter", "bottom", 3, REP, FDP.TYPE_STRING),
    ("LayerParameter", "top", 4, REP, FDP.TYPE_STRING),
    ("LayerParameter", "param", 6, REP, FDP.TYPE_MESSAGE),
    ("LayerParameter", "blobs", 7, REP, FDP.TYPE_MESSAGE),
    ("LayerParameter", "phase", 10, OPT, FDP.TYPE_ENUM),
    ("LayerParameter", "transform_param", 100, OPT, FDP.TYPE_MESSAGE),
    ("LayerParameter", "convolution_param", 106, OPT, FDP.TYPE_MESSAGE),
    ("LayerParameter", "data_param", 107, OPT, FDP.TYPE_MESSAGE),
    ("LayerParameter", "inner_product_param", 117, OPT, FDP.TYPE_MESSAGE),
    ("LayerParameter", "pooling_param", 121, OPT, FDP.TYPE_MESSAGE),
    ("LayerParameter", "batch_norm_param", 139, OPT, FDP.TYPE_MESSAGE),
    ("LayerParameter", "input_param", 143, OPT, FDP.TYPE_MESSAGE),
    ("LayerParameter", "recurrent_param", 146, OPT, FDP.TYPE_MESSAGE),
    ("LayerParameter", "swish_param", 147, OPT, FDP.TYPE_MESSAGE),
    ("LayerParameter", "clip_param", 148, OPT, FDP.TYPE_MESSAGE),
    ("ConvolutionParameter", "num_output", 1, OPT, FDP.TYPE_UINT32),
    ("ConvolutionParameter", "kernel_size", 4, REP, FDP.TYPE_UINT32),
    ("ConvolutionParameter", "stride", 6, REP, FDP.TYPE_UINT32),
    ("ConvolutionParameter", "engine", 15, OPT, FDP.TYPE_ENUM),
    ("ConvolutionParameter", "dilation", 18, REP, FDP.TYPE_UINT32),
    ("PoolingParameter", "pool", 1, OPT, FDP.TYPE_ENUM),
    ("PoolingParameter", "kernel_size", 2, OPT, FDP.TYPE_UINT32),
    ("PoolingParameter", "global_pooling", 12, OPT, FDP.TYPE_BOOL),
    ("PoolingParameter", "round_mode", 13, OPT, FDP.TYPE_ENUM),
    ("ClipParameter", "min", 1, REQ, FDP.TYPE_FLOAT),
    ("ClipParameter", "max", 2, REQ, FDP.TYPE_FLOAT),
    ("SolverParameter", "train_net", 1, OPT, FDP.TYPE_STRING),
    ("SolverParameter", "test_iter", 3, REP, FDP.TYPE_INT32),
    ("SolverParameter", "base_lr", 5, OPT, FDP.TYPE_FLOAT),
    ("SolverParameter", "max_iter", 7, OPT, FDP.TYPE_INT32),
    ("SolverParameter", "lr_policy", 8, OPT, FDP.TYPE_STRING),
    ("SolverParameter", "solver_mode", 17, OPT, FDP.TYPE_ENUM),
    ("SolverParameter", "random_seed", 20, OPT, FDP.TYPE_INT64),
    ("SolverParameter", "net", 24, OPT, FDP.TYPE_STRING),
    ("SolverParameter", "solver_type", 30, OPT, FDP.TYPE_ENUM),
    ("SolverParameter", "snapshot_format", 37, OPT, FDP.TYPE_ENUM),
    ("SolverParameter", "type", 40, OPT, FDP.TYPE_STRING),
    ("SolverParameter", "layer_wise_reduce", 41, OPT, FDP.TYPE_BOOL),
    ("SolverParameter", "weights", 42, REP, FDP.TYPE_STRING),
    ("SolverState", "history", 3, REP, FDP.TYPE_MESSAGE),
    ("NetState", "phase", 1, OPT, FDP.TYPE_ENUM),
    ("ParamSpec", "lr_mult", 3, OPT, FDP.TYPE_FLOAT),
    ("ParamSpec", "decay_mult", 4, OPT, FDP.TYPE_FLOAT),
    ("V1LayerParameter", "layer", 1, OPT, FDP.TYPE_MESSAGE),
    ("V1LayerParameter", "bottom", 2, REP, FDP.TYPE_STRING),
    ("V1LayerParameter", "name", 4, OPT, FDP.TYPE_STRING),
    ("V1LayerParameter", "type", 5, OPT, FDP.TYPE_ENUM),
    ("V1LayerParameter", "blobs", 6, REP, FDP.TYPE_MESSAGE),
    ("V1LayerParameter", "blobs_lr", 7, REP, FDP.TYPE_FLOAT),
    ("V1LayerParameter", "convolution_param", 10, OPT, FDP.TYPE_MESSAGE),
    ("V1LayerParameter", "include", 32, REP, FDP.TYPE_MESSAGE),
    ("V1LayerParameter", "transform_param", 36, OPT, FDP.TYPE_MESSAGE),
    ("V1LayerParameter", "loss_param", 42, OPT, FDP.TYPE_MESSAGE),
    ("V1LayerParameter", "param", 1001, REP, FDP.TYPE_STRING),
    ("V1LayerParameter", "blob_share_mode", 1002, REP, FDP.TYPE_ENUM),
    ("V0LayerParameter", "kernelsize", 8, OPT, FDP.TYPE_UINT32),
    ("V0LayerParameter", "blobs", 50, REP, FDP.TYPE_MESSAGE),
    ("V0LayerParameter", "hdf5_output_param", 1001, OPT, FDP.TYPE_MESSAGE),
]


@pytest.mark.parametrize(("msg", "field", "number", "label", "ftype"), BVLC_FIELDS)
def test_bvlc_field_numbers(msg: str, field: str, number: int, label: int, ftype: int) -> None:
    fd = _fields()[msg][field]
    assert fd.number == number
    assert fd.label == label
    assert fd.type == ftype


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        ("BlobShape", "dim"),
        ("BlobProto", "data"),
        ("BlobProto", "diff"),
        ("BlobProto", "double_data"),
        ("BlobProto", "double_diff"),
    ],
)
def test_packed_fields(msg: str, field: str) -> None:
    fd = _fields()[msg][field]
    assert fd.options.packed is True


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        ("Datum", "float_data"),
        ("ConvolutionParameter", "kernel_size"),
        ("SolverParameter", "test_iter"),
    ],
)
def test_unpacked_fields(msg: str, field: str) -> None:
    assert not _fields()[msg][field].options.HasField("packed")


@pytest.mark.parametrize(
    ("msg", "field", "default"),
    [
        ("PoolingParameter", "pool", "MAX"),
        ("PoolingParameter", "stride", "1"),
        ("PoolingParameter", "round_mode", "CEIL"),
        ("ConvolutionParameter", "bias_term", "true"),
        ("ConvolutionParameter", "group", "1"),
        ("ConvolutionParameter", "engine", "DEFAULT"),
        ("FillerParameter", "type", "constant"),
        ("FillerParameter", "std", "1"),
        ("FillerParameter", "sparse", "-1"),
        ("NetState", "phase", "TEST"),
        ("SolverParameter", "type", "SGD"),
        ("SolverParameter", "solver_mode", "GPU"),
        ("SolverParameter", "snapshot_format", "BINARYPROTO"),
        ("SolverParameter", "delta", "1e-08"),
        ("SolverParameter", "momentum2", "0.999"),
        ("SolverParameter", "random_seed", "-1"),
        ("LossParameter", "normalization", "VALID"),
        ("LRNParameter", "beta", "0.75"),
        ("DataParameter", "prefetch", "4"),
        ("BatchNormParameter", "eps", "1e-05"),
        ("V0LayerParameter", "det_crop_mode", "warp"),
    ],
)
def test_bvlc_defaults(msg: str, field: str, default: str) -> None:
    fd = _fields()[msg][field]
    if fd.type in (FDP.TYPE_FLOAT, FDP.TYPE_DOUBLE):
        assert float(fd.default_value) == pytest.approx(float(default), rel=1e-6)
    else:
        assert fd.default_value == default


def test_enum_values() -> None:
    assert caffe_pb2.TRAIN == 0 and caffe_pb2.TEST == 1
    assert caffe_pb2.PoolingParameter.MAX == 0
    assert caffe_pb2.PoolingParameter.STOCHASTIC == 2
    assert caffe_pb2.ConvolutionParameter.CUDNN == 2
    assert caffe_pb2.DataParameter.LMDB == 1
    assert caffe_pb2.V1LayerParameter.CONVOLUTION == 4
    assert caffe_pb2.V1LayerParameter.SOFTMAX_LOSS == 21
    assert caffe_pb2.V1LayerParameter.DECONVOLUTION == 39
    assert caffe_pb2.ParamSpec.PERMISSIVE == 1
    assert caffe_pb2.SolverParameter.ADAM == 5
    assert caffe_pb2.LossParameter.NONE == 3
    assert caffe_pb2.HingeLossParameter.L1 == 1


def test_runtime_defaults() -> None:
    assert caffe_pb2.PoolingParameter().pool == caffe_pb2.PoolingParameter.MAX
    assert caffe_pb2.SolverParameter().type == "SGD"
    assert caffe_pb2.NetState().phase == caffe_pb2.TEST
    assert caffe_pb2.ParamSpec().lr_mult == 1.0


# --------------------------------------------------------------------------- text format
LENET_TEXT = """
name: "LeNet"
input: "data"
input_shape { dim: 1 dim: 1 dim: 28 dim: 28 }
layer {
  name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param {
    num_output: 20 kernel_size: 5 stride: 1
    weight_filler { type: "xavier" } bias_filler { type: "constant" }
  }
}
layer {
  name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 }
}
layer {
  name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } }
  include { phase: TRAIN }
}
"""


def test_parse_text_lenet() -> None:
    net = text_format.Parse(LENET_TEXT, caffe_pb2.NetParameter())
    assert [layer.name for layer in net.layer] == ["conv1", "pool1", "ip1"]
    conv = net.layer[0].convolution_param
    assert conv.num_output == 20 and list(conv.kernel_size) == [5]
    assert conv.weight_filler.type == "xavier"
    assert [p.lr_mult for p in net.layer[0].param] == [1.0, 2.0]
    assert net.layer[1].pooling_param.pool == caffe_pb2.PoolingParameter.MAX
    assert net.layer[2].include[0].phase == caffe_pb2.TRAIN
    assert list(net.input_shape[0].dim) == [1, 1, 28, 28]
    again = text_format.Parse(text_format.MessageToString(net), caffe_pb2.NetParameter())
    assert again == net


def test_parse_v1_text() -> None:
    text = """
    name: "old"
    layers {
      name: "conv1" type: CONVOLUTION bottom: "data" top: "conv1"
      blobs_lr: 1 blobs_lr: 2
      convolution_param { num_output: 4 kernel_size: 3 }
    }
    """
    net = text_format.Parse(text, caffe_pb2.NetParameter())
    layer = net.layers[0]
    assert layer.type == caffe_pb2.V1LayerParameter.CONVOLUTION
    assert list(layer.blobs_lr) == [1.0, 2.0]
    assert list(layer.convolution_param.kernel_size) == [3]


def test_unknown_text_field_rejected() -> None:
    with pytest.raises(text_format.ParseError):
        text_format.Parse("layer { no_such_field: 1 }", caffe_pb2.NetParameter())


def test_blob_wire_roundtrip() -> None:
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([2, 3])
    blob.data.extend([float(i) for i in range(6)])
    raw = blob.SerializeToString()
    # data is field 5, packed: one length-delimited record of 6 floats (24 bytes);
    # shape is field 7, length-delimited.
    assert raw.startswith(bytes([(5 << 3) | 2, 24]))
    assert bytes([(7 << 3) | 2]) in raw[26:]
    back = caffe_pb2.BlobProto.FromString(raw)
    assert list(back.shape.dim) == [2, 3] and list(back.data) == list(range(6))


# --------------------------------------------------------------------------- (3) BVLC artifacts
def _fixture(name: str) -> Path:
    path = FIXTURES / name
    if not path.is_file():
        pytest.skip(f"fixture {path} not present")
    return path


def test_read_bvlc_caffemodel() -> None:
    raw = _fixture("lenet_iter_10000.caffemodel").read_bytes()
    net = caffe_pb2.NetParameter.FromString(raw)
    assert net.name == "LeNet"
    assert len(net.layers) == 0
    names = [layer.name for layer in net.layer]
    for expected in ("conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2"):
        assert expected in names
    shapes = {layer.name: [tuple(b.shape.dim) for b in layer.blobs] for layer in net.layer}
    assert shapes["conv1"] == [(20, 1, 5, 5), (20,)]
    assert shapes["conv2"] == [(50, 20, 5, 5), (50,)]
    assert shapes["ip1"] == [(500, 800), (500,)]
    assert shapes["ip2"] == [(10, 500), (10,)]
    assert shapes["pool1"] == []
    by_name = {layer.name: layer for layer in net.layer}
    conv1 = by_name["conv1"]
    assert conv1.type == "Convolution"
    assert conv1.convolution_param.num_output == 20
    assert len(conv1.blobs[0].data) == 20 * 1 * 5 * 5
    assert by_name["pool1"].pooling_param.pool == caffe_pb2.PoolingParameter.MAX
    assert all(abs(v) < 10 for v in conv1.blobs[0].data)
    # Every byte is understood by the schema: re-serialising reproduces the file.
    assert net.SerializeToString() == raw


def test_parse_bvlc_deploy_prototxt() -> None:
    text = _fixture("lenet.prototxt").read_text(encoding="utf-8")
    net = text_format.Parse(text, caffe_pb2.NetParameter())
    assert net.name == "LeNet"
    assert net.layer[0].type == "Input"
    assert list(net.layer[0].input_param.shape[0].dim) == [64, 1, 28, 28]
    assert net.layer[-1].type == "Softmax"
    assert [layer.name for layer in net.layer if layer.type == "Convolution"] == ["conv1", "conv2"]
