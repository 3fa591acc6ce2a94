"""Shared set-up of the ONNX export tests: skip cleanly without onnx/onnxruntime, build a net from
prototxt text, give it random weights, export it and run the built-in check."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="the ONNX export tests need the 'onnx' package (pip install .[onnx])")
pytest.importorskip("onnxruntime", reason="the ONNX export tests need 'onnxruntime' (pip install .[onnx])")

import onnx  # noqa: E402
from google.protobuf import text_format  # noqa: E402

from pycaffe_lite import common  # noqa: E402
from pycaffe_lite.net import Net  # noqa: E402
from pycaffe_lite.proto import caffe_pb2  # noqa: E402


def randomize(net, seed: int = 0) -> None:
    """Weights uniform in [-1, 1) scaled by fan-in; BatchNorm statistics plausible with a
    non-unit moving-average factor (so dividing by it matters)."""
    rng = np.random.default_rng(seed)
    for name, blobs in net.params.items():
        ltype = net.layer_dict[name].type
        if ltype == "BatchNorm":
            c = blobs[0].count
            s = 7.5
            blobs[0].data[...] = rng.normal(0.0, 0.3, c) * s
            blobs[1].data[...] = rng.uniform(0.5, 1.5, c) * s
            blobs[2].data[...] = s
            continue
        if ltype == "Embed":
            blobs[0].data[...] = rng.standard_normal(blobs[0].shape)
            continue
        for blob in blobs:
            shape = blob.shape
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            blob.data[...] = rng.uniform(-1, 1, shape) / np.sqrt(fan_in)


def make_net(text: str, seed: int = 0, random: bool = True) -> Net:
    common.set_mode_cpu()
    param = text_format.Parse(text, caffe_pb2.NetParameter())
    net = Net(param, phase=common.TEST)
    if random:
        randomize(net, seed)
    return net


def export_and_check(net, path=None, **kwargs):
    """Export (onnx.checker included), check in ONNX Runtime; returns the report. Raises on a mismatch."""
    report = net.to_onnx(path, **kwargs)
    onnx.checker.check_model(report.exported.model, full_check=True)
    for result in report.checks:
        assert result.ok, result.table()
    return report
