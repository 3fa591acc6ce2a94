"""Convolution: forward against a naive loop, gradients, errors, CPU-vs-GPU agreement."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer


def conv_text(body: str) -> str:
    return f'name: "conv" type: "Convolution" convolution_param {{ {body} }}'


def naive_conv(x, w, bias, kernel, pad, stride, dilation, group):
    """Direct convolution: every output pixel and kernel tap visited explicitly (zero padding)."""
    n, c, h, wd = x.shape
    m = w.shape[0]
    ho = (h + 2 * pad[0] - (dilation[0] * (kernel[0] - 1) + 1)) // stride[0] + 1
    wo = (wd + 2 * pad[1] - (dilation[1] * (kernel[1] - 1) + 1)) // stride[1] + 1
    cg, mg = c // group, m // group
    y = np.zeros((n, m, ho, wo))
    for g in range(group):
        xs, ws = x[:, g * cg:(g + 1) * cg], w[g * mg:(g + 1) * mg]
        for oy in range(ho):
            for ox in range(wo):
                for i in range(kernel[0]):
                    for j in range(kernel[1]):
                        iy = oy * stride[0] - pad[0] + i * dilation[0]
                        ix = ox * stride[1] - pad[1] + j * dilation[1]
                        if 0 <= iy < h and 0 <= ix < wd:
                            y[:, g * mg:(g + 1) * mg, oy, ox] += xs[:, :, iy, ix] @ ws[:, :, i, j].T
    if bias is not None:
        y += np.asarray(bias)[None, :, None, None]
    return y


# (input shape, convolution_param body): stride, pad, dilation, group, rectangular, no bias, 1x1
CONFIGS = [
    ((2, 3, 6, 7), "num_output: 4 kernel_size: 3"),
    ((2, 3, 7, 7), "num_output: 2 kernel_size: 3 stride: 2 pad: 1"),
    ((1, 2, 9, 8), "num_output: 3 kernel_size: 3 dilation: 2 pad: 2"),
    ((2, 4, 6, 6), "num_output: 6 kernel_size: 3 group: 2 pad: 1"),
    ((2, 3, 7, 6), "num_output: 2 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0"),
    ((2, 3, 5, 5), "num_output: 3 kernel_size: 2 bias_term: false"),
    ((2, 4, 5, 4), "num_output: 5 kernel_size: 1"),
    ((2, 4, 5, 4), "num_output: 4 kernel_size: 1 group: 2"),
    ((2, 3, 7, 7), "num_output: 2 kernel_size: 1 stride: 2 pad: 1"),
    ((1, 2, 8, 9), "num_output: 2 kernel_size: 3 kernel_size: 2 stride: 3 stride: 2 dilation: 2 dilation: 1 pad: 1"),
]


def _fill(text: str) -> str:
    return text + ' weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "uniform" min: -1 max: 1 }'


def _run(shape, body, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    layer = make_layer(conv_text(_fill(body)), dtype)
    bottom = blobs([rng.standard_normal(shape)], dtype)
    top = empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("shape,body", CONFIGS)
def test_forward_matches_naive(mode, shape, body):
    layer, bottom, top = _run(shape, body)
    p = layer.layer_param.convolution_param
    bias = layer.blobs[1].data if p.bias_term else None
    g = layer.geo
    expected = naive_conv(bottom[0].data, layer.blobs[0].data, bias, g.kernel, g.pad, g.stride, g.dilation, p.group)
    assert top[0].shape == expected.shape
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10, atol=1e-10)


def test_weight_and_bias_shapes():
    layer, _, top = _run((2, 4, 6, 6), "num_output: 6 kernel_h: 3 kernel_w: 2 group: 2")
    assert layer.blobs[0].shape == (6, 2, 3, 2)
    assert layer.blobs[1].shape == (6,)
    assert top[0].shape == (2, 6, 4, 5)
    layer, _, _ = _run((2, 3, 5, 5), "num_output: 3 kernel_size: 2 bias_term: false")
    assert len(layer.blobs) == 1


@pytest.mark.slow
def test_lenet_shape_matches_naive():
    layer, bottom, top = _run((64, 1, 28, 28), "num_output: 20 kernel_size: 5")
    assert top[0].shape == (64, 20, 24, 24)
    expected = naive_conv(bottom[0].data, layer.blobs[0].data, layer.blobs[1].data, (5, 5), (0, 0), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10, atol=1e-10)


def test_float32_forward_smoke():
    layer, bottom, top = _run((2, 3, 8, 8), "num_output: 4 kernel_size: 3 pad: 1 stride: 2", np.float32)
    assert top[0].data.dtype == np.float32 and top[0].shape == (2, 4, 4, 4)
    x = bottom[0].data.astype(np.float64)
    w = layer.blobs[0].data.astype(np.float64)
    expected = naive_conv(x, w, layer.blobs[1].data.astype(np.float64), (3, 3), (1, 1), (2, 2), (1, 1), 1)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-4, atol=1e-4)


def test_multiple_bottoms_share_weights(mode):
    rng = np.random.default_rng(3)
    layer = make_layer(conv_text(_fill("num_output: 2 kernel_size: 3 pad: 1")))
    bottom = blobs([rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 4, 5))])
    top = empty_blobs(2)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    for b, t in zip(bottom, top):
        expected = naive_conv(b.data, layer.blobs[0].data, layer.blobs[1].data, (3, 3), (1, 1), (1, 1), (1, 1), 1)
        np.testing.assert_allclose(t.data, expected, rtol=1e-10, atol=1e-10)


def test_channel_axis_two(mode):
    """axis: 2 treats the leading two axes as the batch."""
    rng = np.random.default_rng(4)
    layer = make_layer(conv_text(_fill("num_output: 2 kernel_size: 2 axis: 2")))
    x = rng.standard_normal((2, 3, 4, 5, 5))
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape == (2, 3, 2, 4, 4)
    expected = naive_conv(x.reshape(6, 4, 5, 5), layer.blobs[0].data, layer.blobs[1].data,
                          (2, 2), (0, 0), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(top[0].data.reshape(6, 2, 4, 4), expected, rtol=1e-10, atol=1e-10)


def test_engine_cudnn_accepted():
    layer, bottom, top = _run((1, 2, 5, 5), "num_output: 2 kernel_size: 3 engine: CUDNN")
    expected = naive_conv(bottom[0].data, layer.blobs[0].data, layer.blobs[1].data, (3, 3), (0, 0), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10, atol=1e-10)


GRAD_CONFIGS = [
    ((2, 3, 5, 5), "num_output: 2 kernel_size: 3"),
    ((2, 3, 5, 5), "num_output: 2 kernel_size: 3 stride: 2 pad: 1"),
    ((1, 2, 6, 6), "num_output: 2 kernel_size: 2 dilation: 2 pad: 1"),
    ((2, 4, 4, 4), "num_output: 4 kernel_h: 3 kernel_w: 2 group: 2 bias_term: false"),
    ((2, 4, 3, 3), "num_output: 2 kernel_size: 1"),
]


@pytest.mark.parametrize("shape,body", GRAD_CONFIGS)
def test_gradient(mode, shape, body):
    rng = np.random.default_rng(5)
    layer = make_layer(conv_text(_fill(body)))
    bottom, top = blobs([rng.standard_normal(shape)]), empty_blobs(1)
    checked = GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)
    assert checked == bottom[0].count + sum(b.count for b in layer.blobs)


def test_backward_respects_propagate_flags():
    layer, bottom, top = _run((1, 2, 4, 4), "num_output: 2 kernel_size: 3")
    bottom[0].diff[...] = 7.0
    top[0].diff[...] = 1.0
    layer.param_propagate_down = [False, True]
    layer.backward(top, [False], bottom)
    assert np.all(bottom[0].diff == 7.0)
    assert np.all(layer.blobs[0].diff == 0)
    np.testing.assert_allclose(layer.blobs[1].diff, [4.0, 4.0])


@pytest.mark.parametrize(
    "shape,body,match",
    [
        ((1, 3, 4, 4), "num_output: 2 kernel_size: 5", "larger than the input 4x4"),
        ((1, 3, 4, 4), "num_output: 2 kernel_size: 3 dilation: 2", "larger than the input 4x4"),
        ((1, 3, 4, 4), "num_output: 2 kernel_size: 3 group: 2", "3 input channels are not divisible by group 2"),
        ((1, 4, 4, 4), "num_output: 3 kernel_size: 3 group: 2", "num_output 3 is not divisible by group 2"),
        ((1, 3, 4, 4), "kernel_size: 3", "num_output is required"),
        ((1, 3, 4, 4), "num_output: 2", "needs kernel_size"),
        ((1, 3, 4, 4), "num_output: 2 kernel_size: 3 kernel_h: 3 kernel_w: 3", "either kernel_size or kernel_h"),
        ((1, 3, 4, 4), "num_output: 2 kernel_h: 3", "kernel_h and kernel_w must be given together"),
        ((1, 3, 4, 4), "num_output: 2 kernel_size: 3 stride: 0", "stride must be positive"),
        ((1, 3), "num_output: 2 kernel_size: 3", "no spatial axis"),
        ((1, 3, 4, 4, 4), "num_output: 2 kernel_size: 3 kernel_size: 3", "kernel_size has 2 values; give 1 or one per spatial axis"),
        ((1, 3, 4, 4, 4), "num_output: 2 kernel_h: 3 kernel_w: 3", "kernel_h and kernel_w can only be used for 2-D"),
    ],
)
def test_errors(shape, body, match):
    layer = make_layer(conv_text(body))
    with pytest.raises(NetError, match=match) as info:
        layer.setup(blobs([np.zeros(shape)]), empty_blobs(1))
    assert "layer 'conv'" in str(info.value)


@pytest.mark.parametrize("shape,body,match", [
    ((8, 3, 6, 6), "num_output: 4 kernel_size: 3 engine: DIRECT",
     r"engine DIRECT needs batch <= 4.*kernel \(3, 3\), stride \(1, 1\).*group 1, pad \(0, 0\), batch 8 "
     r"\(bottom \(8, 3, 6, 6\), top \(8, 4, 4, 4\)\)"),
    ((1, 4, 6, 6), "num_output: 4 kernel_size: 3 group: 2 engine: DEPTHWISE",
     r"engine DEPTHWISE needs group == channels.*group 2"),
    ((2, 3, 9, 9), "num_output: 2 kernel_size: 3 dilation: 2 engine: WINOGRAD",
     r"engine WINOGRAD needs a 3x3 kernel, stride 1, no dilation.*dilation \(2, 2\)"),
])
def test_forced_engine_rejects_geometry(shape, body, match):
    """Checked before any GPU work (so this runs without a GPU): names the layer, the engine, its
    requirement and the geometry."""
    layer = make_layer(conv_text(body))
    layer.setup(blobs([np.zeros(shape)]), empty_blobs(1))
    with pytest.raises(NetError, match=match) as info:
        layer.engines()
    assert str(info.value).startswith("layer 'conv' (Convolution): ")


def test_embedded_weight_shape_mismatch():
    layer, bottom, top = _run((1, 3, 4, 4), "num_output: 2 kernel_size: 3")
    bad = make_layer(conv_text("num_output: 2 kernel_size: 3"))
    bad.blobs = [layer.blobs[0], layer.blobs[1]]
    with pytest.raises(NetError, match="expected"):
        bad.setup(blobs([np.zeros((1, 4, 4, 4))]), empty_blobs(1))


def test_reshape_rejects_other_channel_count():
    layer, _, top = _run((1, 3, 4, 4), "num_output: 2 kernel_size: 3")
    with pytest.raises(NetError, match="bottom has 2 channels.*weights expect 3"):
        layer.forward(blobs([np.zeros((1, 2, 4, 4))]), top)


# -- GPU agreement ----------------------------------------------------------------------------
def _forward_backward(layer, bottom, top, top_diff):
    layer.forward(bottom, top)
    top[0].diff[...] = top_diff
    for b in layer.blobs:
        b.diff[...] = 0
    layer.backward(top, [True], bottom)
    return [top[0].data.copy(), bottom[0].diff.copy()] + [b.diff.copy() for b in layer.blobs]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,body", CONFIGS + [((3, 2, 5, 5), "num_output: 3 kernel_size: 3 pad: 1")])
@pytest.mark.parametrize("chunked", [False, True])
def test_cpu_gpu_agree(monkeypatch, shape, body, dtype, chunked):
    if chunked:  # force the im2col engine with one image per column buffer
        monkeypatch.setattr("pycaffe_lite.conv.gemm.COL_BUFFER_BYTES", 1)
        body += " engine: GEMM"
    rng = np.random.default_rng(6)
    x = rng.standard_normal(shape)
    results = []
    layer = None
    for mode in ("cpu", "gpu"):
        caffe.set_mode_gpu() if mode == "gpu" else caffe.set_mode_cpu()
        try:
            new = make_layer(conv_text(_fill(body)), dtype)
            if layer is not None:
                new.blobs = blobs([b.data for b in layer.blobs], dtype)
            layer = new
            bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
            layer.setup(bottom, top)
            top_diff = np.random.default_rng(7).standard_normal(top[0].shape)
            results.append(_forward_backward(layer, bottom, top, top_diff))
        finally:
            caffe.set_mode_cpu()
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for cpu, gpu in zip(*results):
        np.testing.assert_allclose(gpu, cpu, rtol=tol, atol=tol)
