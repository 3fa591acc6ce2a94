"""Deconvolution: forward against a naive scatter loop, FCN bilinear upsampling, gradients, errors;
on the GPU per forced engine (gradients, CPU-vs-GPU agreement, chunking), the pass-to-engine
mapping, the shared autotune, and forced engines that cannot run a geometry."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer


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
        ((1, 3), "num_output: 2 kernel_size: 3", "no spatial axis"),
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


def test_problem_is_the_transposed_convolution():
    """The engines run the convolution from this layer's top to its bottom, with the weight blob
    as its weights: the problem a Convolution with the mirrored shapes has."""
    de, _, top = _run((2, 4, 3, 5), "num_output: 6 kernel_h: 3 kernel_w: 2 group: 2 stride: 2 pad: 1 dilation: 2")
    conv = make_layer('name: "c" type: "Convolution" convolution_param { num_output: 4 kernel_h: 3 kernel_w: 2 '
                      'group: 2 stride: 2 pad: 1 dilation: 2 }')
    conv.setup(blobs([np.zeros(top[0].shape)]), empty_blobs(1))
    assert de.problem == conv.problem
    assert conv.blobs[0].shape == de.blobs[0].shape


# -- GPU engines -------------------------------------------------------------------------------
ENGINES = ["GEMM", "IMPLICIT_GEMM", "WINOGRAD"]  # the engine field values that force each engine


def _winograd_geometry(body: str) -> bool:
    """Winograd F(2x2, 3x3) runs 3x3 kernels, stride 1, no dilation, group 1, pad <= 2."""
    return ("kernel_size: 3" in body and not any(f in body for f in ("stride", "dilation", "group", "kernel_h"))
            and "pad: 3" not in body)


def _engine_cases(configs):
    return [(shape, body, e) for shape, body in configs for e in ENGINES if e != "WINOGRAD" or _winograd_geometry(body)]


ENGINE_CONFIGS = CONFIGS + [((2, 3, 4, 5), "num_output: 4 kernel_size: 3 pad: 1"),
                            ((1, 2, 5, 4), "num_output: 3 kernel_size: 3 pad: 2 bias_term: false")]
ENGINE_GRAD_CONFIGS = GRAD_CONFIGS + [((1, 3, 4, 4), "num_output: 2 kernel_size: 3 pad: 1")]


@pytest.mark.parametrize("shape,body", ENGINE_CONFIGS)
def test_winograd_geometry_matches_the_engine(shape, body):
    from pycaffe_lite.conv import engines as conv_engines

    layer, _, _ = _run(shape, body)
    assert conv_engines.ENGINES["winograd"].supports(layer.problem) == _winograd_geometry(body)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,body,engine", _engine_cases(ENGINE_CONFIGS))
def test_cpu_gpu_agree(dtype, shape, body, engine):
    x = np.random.default_rng(9).standard_normal(shape)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    assert_cpu_gpu_agree(deconv_text(_fill(f"{body} engine: {engine}")), [x], rtol=tol, atol=tol, dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,body,engine", _engine_cases(ENGINE_GRAD_CONFIGS))
def test_gpu_gradient_per_engine(gpu_mode, shape, body, engine):
    rng = np.random.default_rng(5)
    layer = make_layer(deconv_text(_fill(f"{body} engine: {engine}")))
    bottom, top = blobs([rng.standard_normal(shape)]), empty_blobs(1)
    checked = GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)
    assert checked == bottom[0].count + sum(b.count for b in layer.blobs)


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["GEMM", "WINOGRAD"])
def test_gpu_chunked_batches_agree(monkeypatch, engine):
    """Tiny scratch budgets make the im2col and Winograd engines run one image per chunk."""
    from pycaffe_lite.conv import gemm, winograd

    monkeypatch.setattr(gemm, "COL_BUFFER_BYTES", 1)
    monkeypatch.setattr(winograd, "BUFFER_BYTES", 1)
    x = np.random.default_rng(11).standard_normal((3, 2, 4, 3))
    assert_cpu_gpu_agree(deconv_text(_fill(f"num_output: 3 kernel_size: 3 pad: 1 engine: {engine}")), [x],
                         rtol=1e-10, atol=1e-10)


@pytest.mark.gpu
@pytest.mark.parametrize("mix", [("gemm", "winograd", "implicit-32x64"), ("winograd", "implicit-64x128", "gemm"),
                                 ("implicit-128x128", "gemm", "winograd")])
def test_gpu_passes_use_their_own_engine(monkeypatch, mix):
    """Forward is the engines' data-gradient pass, the bottom diff their forward, the weight diff
    their weight pass: each runs on the engine the choice names for that pass, and the mix agrees
    with the CPU."""
    from pycaffe_lite.conv import engines as conv_engines
    from pycaffe_lite.conv.engines import Choice

    body = _fill("num_output: 3 kernel_size: 3 pad: 1")
    x = np.random.default_rng(2).standard_normal((2, 4, 5, 4))
    cpu_layer, cpu_bottom, cpu_top = run_layer(deconv_text(body), [x])
    calls = []
    real_run = conv_engines.run
    monkeypatch.setattr(conv_engines, "run", lambda prob, choice, p, *args: (
        calls.append((p, getattr(choice, p))), real_run(prob, choice, p, *args)))
    caffe.set_mode_gpu()
    try:
        caffe.set_random_seed(5)
        layer = make_layer(deconv_text(body))
        bottom, top = blobs([x]), empty_blobs(1)
        layer.setup(bottom, top)
        layer._choice = choice = Choice(*mix)
        layer.forward(bottom, top)
        assert calls == [("backward_data", choice.backward_data)]
        top[0].diff[...] = cpu_top[0].diff
        for p in layer.blobs:
            p.diff[...] = 0.25
        layer.backward(top, [True], bottom)
        assert calls[1:] == [("backward_weight", choice.backward_weight), ("forward", choice.forward)]
        got = [top[0].data, bottom[0].diff] + [p.diff for p in layer.blobs]
    finally:
        caffe.set_mode_cpu()
    want = [cpu_top[0].data, cpu_bottom[0].diff] + [p.diff for p in cpu_layer.blobs]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


@pytest.mark.gpu
def test_gpu_autotune_per_pass_shared_with_convolution():
    """The autotune times every engine on each pass of the transposed convolution, keeps the
    fastest per pass, and caches the choice: the same object for the layer's later calls, for
    another layer of that shape, and for the Convolution that has the same problem."""
    from pycaffe_lite.conv import engines as conv_engines

    conv_engines.clear_cache()
    caffe.set_mode_gpu()
    try:
        layer = make_layer(deconv_text(_fill("num_output: 4 kernel_size: 3 pad: 1")), np.float32)
        bottom, top = blobs([np.ones((2, 6, 5, 5))], np.float32), empty_blobs(1, np.float32)
        layer.setup(bottom, top)
        layer.forward(bottom, top)
        choice = layer.engine_choice()
        assert len(conv_engines.cached_choices()) == 1
        supported = {n for n, e in conv_engines.ENGINES.items() if e.supports(layer.problem)}
        # 3x3 stride 1 pad 1, group 1; tensor cores need TF32 allowed (fp16/bf16 ones: half blobs)
        assert supported == set(conv_engines.ENGINES) - {"depthwise", *conv_engines.ENGINE_CANDIDATES["TENSOR_CORE"],
                                                         *conv_engines.ENGINE_CANDIDATES["TENSOR_CORE_16"]}
        for p in conv_engines.PASSES:
            timed = {n: ms for q, n, ms in choice.timings if q == p}
            assert set(timed) == {n for n in supported if p in conv_engines.ENGINES[n].passes}
            assert getattr(choice, p) == min(timed, key=timed.get)
        top[0].diff[...] = 1.0
        layer.backward(top, [True], bottom)
        layer.forward(bottom, top)
        assert layer.engine_choice() is choice  # no re-tuning for the same shape
        other = make_layer(deconv_text("num_output: 4 kernel_size: 3 pad: 1"), np.float32)
        other.setup(bottom, empty_blobs(1, np.float32))
        assert other.engine_choice() is choice
        conv = make_layer('name: "c" type: "Convolution" convolution_param { num_output: 6 kernel_size: 3 pad: 1 '
                          'bias_term: false }', np.float32)
        conv.setup(blobs([np.ones(top[0].shape)], np.float32), empty_blobs(1, np.float32))
        assert conv.engine_choice() is choice
        assert len(conv_engines.cached_choices()) == 1
    finally:
        caffe.set_mode_cpu()


@pytest.mark.parametrize("engine,body,match", [
    ("WINOGRAD", "num_output: 2 kernel_size: 3 stride: 2",
     r"engine WINOGRAD needs a 3x3 kernel, stride 1.*kernel \(3, 3\), stride \(2, 2\)"),
    ("WINOGRAD", "num_output: 2 kernel_size: 4",
     r"engine WINOGRAD needs a 3x3 kernel.*kernel \(4, 4\)"),
    ("IMPLICIT_GEMM", "num_output: 2 kernel_size: 3", r"engine IMPLICIT_GEMM needs input and output of at most"),
])
def test_forced_engine_rejects_geometry(monkeypatch, engine, body, match):
    """Checked before any GPU work (so this runs without a GPU), with the layer and its geometry."""
    if engine == "IMPLICIT_GEMM":
        monkeypatch.setattr("pycaffe_lite.gpu.backend.INT32_MAX", 50)  # a "too large" problem
    layer = make_layer(deconv_text(f"{body} engine: {engine}"))
    layer.setup(blobs([np.zeros((1, 3, 5, 5))]), empty_blobs(1))
    with pytest.raises(NetError, match=match) as info:
        layer.engines()
    assert str(info.value).startswith("layer 'deconv' (Deconvolution): ")


@pytest.mark.gpu
def test_gpu_forward_with_impossible_engine_raises():
    caffe.set_mode_gpu()
    try:
        layer = make_layer(deconv_text("num_output: 2 kernel_size: 3 stride: 2 engine: WINOGRAD"))
        bottom, top = blobs([np.zeros((1, 3, 4, 4))]), empty_blobs(1)
        layer.setup(bottom, top)
        with pytest.raises(NetError, match="layer 'deconv'.*WINOGRAD needs a 3x3 kernel, stride 1"):
            layer.forward(bottom, top)
    finally:
        caffe.set_mode_cpu()
