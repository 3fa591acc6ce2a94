"""Deconvolution: forward against a naive scatter loop, FCN bilinear upsampling, gradients, errors,
CPU-vs-GPU agreement."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.gradient_check import GradientChecker
from pycaffe_lite.layer_testing import blobs, empty_blobs, make_layer
from pycaffe_lite.proto import caffe_pb2
from pycaffe_lite.protoio import parse_text


def deconv_text(body: str) -> str:
    return f'name: "deconv" type: "Deconvolution" convolution_param {{ {body} }}'


def naive_deconv(x, w, bias, kernel, pad, stride, dilation, group):
    """Every input pixel scatters ``x · W`` through every kernel tap into the output (cropped by pad)."""
    n, c, h, wd = x.shape
    mg = w.shape[1]
    m, cg = mg * group, c // group
    ho = stride[0] * (h - 1) + dilation[0] * (kernel[0] - 1) + 1 - 2 * pad[0]
    wo = stride[1] * (wd - 1) + dilation[1] * (kernel[1] - 1) + 1 - 2 * pad[1]
    y = np.zeros((n, m, ho, wo))
    for g in range(group):
        xs, ws = x[:, g * cg:(g + 1) * cg], w[g * cg:(g + 1) * cg]  # ws (cg, mg, kh, kw)
        for iy in range(h):
            for ix in range(wd):
                for i in range(kernel[0]):
                    for j in range(kernel[1]):
                        oy = iy * stride[0] - pad[0] + i * dilation[0]
                        ox = ix * stride[1] - pad[1] + j * dilation[1]
                        if 0 <= oy < ho and 0 <= ox < wo:
                            y[:, g * mg:(g + 1) * mg, oy, ox] += xs[:, :, iy, ix] @ ws[:, :, i, j]
    if bias is not None:
        y += np.asarray(bias)[None, :, None, None]
    return y


CONFIGS = [
    ((2, 3, 4, 5), "num_output: 4 kernel_size: 3"),
    ((2, 3, 4, 4), "num_output: 2 kernel_size: 4 stride: 2 pad: 1"),
    ((1, 2, 3, 4), "num_output: 3 kernel_size: 3 dilation: 2 pad: 1"),
    ((2, 4, 3, 3), "num_output: 6 kernel_size: 3 group: 2 stride: 2"),
    ((2, 3, 4, 3), "num_output: 2 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0"),
    ((2, 3, 3, 3), "num_output: 3 kernel_size: 2 bias_term: false"),
    ((2, 4, 3, 4), "num_output: 5 kernel_size: 1"),
    ((2, 4, 3, 3), "num_output: 2 kernel_size: 1 stride: 2"),
    ((1, 2, 3, 4), "num_output: 2 kernel_size: 3 kernel_size: 2 stride: 3 stride: 2 dilation: 2 dilation: 1 pad: 1"),
]


def _fill(text: str) -> str:
    return text + ' weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "uniform" min: -1 max: 1 }'


def _run(shape, body, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    layer = make_layer(deconv_text(_fill(body)), dtype)
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
    expected = naive_deconv(bottom[0].data, layer.blobs[0].data, bias, g.kernel, g.pad, g.stride, g.dilation,
                            p.group)
    assert top[0].shape == expected.shape
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10, atol=1e-10)


def test_shapes_follow_caffe():
    layer, _, top = _run((2, 4, 5, 6), "num_output: 6 kernel_h: 3 kernel_w: 2 group: 2 stride: 2 pad: 1")
    assert layer.blobs[0].shape == (4, 3, 3, 2)  # (C_in, num_output/group, kh, kw)
    assert layer.blobs[1].shape == (6,)
    # (H-1)*stride - 2*pad + dilation*(k-1) + 1
    assert top[0].shape == (2, 6, (5 - 1) * 2 - 2 + 3, (6 - 1) * 2 - 2 + 2)


def test_is_adjoint_of_convolution():
    """<deconv(x), y> == <x, conv(y)> with the same weight blob and no bias."""
    rng = np.random.default_rng(7)
    body = "num_output: 3 kernel_size: 3 stride: 2 pad: 1 dilation: 1 group: 1 bias_term: false"
    de = make_layer(deconv_text(body))
    x = rng.standard_normal((2, 4, 3, 3))
    bd, td = blobs([x]), empty_blobs(1)
    de.blobs = blobs([rng.standard_normal((4, 3, 3, 3))])
    de.setup(bd, td)
    de.forward(bd, td)
    y = rng.standard_normal(td[0].shape)
    conv = make_layer(f'name: "c" type: "Convolution" convolution_param {{ {body.replace("3 k", "4 k", 1)} }}')
    conv.blobs = [de.blobs[0]]
    bc, tc = blobs([y]), empty_blobs(1)
    conv.setup(bc, tc)
    conv.forward(bc, tc)
    assert tc[0].shape == x.shape
    np.testing.assert_allclose(np.vdot(td[0].data, y), np.vdot(x, tc[0].data), rtol=1e-12)


def bilinear_upsample_2x(x):
    """Separable linear interpolation: output o reads input coordinate o/2 - 1/4, zero outside."""
    def axis_matrix(n):
        mat = np.zeros((2 * n, n))
        for o in range(2 * n):
            src = o / 2 - 0.25
            i0 = int(np.floor(src))
            t = src - i0
            for i, wt in ((i0, 1 - t), (i0 + 1, t)):
                if 0 <= i < n:
                    mat[o, i] += wt
        return mat

    mh, mw = axis_matrix(x.shape[2]), axis_matrix(x.shape[3])
    return np.einsum("oh,nchw,pw->ncop", mh, x, mw)


def test_fcn_bilinear_upsampling(mode):
    """FCN's 2x upsampling: kernel 4, stride 2, pad 1, group = channels, bilinear filler, lr_mult 0."""
    text = """
    layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 4 dim: 5 } } }
    layer { name: "up" type: "Deconvolution" bottom: "data" top: "up" param { lr_mult: 0 }
            convolution_param { num_output: 3 group: 3 kernel_size: 4 stride: 2 pad: 1 bias_term: false
                                weight_filler { type: "bilinear" } } }"""
    net = caffe.Net(parse_text(text, caffe_pb2.NetParameter(), "<net>"), caffe.TRAIN, dtype=np.float64)
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5))
    net.blobs["data"].data[...] = x
    net.forward()
    up = net.layers[1]
    assert up.param_propagate_down == [False]  # lr_mult 0: the filter stays fixed
    assert net.params["up"][0].data.shape == (3, 1, 4, 4)
    np.testing.assert_allclose(net.blobs["up"].data, bilinear_upsample_2x(x), rtol=1e-12, atol=1e-12)
    # the data gradient of the linear map for a unit top diff: each input pixel's column sum
    net.blobs["up"].diff[...] = 1.0
    up.backward([net.blobs["up"]], [True], [net.blobs["data"]])
    assert np.all(net.params["up"][0].diff == 0)
    np.testing.assert_allclose(net.blobs["data"].diff, np.broadcast_to(_column_sums(4, 5), x.shape), rtol=1e-12)


def _column_sums(h, w):
    out = np.zeros((h, w))
    for iy in range(h):
        for ix in range(w):
            e = np.zeros((1, 1, h, w))
            e[0, 0, iy, ix] = 1
            out[iy, ix] = bilinear_upsample_2x(e).sum()
    return out


def test_multiple_bottoms_and_axis_two(mode):
    rng = np.random.default_rng(3)
    layer = make_layer(deconv_text(_fill("num_output: 2 kernel_size: 2 stride: 2 axis: 2")))
    xs = [rng.standard_normal((2, 2, 3, 2, 3)), rng.standard_normal((2, 2, 3, 2, 3))]
    bottom, top = blobs(xs), empty_blobs(2)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    for x, t in zip(xs, top):
        assert t.shape == (2, 2, 2, 4, 6)
        expected = naive_deconv(x.reshape(4, 3, 2, 3), layer.blobs[0].data, layer.blobs[1].data,
                                (2, 2), (0, 0), (2, 2), (1, 1), 1)
        np.testing.assert_allclose(t.data.reshape(4, 2, 4, 6), expected, rtol=1e-10, atol=1e-10)


GRAD_CONFIGS = [
    ((2, 2, 3, 3), "num_output: 2 kernel_size: 3"),
    ((1, 2, 3, 3), "num_output: 2 kernel_size: 4 stride: 2 pad: 1"),
    ((1, 2, 3, 2), "num_output: 2 kernel_size: 2 dilation: 2 pad: 1"),
    ((2, 4, 2, 2), "num_output: 2 kernel_h: 3 kernel_w: 2 group: 2 stride: 2 bias_term: false"),
    ((2, 3, 2, 3), "num_output: 2 kernel_size: 1"),
]


@pytest.mark.parametrize("shape,body", GRAD_CONFIGS)
def test_gradient(mode, shape, body):
    rng = np.random.default_rng(5)
    layer = make_layer(deconv_text(_fill(body)))
    bottom, top = blobs([rng.standard_normal(shape)]), empty_blobs(1)
    checked = GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)
    assert checked == bottom[0].count + sum(b.count for b in layer.blobs)


def test_backward_respects_propagate_flags(mode):
    layer, bottom, top = _run((1, 2, 3, 3), "num_output: 2 kernel_size: 3")
    bottom[0].diff[...] = 7.0
    top[0].diff[...] = 1.0
    layer.param_propagate_down = [False, True]
    layer.backward(top, [False], bottom)
    assert np.all(bottom[0].diff == 7.0)
    assert np.all(layer.blobs[0].diff == 0)
    np.testing.assert_allclose(layer.blobs[1].diff, [25.0, 25.0])  # 5x5 output pixels per channel


@pytest.mark.parametrize(
    "shape,body,match",
    [
        ((1, 3, 4, 4), "num_output: 2 kernel_size: 3 group: 2", "3 input channels are not divisible by group 2"),
        ((1, 4, 4, 4), "num_output: 3 kernel_size: 3 group: 2", "num_output 3 is not divisible by group 2"),
        ((1, 3, 4, 4), "kernel_size: 3", "num_output is required"),
        ((1, 3, 4, 4), "num_output: 2", "needs kernel_size"),
        ((1, 3, 1, 1), "num_output: 2 kernel_size: 1 pad: 1", "output would be -1x-1"),
        ((1, 3, 4), "num_output: 2 kernel_size: 3", "only 2-D deconvolution"),
    ],
)
def test_errors(shape, body, match):
    layer = make_layer(deconv_text(body))
    with pytest.raises(NetError, match=match) as info:
        layer.setup(blobs([np.zeros(shape)]), empty_blobs(1))
    assert "layer 'deconv'" in str(info.value)


def test_embedded_weights_use_caffe_layout():
    bad = make_layer(deconv_text("num_output: 4 kernel_size: 3"))
    bad.blobs = blobs([np.zeros((4, 2, 3, 3)), np.zeros(4)])  # convolution's (num_output, C) layout
    with pytest.raises(NetError, match=r"param blob 0 has shape \(4, 2, 3, 3\), expected \(2, 4, 3, 3\)"):
        bad.setup(blobs([np.zeros((1, 2, 4, 4))]), empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,body", CONFIGS[:7])
def test_cpu_gpu_agree(dtype, shape, body):
    rng = np.random.default_rng(9)
    x = rng.standard_normal(shape)
    out = {}
    ref = make_layer(deconv_text(_fill(body)), dtype)
    ref.setup(blobs([x], dtype), empty_blobs(1, dtype))
    params = [p.data.copy() for p in ref.blobs]
    dy = None
    for m in ("cpu", "gpu"):
        caffe.set_mode_gpu() if m == "gpu" else caffe.set_mode_cpu()
        try:
            layer = make_layer(deconv_text(body), dtype)
            layer.blobs = blobs(params, dtype)
            bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
            layer.setup(bottom, top)
            layer.forward(bottom, top)
            if dy is None:
                dy = rng.standard_normal(top[0].shape)
            top[0].diff[...] = dy
            layer.backward(top, [True], bottom)
            out[m] = [top[0].data.copy(), bottom[0].diff.copy()] + [p.diff.copy() for p in layer.blobs]
        finally:
            caffe.set_mode_cpu()
    tol = 1e-4 if dtype == np.float32 else 1e-11
    for a, b in zip(out["cpu"], out["gpu"]):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.gpu
def test_gpu_chunked_batch_matches_cpu(monkeypatch):
    """A tiny column budget makes the GPU path run one image per chunk."""
    import pycaffe_lite.builtin_layers.deconvolution as mod

    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 2, 3, 3))
    body = _fill("num_output: 2 kernel_size: 3 stride: 2")
    out = {}
    for m in ("cpu", "gpu"):
        if m == "gpu":
            monkeypatch.setattr(mod, "COL_BUFFER_BYTES", 8)
            caffe.set_mode_gpu()
        try:
            caffe.set_random_seed(3)
            layer = make_layer(deconv_text(body))
            bottom, top = blobs([x]), empty_blobs(1)
            layer.setup(bottom, top)
            if m == "gpu":
                assert len(layer._chunks()) == 3
            layer.forward(bottom, top)
            top[0].diff[...] = np.linspace(-1, 1, top[0].count).reshape(top[0].shape)
            layer.backward(top, [True], bottom)
            out[m] = [top[0].data.copy(), bottom[0].diff.copy()] + [p.diff.copy() for p in layer.blobs]
        finally:
            caffe.set_mode_cpu()
    for a, b in zip(out["cpu"], out["gpu"]):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11)
