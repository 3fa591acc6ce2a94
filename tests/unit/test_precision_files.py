"""Half-precision files (docs/precision.md): NVCaffe's raw blobs in FLOAT16, BFLOAT16, FLOAT and
DOUBLE load into float32 and float64 blobs, means and arrays; the raw writer; bfloat16's
round-to-nearest-even conversion; an NVCaffe-style fp16 prototxt parses and runs in fp32."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import io as caffe_io
from pycaffe_lite.blob import Blob, proto_shape
from pycaffe_lite.data.transformer import load_mean_file
from pycaffe_lite.errors import DataError, PrototxtError, ShapeError, WeightsError
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import blob_values, caffe_pb2
from pycaffe_lite.solvers import sgd_solvers

FP16_EPS, BF16_EPS = 2.0 ** -11, 2.0 ** -8  # unit roundoff (half an ulp at 1) of each format


# -- bfloat16 conversion --------------------------------------------------------------------------
def _bf16_reference(x: np.float32) -> int:
    """Round one finite float32 to bfloat16 bits by comparing the two neighbours in float64."""
    u = int(np.array(x, np.float32).view(np.uint32))
    down = u >> 16
    lo = float(np.array(down << 16, np.uint32).view(np.float32))
    hi_bits = down + 1
    hi = float(np.array(hi_bits << 16, np.uint32).view(np.float32))  # may be inf: compare as float64
    if not np.isfinite(hi):
        hi = float(np.sign(lo)) * 2.0 ** 128
    d_lo, d_hi = abs(float(x) - lo), abs(hi - float(x))
    if d_lo != d_hi:
        return down if d_lo < d_hi else hi_bits
    return down if down % 2 == 0 else hi_bits


def test_bfloat16_round_trips_every_bit_pattern() -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    values = blob_values.bfloat16_to_float32(bits)
    assert values.dtype == np.float32
    nan = np.isnan(values)
    assert nan.sum() == 2 * 127  # exponent all ones, mantissa (7 bits) not zero, both signs
    back = blob_values.float32_to_bfloat16(values)
    np.testing.assert_array_equal(back[~nan], bits[~nan])
    assert np.isnan(blob_values.bfloat16_to_float32(back[nan])).all()
    np.testing.assert_array_equal(np.signbit(blob_values.bfloat16_to_float32(back[nan])), np.signbit(values[nan]))


def test_float32_to_bfloat16_rounds_to_nearest_even() -> None:
    rng = np.random.default_rng(0)
    u = rng.integers(0, 0x7F7F0000, size=4000, dtype=np.uint32)
    u[:1000] = (u[:1000] & np.uint32(0xFFFF0000)) | np.uint32(0x8000)  # exact ties
    u[1000:1100] = 0x7F7F8000 + np.arange(100, dtype=np.uint32)  # past the largest bf16
    u[2000:] |= np.uint32(0x80000000)  # negative
    x = u.view(np.float32)
    got = blob_values.float32_to_bfloat16(x)
    want = np.array([_bf16_reference(v) for v in x], np.uint32)
    want = np.where((want & 0x7FFF) >= 0x7F80, (want & 0x8000) | 0x7F80, want)  # overflow -> inf
    np.testing.assert_array_equal(got, want.astype(np.uint16))
    assert np.isinf(blob_values.bfloat16_to_float32(got[1000:1100])).all()
    assert blob_values.float32_to_bfloat16(np.float32(1 + 2 ** -8)) == 0x3F80  # tie to even: down
    assert blob_values.float32_to_bfloat16(np.float32(1 + 3 * 2 ** -8)) == 0x3F82  # tie to even: up
    specials = np.array([np.inf, -np.inf, 0.0, -0.0], np.float32)
    np.testing.assert_array_equal(blob_values.float32_to_bfloat16(specials), [0x7F80, 0xFF80, 0, 0x8000])


def test_bfloat16_conversion_agrees_with_ml_dtypes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")  # in the test extra through onnx; not a dependency
    x = np.random.default_rng(1).normal(scale=1e3, size=20000).astype(np.float32)
    x[:5] = [np.inf, -np.inf, np.nan, 3.4e38, -1e-40]
    ours = blob_values.float32_to_bfloat16(x)
    theirs = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(ours[finite], theirs[finite])


# -- reading raw blobs ----------------------------------------------------------------------------
VALUES = (np.arange(-12, 12, dtype=np.float64).reshape(2, 3, 4) / 7) ** 3 + 1 / 3


def _raw_proto(raw_type: int, values: np.ndarray = VALUES, diff: np.ndarray | None = None) -> caffe_pb2.BlobProto:
    """A BlobProto as NVCaffe writes one: shape plus raw bytes, built by hand here."""
    enc = {caffe_pb2.FLOAT16: lambda v: v.astype("<f2").tobytes(), caffe_pb2.FLOAT: lambda v: v.astype("<f4").tobytes(),
           caffe_pb2.DOUBLE: lambda v: v.astype("<f8").tobytes(),
           caffe_pb2.BFLOAT16: lambda v: blob_values.float32_to_bfloat16(v).astype("<u2").tobytes()}[raw_type]
    proto = caffe_pb2.BlobProto(raw_data_type=raw_type, raw_data=enc(values))
    proto.shape.dim.extend(values.shape)
    if diff is not None:
        proto.raw_diff_type, proto.raw_diff = raw_type, enc(diff)
    return proto


ROUNDED = {  # what each raw type keeps of VALUES
    caffe_pb2.FLOAT16: VALUES.astype(np.float16).astype(np.float64),
    caffe_pb2.BFLOAT16: blob_values.bfloat16_to_float32(blob_values.float32_to_bfloat16(VALUES)).astype(np.float64),
    caffe_pb2.FLOAT: VALUES.astype(np.float32).astype(np.float64),
    caffe_pb2.DOUBLE: VALUES,
}
TOLERANCE = {caffe_pb2.FLOAT16: FP16_EPS, caffe_pb2.BFLOAT16: BF16_EPS, caffe_pb2.FLOAT: 2.0 ** -24,
             caffe_pb2.DOUBLE: 0.0}


@pytest.mark.parametrize("raw_type", list(ROUNDED), ids=caffe_pb2.Type.Name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_raw_blob_loads(raw_type: int, dtype) -> None:
    proto = _raw_proto(raw_type, diff=-VALUES)
    assert proto_shape(proto) == (2, 3, 4)
    blob = Blob((1,), dtype)
    blob.from_proto(proto)
    assert blob.shape == (2, 3, 4) and blob.data.dtype == dtype
    np.testing.assert_array_equal(blob.data, ROUNDED[raw_type].astype(dtype))
    np.testing.assert_array_equal(blob.diff, -ROUNDED[raw_type].astype(dtype))
    np.testing.assert_allclose(blob.data, VALUES, rtol=max(TOLERANCE[raw_type], np.finfo(dtype).eps / 2), atol=0)
    np.testing.assert_array_equal(caffe_io.blobproto_to_array(proto), ROUNDED[raw_type])
    np.testing.assert_array_equal(caffe_io.blobproto_to_array(proto, return_diff=True), -ROUNDED[raw_type])


def test_raw_blob_without_shape_is_one_axis() -> None:
    proto = caffe_pb2.BlobProto(raw_data_type=caffe_pb2.FLOAT16, raw_data=np.ones(5, "<f2").tobytes())
    assert proto_shape(proto) == (5,)


def test_float_fields_come_before_raw_and_diff_is_read_on_its_own() -> None:
    """NVCaffe's order: double_data, data, raw_data; the diff from its own fields."""
    proto = _raw_proto(caffe_pb2.FLOAT16)
    proto.data.extend([7.0] * VALUES.size)
    proto.double_diff.extend([5.0] * VALUES.size)
    blob = Blob((2, 3, 4), np.float32)
    blob.from_proto(proto, reshape=False)
    assert (blob.data == 7).all() and (blob.diff == 5).all()


@pytest.mark.parametrize(("mutate", "error", "message"), [
    (lambda p: p.ClearField("raw_data_type"), PrototxtError, "w: BlobProto has raw_data but no raw_data_type"),
    (lambda p: setattr(p, "raw_data_type", caffe_pb2.INT), PrototxtError, "raw_data_type INT is not a float type"),
    (lambda p: setattr(p, "raw_data", p.raw_data[:-1]), ShapeError, "holds 47 bytes, not a whole number of FLOAT16"),
    (lambda p: setattr(p, "raw_data", p.raw_data[:-2]), ShapeError, r"holds 23 values but shape \(2, 3, 4\) needs 24"),
])
def test_bad_raw_blobs_name_the_blob(mutate, error, message) -> None:
    proto = _raw_proto(caffe_pb2.FLOAT16)
    mutate(proto)
    with pytest.raises(error, match=message):
        Blob((2, 3, 4), np.float32).from_proto(proto, reshape=False, where="w")


# -- writing --------------------------------------------------------------------------------------
def test_fp32_writes_stay_bvlc_bytes() -> None:
    """Without raw_type, to_proto writes what BVLC writes: shape (7), then packed floats (5)."""
    blob = Blob((2, 3), np.float32)
    blob.data[...] = np.arange(6).reshape(2, 3) / 3
    want = caffe_pb2.BlobProto()
    want.shape.dim.extend([2, 3])
    want.data.extend(blob.data.ravel().tolist())
    assert blob.to_proto().SerializeToString() == want.SerializeToString()
    assert b"\x2a\x18" + blob.data.astype("<f4").tobytes() in blob.to_proto().SerializeToString()


@pytest.mark.parametrize("raw_type", list(ROUNDED), ids=caffe_pb2.Type.Name)
def test_blob_to_proto_raw_round_trip(raw_type: int) -> None:
    blob = Blob((2, 3, 4), np.float64)
    blob.data[...] = VALUES
    blob.diff[...] = -VALUES
    proto = blob.to_proto(write_diff=True, raw_type=raw_type)
    assert not proto.data and not proto.double_data and proto.raw_data_type == raw_type
    assert len(proto.raw_data) == VALUES.size * blob_values.RAW_DTYPES[raw_type].itemsize
    back = Blob((1,), np.float64)
    back.from_proto(caffe_pb2.BlobProto.FromString(proto.SerializeToString()))
    np.testing.assert_array_equal(back.data, ROUNDED[raw_type])
    np.testing.assert_array_equal(back.diff, -ROUNDED[raw_type])


def test_write_values_refuses_a_non_float_type() -> None:
    with pytest.raises(ValueError, match="cannot store blob values raw as BOOL"):
        blob_values.write_values(caffe_pb2.BlobProto(), np.ones(3), raw_type=caffe_pb2.BOOL)


@pytest.mark.parametrize(("storage", "old_format", "expected"), [
    (caffe_pb2.FLOAT, False, None), (caffe_pb2.DOUBLE, False, None), (caffe_pb2.FLOAT, True, None),
    (caffe_pb2.FLOAT16, False, caffe_pb2.FLOAT16), (caffe_pb2.BFLOAT16, False, caffe_pb2.BFLOAT16),
    (caffe_pb2.FLOAT16, True, None), (caffe_pb2.BFLOAT16, True, None),
])
def test_snapshot_raw_type(storage: int, old_format: bool, expected: int | None) -> None:
    assert blob_values.snapshot_raw_type(storage, old_format) == expected


# -- whole files ----------------------------------------------------------------------------------
NVCAFFE_NET = """
name: "fp16_small"
default_forward_type: FLOAT16
default_backward_type: FLOAT16
default_forward_math: FLOAT
default_backward_math: FLOAT
global_grad_scale: 128
%(input)s
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" forward_type: FLOAT backward_type: FLOAT }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" forward_math: FLOAT16
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
%(loss)s
"""
DEPLOY = NVCAFFE_NET % {
    "input": 'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 2 dim: 5 dim: 5 } } }',
    "loss": 'layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }'}
TRAIN = NVCAFFE_NET % {
    "input": 'layer { name: "data" type: "DummyData" top: "data" top: "label" dummy_data_param { '
             'shape { dim: 2 dim: 2 dim: 5 dim: 5 } shape { dim: 2 } data_filler { type: "constant" value: 0.5 } '
             'data_filler { type: "constant" value: 1 } } }',
    "loss": 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }'}


def _fp32(text: str) -> str:
    """``text`` without its precision fields: the same net in float32."""
    return re.sub(r"(default_)?(forward|backward)_(type|math): \w+|global_grad_scale: \S+", "", text)


@pytest.fixture
def deploy(tmp_path: Path) -> Path:
    path = tmp_path / "deploy_fp16.prototxt"
    path.write_text(DEPLOY)
    return path


@pytest.fixture
def deploy32(tmp_path: Path) -> Path:
    path = tmp_path / "deploy_fp32.prototxt"
    path.write_text(_fp32(DEPLOY))
    return path


@pytest.mark.parametrize("raw_type", [caffe_pb2.FLOAT16, caffe_pb2.BFLOAT16], ids=caffe_pb2.Type.Name)
def test_half_raw_caffemodel_loads_and_runs(tmp_path: Path, deploy: Path, deploy32: Path, raw_type: int) -> None:
    caffe.set_mode_cpu()
    caffe.set_random_seed(11)
    net = caffe.Net(str(deploy32), caffe.TEST)
    rng = np.random.default_rng(2)
    for blobs in net.params.values():
        for b in blobs:
            b.data[...] = rng.normal(size=b.shape) * 2
    mean, var, factor = net.params["bn"]
    var.data[...] = np.abs(var.data) + 0.5  # BatchNorm's statistics: a variance, a factor of 1
    factor.data[...] = 1
    full = net.to_proto()
    fp32_size = len(full.SerializeToString())
    blob_values.store_raw(full, raw_type)
    model = tmp_path / "half.caffemodel"
    model.write_bytes(full.SerializeToString())
    blobs = [b for lp in full.layer for b in lp.blobs]
    assert blobs and all(len(b.raw_data) == 2 * int(np.prod(b.shape.dim)) and not b.data for b in blobs)
    total = sum(int(np.prod(b.shape.dim)) for b in blobs)
    assert fp32_size - model.stat().st_size >= 2 * total - 4 * len(blobs)  # two bytes a value, not four

    for file in (deploy32, deploy):  # into float32 params, and into the fp16 net's fp16 params
        half = caffe.Net(str(file), str(model), caffe.TEST)
        eps = FP16_EPS if raw_type == caffe_pb2.FLOAT16 else BF16_EPS
        for name, blobs in net.params.items():
            for i, (want, got) in enumerate(zip(blobs, half.params[name])):
                stored = np.float32 if file == deploy32 or name == "bn" else np.float16  # (statistics: fp32)
                assert got.data.dtype == stored, (name, got)
                np.testing.assert_allclose(got.math_data(), want.data, rtol=eps, atol=0, err_msg=f"{name} {i}")
                # exactly the format's rounding of the fp32 value
                if raw_type == caffe_pb2.FLOAT16:
                    np.testing.assert_array_equal(got.math_data(), want.data.astype(np.float16).astype(np.float32))
    x = rng.normal(size=(2, 2, 5, 5))
    want_prob = net.forward(data=x)["prob"]
    half.forward(data=x)
    got_prob = half.blobs["prob"].math_data()  # (stored in fp16)
    assert got_prob.dtype == np.float32 and half.blobs["prob"].dtype == np.float16
    assert np.isfinite(want_prob).all()
    np.testing.assert_allclose(got_prob, want_prob, atol=0.05)
    np.testing.assert_allclose(got_prob.sum(axis=1), 1, rtol=4 * FP16_EPS)


def test_store_raw_none_writes_bvlc_form_back(deploy32: Path) -> None:
    """store_blobs_in_old_format's form: fp16-representable weights, raw and back, give the
    very bytes BVLC's writer gives."""
    caffe.set_mode_cpu()
    net = caffe.Net(str(deploy32), caffe.TEST)
    for blobs in net.params.values():
        for b in blobs:
            b.data[...] = b.data.astype(np.float16)
    bvlc = net.to_proto().SerializeToString()
    param = caffe_pb2.NetParameter.FromString(bvlc)
    blob_values.store_raw(param, caffe_pb2.FLOAT16)
    assert param.SerializeToString() != bvlc
    blob_values.store_raw(param, None)
    assert param.SerializeToString() == bvlc


def test_bad_raw_weights_are_a_weights_error(tmp_path: Path, deploy: Path) -> None:
    caffe.set_mode_cpu()
    net = caffe.Net(str(deploy), caffe.TEST)
    param = net.to_proto()
    blob_values.store_raw(param, caffe_pb2.FLOAT16)
    param.layer[1].blobs[0].raw_data_type = caffe_pb2.UINT
    model = tmp_path / "bad.caffemodel"
    model.write_bytes(param.SerializeToString())
    with pytest.raises(WeightsError, match="bad.caffemodel: layer 'conv' param 0: BlobProto raw_data_type UINT"):
        net.copy_from(model)


def test_hdf5_fp16_weights_load(tmp_path: Path, deploy: Path) -> None:
    h5py = pytest.importorskip("h5py")
    caffe.set_mode_cpu()
    net = caffe.Net(str(deploy), caffe.TEST)
    path = tmp_path / "w.h5"
    net.save_hdf5(path)
    with h5py.File(path, "r+") as f:
        for lname in f["data"]:
            for key in list(f["data"][lname]):
                values = f["data"][lname][key][()]
                del f["data"][lname][key]
                f["data"][lname].create_dataset(key, data=values.astype(np.float16))
    other = caffe.Net(str(deploy), caffe.TEST)
    other.copy_from(path)
    for name, blobs in net.params.items():
        for want, got in zip(blobs, other.params[name]):
            np.testing.assert_array_equal(got.data, want.data.astype(np.float16).astype(np.float32))


def test_fp16_mean_file(tmp_path: Path) -> None:
    mean = np.linspace(0, 255, 3 * 4 * 5).reshape(1, 3, 4, 5)
    proto = _raw_proto(caffe_pb2.FLOAT16, mean)
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(proto.SerializeToString())
    np.testing.assert_array_equal(load_mean_file(str(path)), mean[0].astype(np.float16).astype(np.float64))
    proto.raw_data_type = caffe_pb2.BOOL
    path.write_bytes(proto.SerializeToString())
    with pytest.raises(DataError, match="mean.binaryproto: BlobProto raw_data_type BOOL is not a float type"):
        load_mean_file(str(path))


def test_nvcaffe_style_train_prototxt_trains_in_fp16() -> None:
    """The fields parse and the net stores its values in fp16 (BatchNorm, asked FLOAT, in fp32);
    a solver with NVCaffe's solver fields steps and lowers the loss."""
    caffe.set_mode_cpu()
    caffe.set_random_seed(3)
    param = parse_text(f"net_param {{ {TRAIN} }} base_lr: 0.5 lr_policy: \"fixed\" momentum: 0.9 "
                       "solver_data_type: FLOAT store_blobs_in_old_format: true", caffe_pb2.SolverParameter())
    assert param.net_param.default_forward_type == caffe_pb2.FLOAT16 and param.store_blobs_in_old_format
    solver = sgd_solvers.SGDSolver(param, progress=False)
    net = solver.net
    first = float(net.forward()["loss"])
    assert net.blobs["conv"].data.dtype == np.float16 and net.blobs["ip"].data.dtype == np.float16
    assert net.params["ip"][0].data.dtype == np.float16 and net.params["bn"][0].data.dtype == np.float32
    solver.step(10)
    last = float(net.forward()["loss"])
    assert last < 0.5 * first, (first, last)


def test_solver_resumes_from_fp16_raw_snapshot(tmp_path: Path) -> None:
    """A snapshot whose caffemodel and solver-state history NVCaffe stored raw in FLOAT16 resumes:
    weights and momentum history come back as the fp16 rounding of the fp32 ones."""
    caffe.set_mode_cpu()
    caffe.set_random_seed(8)
    text = (f'net_param {{ {TRAIN} }} base_lr: 0.1 lr_policy: "fixed" momentum: 0.9 '
            f'snapshot_prefix: "{tmp_path}/nv"')
    solver = sgd_solvers.SGDSolver(parse_text(text, caffe_pb2.SolverParameter()), progress=False)
    solver.step(2)
    model_path, state_path = solver.snapshot()
    model = caffe_pb2.NetParameter.FromString(Path(model_path).read_bytes())
    blob_values.store_raw(model, caffe_pb2.FLOAT16)
    Path(model_path).write_bytes(model.SerializeToString())
    state = caffe_pb2.SolverState.FromString(Path(state_path).read_bytes())
    for h in state.history:
        values = blob_values.read_values(h)
        assert values is not None
        blob_values.write_values(h, values, raw_type=caffe_pb2.FLOAT16)
    Path(state_path).write_bytes(state.SerializeToString())

    resumed = sgd_solvers.SGDSolver(parse_text(text, caffe_pb2.SolverParameter()), progress=False)
    resumed.restore(state_path)
    assert resumed.iter == 2
    half = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    for want, got in zip(solver.net.learnable_params, resumed.net.learnable_params):
        np.testing.assert_array_equal(got.data, half(want.data))
    assert any(np.abs(h.data).max() > 0 for h in solver.history)
    for want, got in zip(solver.history, resumed.history):
        np.testing.assert_array_equal(got.data, half(want.data))
