"""N-D Convolution, Deconvolution and Pooling (1 and 3 spatial axes, and 2-D nets on the N-D path:
``force_nd_im2col``, ``kernel_size_nd``-style fields, STOCHASTIC pooling in TEST) exported and proven
by the built-in check, at the built batch and with a dynamic batch run at another batch."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx_testing import export_and_check, make_net

from pycaffe_lite.onnx import ExportError

INPUT = 'name: "t"\nlayer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dims} }} }} }}\n'


def net_text(shape, body: str) -> str:
    return INPUT.format(dims=" ".join(f"dim: {d}" for d in shape)) + body


NETS = {
    # a 3-D U-Net-like stack: strided conv, MAX and AVE pooling (padding, ceil windows), deconvolution
    "3d": ((2, 3, 5, 6, 7), '''
layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 4 kernel_size: 3 pad: 1 stride: 2 } }
layer { name: "mp" type: "Pooling" bottom: "c" top: "mp" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ap" type: "Pooling" bottom: "c" top: "ap" pooling_param { pool: AVE kernel_size: 2 stride: 2 pad: 1 } }
layer { name: "dc" type: "Deconvolution" bottom: "mp" top: "dc" convolution_param { num_output: 2 kernel_size: 2 stride: 2 group: 2 } }
layer { name: "g" type: "Pooling" bottom: "c" top: "g" pooling_param { pool: AVE global_pooling: true } }
'''),
    # per-axis kernel / stride / pad / dilation on 3 axes
    "3d_per_axis": ((1, 2, 6, 7, 8), '''
layer { name: "c" type: "Convolution" bottom: "data" top: "c"
        convolution_param { num_output: 3 kernel_size: 3 kernel_size: 1 kernel_size: 2 stride: 1 stride: 2 stride: 1
                            pad: 1 pad: 0 pad: 1 dilation: 2 dilation: 1 dilation: 1 } }
layer { name: "p" type: "Pooling" bottom: "c" top: "p" top: "m"
        pooling_param { pool: MAX kernel_size_nd: 2 kernel_size_nd: 1 kernel_size_nd: 3 stride_nd: 2 stride_nd: 1 stride_nd: 2 } }
'''),
    "1d": ((2, 3, 11), '''
layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 4 kernel_size: 3 dilation: 2 } }
layer { name: "p" type: "Pooling" bottom: "c" top: "p" pooling_param { pool: AVE kernel_size: 2 stride: 2 pad: 1 } }
layer { name: "d" type: "Deconvolution" bottom: "p" top: "d" convolution_param { num_output: 2 kernel_size: 3 stride: 2 pad: 1 } }
'''),
    "2d_nd_path": ((2, 3, 7, 7), '''
layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 4 kernel_size: 3 force_nd_im2col: true } }
layer { name: "r" type: "ReLU" bottom: "c" top: "c" }
layer { name: "s" type: "Pooling" bottom: "c" top: "s" pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 } }
layer { name: "d" type: "Deconvolution" bottom: "s" top: "d" convolution_param { num_output: 2 kernel_size: 2 stride: 2 force_nd_im2col: true } }
'''),
}


@pytest.mark.parametrize("name", list(NETS))
def test_nd_layers(name):
    shape, body = NETS[name]
    net = make_net(net_text(shape, body))
    export_and_check(net)
    report = export_and_check(net, dynamic_batch=True)
    assert all(r.verdict.startswith("ok") for r in report.checks[0].rows), report.checks[0].table()
    types = {r.row.type for r in report.checks[0].rows if r.verdict == "ok"}
    assert {"Convolution", "Pooling"} <= types
    x = np.random.default_rng(2).standard_normal((3, *shape[1:])).astype(np.float32)
    outs = [o.name for o in report.exported.model.graph.output]
    got = ort.InferenceSession(report.exported.model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(outs, {"data": x})
    net.blobs["data"].reshape(x.shape)
    net.reshape()
    net.blobs["data"].data[...] = x
    net.forward()
    for o, g in zip(outs, got):
        ref = net.blobs[o].data
        np.testing.assert_allclose(g, ref, rtol=0, atol=1e-5 * max(float(np.abs(ref).max()), 1e-30))


def test_nd_mask_is_the_in_volume_index():
    """The mask top of 3-D MAX pooling: the flat index of each window's first maximum within its
    (D, H, W) volume, ties included (a ReLU'd input with many zeros)."""
    net = make_net(net_text((2, 2, 4, 5, 6), '''
    layer { name: "r" type: "ReLU" bottom: "data" top: "r" }
    layer { name: "p" type: "Pooling" bottom: "r" top: "p" top: "m" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
    '''))
    x = np.random.default_rng(4).standard_normal((2, 2, 4, 5, 6)).astype(np.float32)
    x[:, 1] = -1  # channel 1: every window all zeros after the ReLU
    report = net.to_onnx(None, check_inputs=[{"data": x}])
    assert all(r.verdict.startswith("ok") for r in report.checks[1].rows), report.checks[1].table()
    mask = net.blobs["m"].data
    # pooled (2, 3, 3) (ceil: the last H window starts at row 4); each window's first cell
    first = np.arange(2)[:, None, None] * 2 * 30 + np.arange(3)[None, :, None] * 2 * 6 + np.arange(3) * 2
    assert np.array_equal(mask[:, 1], np.broadcast_to(first, (2, 2, 3, 3)))
    assert 0 <= mask.min() and mask.max() < 4 * 5 * 6


def test_nd_errors():
    net = make_net(net_text((1, 1, 3, 3, 3, 3), '''
    layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { pool: MAX kernel_size: 2 } }
    '''))
    with pytest.raises(ExportError, match=r"layer 'p' \(Pooling\): 4 spatial axes"):
        export_and_check(net)
