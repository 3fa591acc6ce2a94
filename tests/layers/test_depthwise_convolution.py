"""The MobileNet forks' depthwise types, DepthwiseConvolution and ConvolutionDepthwise: forward against a
per-channel loop, gradients, parameter rules, the forks' caffemodels, fusion, the GPU engine."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer

TYPES = ["DepthwiseConvolution", "ConvolutionDepthwise"]
FILL = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "uniform" min: -1 max: 1 }'


def text(kind: str, body: str) -> str:
    return f'name: "dw" type: "{kind}" convolution_param {{ {body} {FILL} }}'


def naive_depthwise(x, w, bias, kernel, pad, stride):
    """Output channel o reads input channel o // multiplier only; explicit loops over taps."""
    n, c, h, wd = x.shape
    m = w.shape[0]
    mult = m // c
    ho = (h + 2 * pad[0] - kernel[0]) // stride[0] + 1
    wo = (wd + 2 * pad[1] - kernel[1]) // stride[1] + 1
    y = np.zeros((n, m, ho, wo))
    for o in range(m):
        for oy in range(ho):
            for ox in range(wo):
                for i in range(kernel[0]):
                    for j in range(kernel[1]):
                        iy, ix = oy * stride[0] - pad[0] + i, ox * stride[1] - pad[1] + j
                        if 0 <= iy < h and 0 <= ix < wd:
                            y[:, o, oy, ox] += x[:, o // mult, iy, ix] * w[o, 0, i, j]
        if bias is not None:
            y[:, o] += bias[o]
    return y


def _run(kind, shape, body, seed=0):
    rng = np.random.default_rng(seed)
    layer = make_layer(text(kind, body))
    bottom, top = blobs([rng.standard_normal(shape)]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


CONFIGS = [
    ((2, 3, 7, 6), "num_output: 3 group: 3 kernel_size: 3 pad: 1", (3, 3), (1, 1), (1, 1)),
    ((2, 4, 8, 8), "num_output: 4 kernel_size: 3 stride: 2 pad: 1", (3, 3), (1, 1), (2, 2)),  # group left out
    ((1, 3, 6, 7), "kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0 bias_term: false",
     (3, 2), (1, 0), (2, 1)),  # num_output left out
]


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("shape,body,kernel,pad,stride", CONFIGS)
def test_forward_matches_naive(mode, kind, shape, body, kernel, pad, stride):
    layer, bottom, top = _run(kind, shape, body)
    c = shape[1]
    assert layer.blobs[0].shape == (c, 1) + kernel
    assert layer.group == c and layer.num_output == c
    bias = layer.blobs[1].data if len(layer.blobs) > 1 else None
    want = naive_depthwise(bottom[0].data, layer.blobs[0].data, bias, kernel, pad, stride)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-10, atol=1e-10)


def test_depth_multiplier(mode):
    layer, bottom, top = _run("DepthwiseConvolution", (2, 2, 5, 5), "num_output: 6 kernel_size: 3")
    assert layer.blobs[0].shape == (6, 1, 3, 3)
    want = naive_depthwise(bottom[0].data, layer.blobs[0].data, layer.blobs[1].data, (3, 3), (0, 0), (1, 1))
    np.testing.assert_allclose(top[0].data, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", TYPES)
def test_gradient(mode, kind):
    rng = np.random.default_rng(5)
    layer = make_layer(text(kind, "num_output: 3 kernel_size: 3 stride: 2 pad: 1"))
    bottom, top = blobs([rng.standard_normal((2, 3, 5, 5))]), empty_blobs(1)
    checked = GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)
    assert checked == bottom[0].count + sum(b.count for b in layer.blobs)


@pytest.mark.parametrize("body,match", [
    ("num_output: 4 group: 2 kernel_size: 3", "group = input channels \\(4\\); got group 2"),
    ("num_output: 6 kernel_size: 3", "num_output 6 must be a multiple of the 4 input channels"),
])
def test_depthwise_convolution_errors(body, match):
    layer = make_layer(text("DepthwiseConvolution", body))
    with pytest.raises(NetError, match=match) as info:
        layer.setup(blobs([np.zeros((1, 4, 5, 5))]), empty_blobs(1))
    assert "layer 'dw'" in str(info.value)


def test_convolution_depthwise_ignores_num_output_like_its_fork(caplog):
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        layer, _, top = _run("ConvolutionDepthwise", (1, 3, 5, 5), "num_output: 8 group: 1 kernel_size: 3")
    assert top[0].shape == (1, 3, 3, 3) and layer.blobs[0].shape == (3, 1, 3, 3)
    assert "num_output 8 ignored" in caplog.text and "group 1 ignored" in caplog.text


DEPLOY = """
name: "mobile" input: "data" input_shape { dim: 1 dim: 3 dim: 6 dim: 6 }
layer { name: "conv_dw" type: "%s" bottom: "data" top: "conv_dw"
        convolution_param { num_output: 3 group: 3 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "bn" type: "BatchNorm" bottom: "conv_dw" top: "conv_dw" batch_norm_param { use_global_stats: true } }
layer { name: "sc" type: "Scale" bottom: "conv_dw" top: "conv_dw" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "conv_dw" top: "conv_dw" }
"""


def _blob(array) -> caffe_pb2.BlobProto:
    b = caffe_pb2.BlobProto()
    b.shape.dim.extend(array.shape)
    b.data.extend(np.asarray(array, np.float32).ravel())
    return b


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("fusion", ["1", "0"])
def test_fork_caffemodel_loads_and_fuses(tmp_path, monkeypatch, kind, fusion):
    """A caffemodel as the forks write it (weights (C, 1, kh, kw) under the layer's name, BatchNorm and Scale
    blobs) loads; the TEST net gives the naive result with and without the conv+BN+Scale+ReLU fusion."""
    monkeypatch.setenv("PYCAFFE_LITE_FUSION", fusion)
    rng = np.random.default_rng(7)
    w = rng.standard_normal((3, 1, 3, 3)).astype(np.float32)
    mean, var = rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 2, 3).astype(np.float32)
    gamma, beta = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    model = caffe_pb2.NetParameter(name="mobile")
    for name, typ, arrays in (("conv_dw", kind, [w]), ("bn", "BatchNorm", [mean * 2, var * 2, np.array([2.0])]),
                              ("sc", "Scale", [gamma, beta])):
        lp = model.layer.add(name=name, type=typ)
        lp.blobs.extend(_blob(a) for a in arrays)
    (tmp_path / "w.caffemodel").write_bytes(model.SerializeToString())
    (tmp_path / "deploy.prototxt").write_text(DEPLOY % kind)
    net = caffe.Net(str(tmp_path / "deploy.prototxt"), caffe.TEST, weights=str(tmp_path / "w.caffemodel"))
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    out = net.forward(data=x)["conv_dw"]
    conv = naive_depthwise(x.astype(np.float64), w, None, (3, 3), (1, 1), (1, 1))
    bn = (conv - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    want = np.maximum(bn * gamma[None, :, None, None] + beta[None, :, None, None], 0)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_gpu_agree_and_depthwise_engine(kind, dtype):
    rng = np.random.default_rng(3)
    body = "num_output: 4 kernel_size: 3 stride: 2 pad: 1"
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else {}
    assert_cpu_gpu_agree(text(kind, body), [rng.standard_normal((2, 4, 9, 9))], dtype=dtype, **tol)
    caffe.set_mode_gpu()
    try:
        layer, _, _ = _run(kind, (2, 4, 9, 9), body)
        choice = layer.engine_choice()
        assert (choice.forward, choice.backward_data, choice.backward_weight) == ("depthwise",) * 3
    finally:
        caffe.set_mode_cpu()
