"""ONNX export of half nets (docs/precision.md): a net whose file has NVCaffe's fp16 / bf16 type
fields stores its params in half (bfloat16 as uint16 bit patterns on the host); the exporter
reads them as values, ``export_onnx`` (with and without ``--fp16``) passes its own check within
the format's tolerance, and ONNX Runtime's outputs of the written file agree with our forward and
with the float32 twin of the net holding the same weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_testing import export_and_check

import pycaffe_lite as caffe
from pycaffe_lite import common, precision
from pycaffe_lite.commands.cli import main
from pycaffe_lite.onnx.check import TOL_HALF, half_tolerance

BODY = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 10 dim: 10 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 6 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip" inner_product_param { num_output: 7 } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""
TYPES = {"fp16": "FLOAT16", "bf16": "BFLOAT16"}
STORED = {"fp16": np.float16, "bf16": np.uint16}
U = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}  # unit roundoff


def _file(tmp_path: Path, name: str | None) -> Path:
    """The net with ``name``'s NVCaffe fields (None: the float32 file)."""
    head = "" if name is None else (f"default_forward_type: {TYPES[name]} default_backward_type: {TYPES[name]} "
                                     "default_forward_math: FLOAT default_backward_math: FLOAT")
    path = tmp_path / f"net_{name or 'fp32'}.prototxt"
    path.write_text(f'name: "half_{name}"\n{head}\n{BODY}')
    return path


@pytest.fixture(autouse=True)
def cpu():
    common.context().precision = None
    caffe.set_mode_cpu()
    yield
    common.context().precision = None


def _weights(tmp_path: Path) -> tuple[Path, caffe.Net]:
    """An fp32 caffemodel with plausible weights and BatchNorm statistics, and its fp32 net."""
    net = caffe.Net(str(_file(tmp_path, None)), caffe.TEST)
    rng = np.random.default_rng(11)
    bn = net.params["bn"]
    bn[0].data[...] = rng.normal(0, 0.3, 6) * 2
    bn[1].data[...] = rng.uniform(0.5, 1.5, 6) * 2
    bn[2].data[...] = 2
    for name in ("conv", "scale", "ip"):
        for blob in net.params[name]:
            fan_in = int(np.prod(blob.shape[1:])) if blob.data.ndim > 1 else 1
            blob.data[...] = rng.uniform(-1, 1, blob.shape) / np.sqrt(fan_in) + (1.0 if name == "scale" else 0.0)
    path = tmp_path / "w.caffemodel"
    net.save(str(path))
    return path, net


def _ort(path: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_export_onnx_command_on_a_half_net(name, fp16, tmp_path, capsys):
    weights, _ = _weights(tmp_path)
    model, out = _file(tmp_path, name), tmp_path / f"{name}.onnx"
    argv = ["export_onnx", "--model", str(model), "--weights", str(weights), "--output", str(out)]
    assert main(argv + ["--fp16"] * fp16) == 0, capsys.readouterr()
    text = capsys.readouterr().out
    assert "PASS" in text and f"within {TOL_HALF[np.dtype(STORED[name])]:g} of their range" in text
    graph = onnx.load(str(out)).graph
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    stored = {i.data_type for i in graph.initializer if list(i.dims) in ([6, 3, 3, 3], [7, 150])}
    assert stored == {onnx.TensorProto.FLOAT16 if fp16 else onnx.TensorProto.FLOAT}

    # ONNX Runtime on the written file vs our half net's forward (float32 values of its output)
    net = caffe.Net(str(model), caffe.TEST, weights=str(weights))
    assert net.params["conv"][0].data.dtype == STORED[name] and net.blobs["prob"].data.dtype == STORED[name]
    x = np.random.default_rng(5).standard_normal((2, 3, 10, 10)).astype(np.float32)
    got = _ort(out, x)
    net.forward(data=x)
    ours = net.blobs["prob"].math_data()
    assert got.shape == ours.shape == (2, 7)
    assert np.abs(got - ours).max() <= 4 * U[name] * np.abs(ours).max(), np.abs(got - ours).max()

    # ... and vs the float32 net holding the half weights' values: the ONNX graph is that net
    twin = caffe.Net(str(_file(tmp_path, None)), caffe.TEST)
    for lname, blobs in net.params.items():
        for mine, theirs in zip(blobs, twin.params[lname]):
            values = mine.math_data()
            theirs.data[...] = values.astype(np.float16) if fp16 and lname in ("conv", "ip") and values.ndim > 1 \
                else values
    twin.forward(data=x)
    assert np.abs(got - twin.blobs["prob"].data).max() < 2e-6


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_half_params_are_exported_as_values(name, tmp_path):
    """The exporter reads params through their values: bfloat16 bit patterns never reach the graph."""
    weights, ref = _weights(tmp_path)
    net = caffe.Net(str(_file(tmp_path, name)), caffe.TEST, weights=str(weights))
    report = export_and_check(net, tmp_path / "m.onnx")
    assert report.checks[0].tol == TOL_HALF[np.dtype(STORED[name])] == half_tolerance(net)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in report.exported.model.graph.initializer}
    conv_w = next(v for v in inits.values() if v.shape == (6, 3, 3, 3))
    want = precision.to_float32(net.params["conv"][0].cpu_data(), precision.type_of_dtype(STORED[name]))
    assert np.array_equal(conv_w, want)
    assert np.abs(conv_w - ref.params["conv"][0].data).max() <= U[name] * np.abs(ref.params["conv"][0].data).max()


def test_precision_switch_net_exports_too(tmp_path):
    """A float32 file built under caffe.set_precision('bf16') is a half net like a bf16 file."""
    weights, _ = _weights(tmp_path)
    caffe.set_precision("bf16")
    net = caffe.Net(str(_file(tmp_path, None)), caffe.TEST, weights=str(weights))
    assert half_tolerance(net) == TOL_HALF[np.dtype(np.uint16)]
    export_and_check(net, tmp_path / "s.onnx", fp16=True, fold_bn=True)
