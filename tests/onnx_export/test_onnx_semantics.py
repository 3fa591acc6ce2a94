"""ONNX export of Caffe's tricky semantics, each as a small net: the built-in check (ONNX Runtime vs
pycaffe-lite's forward, every blob within 1e-5 of its range) must pass, and the pooling cases are
also compared with an independent numpy version of Caffe's rule."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_testing import export_and_check, make_net

from pycaffe_lite.onnx import CONVERTERS, CheckError, ExportError, build

INPUT = 'layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dims} }} }} }}\n'


def dims(*shape: int) -> str:
    return " ".join(f"dim: {d}" for d in shape)


def net_text(shape, body: str) -> str:
    return 'name: "t"\n' + INPUT.format(dims=dims(*shape)) + body


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def caffe_pool_ref(x, k, s, p, ave):
    """Caffe's pooling, written out: ceil rounding, the last window dropped when it starts in the
    padding, MAX over the real pixels, AVE's sum divided by the window clipped to image + padding."""
    n, c, h, w = x.shape

    def out(size):
        o = -(-(size + 2 * p - k) // s) + 1
        if p and (o - 1) * s >= size + p:
            o -= 1
        return o

    ph, pw = out(h), out(w)
    y = np.zeros((n, c, ph, pw))
    for i in range(ph):
        for j in range(pw):
            h0, w0 = i * s - p, j * s - p
            h1, w1 = min(h0 + k, h + p), min(w0 + k, w + p)
            area = (h1 - h0) * (w1 - w0)
            win = x[:, :, max(h0, 0):min(h1, h), max(w0, 0):min(w1, w)]
            y[:, :, i, j] = win.sum(axis=(2, 3)) / area if ave else win.max(axis=(2, 3))
    return y


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
@pytest.mark.parametrize("h,k,s,p", [
    (5, 2, 2, 1),   # ceil gives 4 windows, the 4th would start in the padding: Caffe keeps 3
    (7, 3, 3, 1),   # likewise with stride 3
    (6, 3, 2, 1),   # AVE: the last window overhangs the padded image (divisor 2*3, not 3*3)
    (6, 3, 2, 0),   # ceil without padding: the last window is cut by the image edge
    (8, 3, 2, 0),   # the floor and ceil sizes agree
])
def test_pooling_caffe_rule(pool, h, k, s, p):
    body = (f'layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool" '
            f'pooling_param {{ pool: {pool} kernel_size: {k} stride: {s} pad: {p} }} }}')
    net = make_net(net_text((2, 3, h, h + 1), body))
    report = export_and_check(net)
    x = np.random.default_rng(5).standard_normal((2, 3, h, h + 1)).astype(np.float32)
    (y,) = run_ort(report.exported.model, {"data": x})
    np.testing.assert_allclose(y, caffe_pool_ref(x.astype(np.float64), k, s, p, pool == "AVE"), rtol=1e-5, atol=1e-6)


def test_global_pooling_and_spp():
    body = '''
    layer { name: "gmax" type: "Pooling" bottom: "data" top: "gmax" pooling_param { pool: MAX global_pooling: true } }
    layer { name: "gave" type: "Pooling" bottom: "data" top: "gave" pooling_param { pool: AVE global_pooling: true } }
    layer { name: "spp" type: "SPP" bottom: "data" top: "spp" spp_param { pyramid_height: 3 pool: AVE } }
    layer { name: "spp1" type: "SPP" bottom: "data" top: "spp1" spp_param { pyramid_height: 1 pool: MAX } }
    '''
    export_and_check(make_net(net_text((2, 3, 7, 9), body)))


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_lrn(region):
    body = (f'layer {{ name: "norm" type: "LRN" bottom: "data" top: "norm" lrn_param {{ local_size: 5 '
            f'alpha: 0.3 beta: 0.75 k: 2 norm_region: {region} }} }}')
    net = make_net(net_text((2, 7, 6, 5), body))
    report = export_and_check(net)
    x = report.checks[0].inputs["data"].astype(np.float64)
    (y,) = run_ort(report.exported.model, {"data": x.astype(np.float32)})
    # independent reference: Caffe's formula with alpha divided by the window's element count
    if region == "ACROSS_CHANNELS":
        sq = np.pad(x * x, ((0, 0), (2, 2), (0, 0), (0, 0)))
        win = sum(sq[:, i:i + 7] for i in range(5))
        ref = x * (2 + 0.3 / 5 * win) ** -0.75
    else:
        sq = np.pad(x * x, ((0, 0), (0, 0), (2, 2), (2, 2)))
        win = sum(sq[:, :, i:i + 6, j:j + 5] for i in range(5) for j in range(5))
        ref = x * (1 + 0.3 / 25 * win) ** -0.75  # k is not used within a channel
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=1e-6)


def test_batchnorm_scale_factor_eps_and_scale():
    body = '''
    layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 } }
    layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" batch_norm_param { eps: 0.01 } }
    layer { name: "sc" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
    layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
    layer { name: "bn2" type: "BatchNorm" bottom: "conv" top: "bn2" batch_norm_param { use_global_stats: false } }
    '''
    net = make_net(net_text((3, 2, 6, 6), body))
    assert float(net.params["bn"][2].data[0]) == 7.5
    report = export_and_check(net)
    names = [r.row.value for r in report.checks[0].rows]
    # the in-place chain conv -> bn -> sc -> relu: four distinct values, the last named "conv"
    assert names[1:5] == ["conv/conv", "conv/bn", "conv/sc", "conv"]
    bn_row = report.checks[0].rows[2]
    assert bn_row.row.layer == "bn" and bn_row.verdict == "ok" and bn_row.scale > 0


def test_batchnorm_reference_values():
    body = 'layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" batch_norm_param { eps: 0.001 } }'
    net = make_net(net_text((2, 3, 4, 4), body))
    mean, var, s = (np.array(b.data, np.float64) for b in net.params["bn"])
    report = export_and_check(net)
    x = report.checks[0].inputs["data"].astype(np.float64)
    (y,) = run_ort(report.exported.model, {"data": x.astype(np.float32)})
    m, v = mean / s[0], var / s[0]
    ref = (x - m[None, :, None, None]) / np.sqrt(v[None, :, None, None] + 0.001)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("crop", ["axis: 2 offset: 1 offset: 2", "axis: 1 offset: 1", "axis: 3"])
def test_crop_offsets(crop):
    body = f'''
    layer {{ name: "ref" type: "Input" top: "ref" input_param {{ shape {{ dim: 2 dim: 2 dim: 4 dim: 5 }} }} }}
    layer {{ name: "crop" type: "Crop" bottom: "data" bottom: "ref" top: "crop" crop_param {{ {crop} }} }}
    '''
    net = make_net(net_text((2, 3, 7, 8), body))
    report = export_and_check(net)
    feeds = report.checks[0].inputs
    (y,) = run_ort(report.exported.model, {k: feeds[k] for k in report.exported.inputs})
    x = feeds["data"]
    if crop.startswith("axis: 2"):
        ref = x[:, :, 1:5, 2:7]
    elif crop.startswith("axis: 1"):
        ref = x[:, 1:3, 1:5, 1:6]
    else:
        ref = x[:, :, :, :5]
    np.testing.assert_array_equal(y, ref)


def test_bilinear_deconvolution_and_crop():
    """FCN's upsampling: a grouped Deconvolution with bilinear weights, then Crop to the input."""
    body = '''
    layer { name: "score" type: "Convolution" bottom: "data" top: "score"
            convolution_param { num_output: 3 kernel_size: 3 pad: 5 } }
    layer { name: "pool" type: "Pooling" bottom: "score" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
    layer { name: "up" type: "Deconvolution" bottom: "pool" top: "up" param { lr_mult: 0 }
            convolution_param { num_output: 3 group: 3 kernel_size: 4 stride: 2 bias_term: false
                                weight_filler { type: "bilinear" } } }
    layer { name: "crop" type: "Crop" bottom: "up" bottom: "data" top: "crop" crop_param { axis: 2 offset: 4 } }
    '''
    net = make_net(net_text((1, 3, 9, 10), body), random=False)
    net.params["score"][0].data[...] = np.random.default_rng(1).uniform(-1, 1, net.params["score"][0].shape)
    export_and_check(net)


def test_grouped_dilated_strided_convolution():
    body = '''
    layer { name: "c1" type: "Convolution" bottom: "data" top: "c1"
            convolution_param { num_output: 6 kernel_h: 3 kernel_w: 2 group: 2 dilation: 2 stride_h: 2 stride_w: 1 pad_h: 2 pad_w: 1 } }
    layer { name: "dw" type: "Convolution" bottom: "c1" top: "dw"
            convolution_param { num_output: 6 kernel_size: 3 group: 6 pad: 1 bias_term: false } }
    layer { name: "dc" type: "Deconvolution" bottom: "dw" top: "dc"
            convolution_param { num_output: 4 kernel_size: 3 stride: 2 pad: 1 group: 2 dilation: 2 } }
    '''
    export_and_check(make_net(net_text((2, 4, 9, 8), body)))


def test_eltwise_coefficients_prod_max():
    body = '''
    layer { name: "a" type: "Power" bottom: "data" top: "a" power_param { scale: 2 shift: 1 } }
    layer { name: "sum" type: "Eltwise" bottom: "data" bottom: "a" top: "sum" eltwise_param { operation: SUM coeff: 1.5 coeff: -0.25 } }
    layer { name: "prod" type: "Eltwise" bottom: "data" bottom: "a" bottom: "sum" top: "prod" eltwise_param { operation: PROD } }
    layer { name: "max" type: "Eltwise" bottom: "prod" bottom: "a" top: "max" eltwise_param { operation: MAX } }
    '''
    report = export_and_check(make_net(net_text((2, 3, 4, 4), body)))
    x = report.checks[0].inputs["data"].astype(np.float64)
    y = run_ort(report.exported.model, {"data": x.astype(np.float32)})
    a = 2 * x + 1
    np.testing.assert_allclose(y[-1], np.maximum(x * a * (1.5 * x - 0.25 * a), a), rtol=1e-5, atol=1e-5)


def test_reshape_flatten_slice_concat_tile_softmax():
    body = '''
    layer { name: "r" type: "Reshape" bottom: "data" top: "r" reshape_param { shape { dim: 0 dim: -1 dim: 4 } } }
    layer { name: "r2" type: "Reshape" bottom: "r" top: "r2" reshape_param { axis: 1 shape { dim: 3 dim: -1 } } }
    layer { name: "f" type: "Flatten" bottom: "r2" top: "f" flatten_param { axis: 1 end_axis: 2 } }
    layer { name: "f2" type: "Flatten" bottom: "data" top: "f2" }
    layer { name: "sl" type: "Slice" bottom: "data" top: "s0" top: "s1" top: "s2" slice_param { axis: 1 slice_point: 1 slice_point: 2 } }
    layer { name: "cat" type: "Concat" bottom: "s2" bottom: "s0" top: "cat" concat_param { axis: 1 } }
    layer { name: "tile" type: "Tile" bottom: "s1" top: "tile" tile_param { axis: 2 tiles: 3 } }
    layer { name: "sm" type: "Softmax" bottom: "tile" top: "sm" softmax_param { axis: 2 } }
    layer { name: "sm1" type: "Softmax" bottom: "cat" top: "sm1" }
    '''
    export_and_check(make_net(net_text((2, 3, 4, 4), body)))


def test_inner_product_axis_and_transpose():
    body = '''
    layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 5 } }
    layer { name: "ip2" type: "InnerProduct" bottom: "data" top: "ip2" inner_product_param { num_output: 3 axis: 2 transpose: true } }
    layer { name: "ip3" type: "InnerProduct" bottom: "ip" top: "ip3" inner_product_param { num_output: 2 bias_term: false } }
    '''
    export_and_check(make_net(net_text((2, 3, 4, 5), body)))


def test_neurons():
    layers = {
        "relu": 'type: "ReLU"', "leaky": 'type: "ReLU" relu_param { negative_slope: 0.1 }',
        "prelu": 'type: "PReLU"', "prelu_s": 'type: "PReLU" prelu_param { channel_shared: true }',
        "elu": 'type: "ELU" elu_param { alpha: 0.7 }', "sig": 'type: "Sigmoid"', "tanh": 'type: "TanH"',
        "abs": 'type: "AbsVal"', "bnll": 'type: "BNLL"',
        "pow": 'type: "Power" power_param { power: 2 scale: 0.5 shift: 3 }',
        "pow1": 'type: "Power" power_param { scale: -2 shift: 0.5 }',
        "exp": 'type: "Exp" exp_param { base: 2 scale: 0.5 shift: 1 }', "exp_e": 'type: "Exp"',
        "thr": 'type: "Threshold" threshold_param { threshold: 0.2 }',
        "clip": 'type: "Clip" clip_param { min: -0.5 max: 0.7 }',
        "swish": 'type: "Swish" swish_param { beta: 1.5 }', "swish1": 'type: "Swish"',
        "drop": 'type: "Dropout" dropout_param { dropout_ratio: 0.3 }',
    }
    body = "".join(f'layer {{ name: "{n}" {t} bottom: "data" top: "{n}" }}\n' for n, t in layers.items())
    body += '''
    layer { name: "pos" type: "AbsVal" bottom: "data" top: "pos" }
    layer { name: "log" type: "Log" bottom: "pos" top: "log" log_param { base: 10 scale: 2 shift: 1 } }
    layer { name: "ln" type: "Log" bottom: "pos" top: "ln" log_param { shift: 1 } }
    '''
    report = export_and_check(make_net(net_text((2, 3, 4, 5), body)))
    assert "drop" in report.exported.outputs  # a TEST-time identity, kept as an output by name


def test_in_place_neurons_and_dropout_chain():
    body = '''
    layer { name: "ip" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 6 } }
    layer { name: "relu" type: "ReLU" bottom: "fc" top: "fc" }
    layer { name: "drop" type: "Dropout" bottom: "fc" top: "fc" }
    '''
    report = export_and_check(make_net(net_text((2, 5), body)))
    rows = [(r.row.layer, r.row.value) for r in report.checks[0].rows]
    assert rows == [("data", "data"), ("ip", "fc/ip"), ("relu", "fc/relu"), ("drop", "fc/relu")]
    assert report.exported.outputs == ["fc"]


def test_scale_bias_mvn_reduction_argmax_embed_parameter():
    body = '''
    layer { name: "p" type: "Parameter" top: "p" parameter_param { shape { dim: 3 dim: 4 } } }
    layer { name: "sc2" type: "Scale" bottom: "data" bottom: "p" top: "sc2" scale_param { axis: 1 } }
    layer { name: "b2" type: "Bias" bottom: "sc2" bottom: "p" top: "b2" }
    layer { name: "sc" type: "Scale" bottom: "data" top: "sc" scale_param { axis: 1 num_axes: 2 } }
    layer { name: "b" type: "Bias" bottom: "sc" top: "b" bias_param { axis: 2 num_axes: 1 } }
    layer { name: "mvn" type: "MVN" bottom: "data" top: "mvn" }
    layer { name: "mvn2" type: "MVN" bottom: "data" top: "mvn2" mvn_param { across_channels: true normalize_variance: false } }
    layer { name: "sum" type: "Reduction" bottom: "data" top: "sum" reduction_param { axis: 1 coeff: 2 } }
    layer { name: "asum" type: "Reduction" bottom: "data" top: "asum" reduction_param { operation: ASUM axis: 2 } }
    layer { name: "sumsq" type: "Reduction" bottom: "data" top: "sumsq" reduction_param { operation: SUMSQ } }
    layer { name: "mean" type: "Reduction" bottom: "data" top: "mean" reduction_param { operation: MEAN axis: -1 coeff: -1 } }
    layer { name: "am" type: "ArgMax" bottom: "data" top: "am" argmax_param { top_k: 3 } }
    layer { name: "amv" type: "ArgMax" bottom: "data" top: "amv" argmax_param { top_k: 2 out_max_val: true } }
    layer { name: "amx" type: "ArgMax" bottom: "data" top: "amx" argmax_param { axis: 1 } }
    layer { name: "amxv" type: "ArgMax" bottom: "data" top: "amxv" argmax_param { axis: 3 top_k: 2 out_max_val: true } }
    '''
    export_and_check(make_net(net_text((2, 3, 4, 5), body)))


def test_embed():
    body = '''
    layer { name: "emb" type: "Embed" bottom: "data" top: "emb" embed_param { input_dim: 7 num_output: 4 } }
    layer { name: "emb2" type: "Embed" bottom: "data" top: "emb2" embed_param { input_dim: 7 num_output: 3 bias_term: false } }
    '''
    report = export_and_check(make_net(net_text((2, 5), body)))
    idx = report.checks[0].inputs["data"]
    assert idx.min() >= 0 and idx.max() < 7 and np.all(idx == np.round(idx))


@pytest.mark.parametrize("opset", [13, 18])
def test_opsets(opset):
    body = '''
    layer { name: "mvn" type: "MVN" bottom: "data" top: "mvn" }
    layer { name: "sum" type: "Reduction" bottom: "mvn" top: "sum" reduction_param { operation: SUMSQ axis: 1 } }
    layer { name: "sl" type: "Slice" bottom: "data" top: "s0" top: "s1" slice_param { axis: 1 } }
    '''
    report = export_and_check(make_net(net_text((2, 4, 3, 3), body)), opset=opset)
    assert report.exported.model.opset_import[0].version == opset


def test_opset_out_of_range():
    net = make_net(net_text((1, 2), 'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }'))
    with pytest.raises(ExportError, match="opset 9"):
        net.to_onnx(None, opset=9)


def test_unknown_type_names_layer(monkeypatch):
    build(make_net(net_text((1, 2), 'layer { name: "t" type: "TanH" bottom: "data" top: "t" }')))  # loads converters
    monkeypatch.delitem(CONVERTERS, "TanH")
    net = make_net(net_text((1, 2), 'layer { name: "my_tanh" type: "TanH" bottom: "data" top: "t" }'))
    with pytest.raises(ExportError, match=r"layer 'my_tanh' \(TanH\): no ONNX converter for layer type 'TanH'"):
        net.to_onnx(None)


def test_pooling_mask_top():
    """MAX pooling's mask top: each window's first maximum as the flat h * W + w of the input plane
    (numpy here), ceil-rounded windows clipped at the edge."""
    body = ('layer { name: "pool" type: "Pooling" bottom: "data" top: "pool" top: "mask" '
            'pooling_param { pool: MAX kernel_size: 2 stride: 2 } }')
    report = export_and_check(make_net(net_text((1, 2, 5, 5), body)))
    x = np.random.default_rng(4).standard_normal((1, 2, 5, 5)).astype(np.float32)
    pool, mask = run_ort(report.exported.model, {"data": x})
    ref = np.zeros((1, 2, 3, 3), np.float32)
    for c in range(2):
        for i in range(3):
            for j in range(3):
                win = x[0, c, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
                r, q = np.unravel_index(np.argmax(win), win.shape)
                ref[0, c, i, j] = (2 * i + r) * 5 + 2 * j + q
    np.testing.assert_array_equal(mask, ref)
    np.testing.assert_array_equal(pool, np.take_along_axis(x.reshape(1, 2, 25), ref.reshape(1, 2, 9).astype(int),
                                                           2).reshape(1, 2, 3, 3))


def test_mismatch_names_first_diverging_layer(monkeypatch):
    """The check is not a rubber stamp: a converter that is off by a little is caught at its layer."""
    import pycaffe_lite.onnx.ops_neuron as ops

    def bad_sigmoid(ctx):
        y = ctx.op("Sigmoid", [ctx.bottoms[0]])
        return [ctx.op("Mul", [y, ctx.const("oops", 1.0001)], ctx.out(0))]

    build(make_net(net_text((1, 2), 'layer { name: "t" type: "TanH" bottom: "data" top: "t" }')))
    monkeypatch.setitem(CONVERTERS, "Sigmoid", bad_sigmoid)
    body = '''
    layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 4 } }
    layer { name: "sig" type: "Sigmoid" bottom: "ip" top: "sig" }
    layer { name: "ip2" type: "InnerProduct" bottom: "sig" top: "ip2" inner_product_param { num_output: 3 } }
    '''
    net = make_net(net_text((2, 5), body))
    with pytest.raises(CheckError, match=r"first diverging layer 'sig' \(Sigmoid\)"):
        net.to_onnx(None)
    assert ops.sigmoid is not bad_sigmoid
    report = net.to_onnx(None, raise_on_mismatch=False)
    table = report.checks[0].table()
    assert "MISMATCH" in table and "FAIL" in table and "first diverging layer 'sig'" in table


def test_fold_batchnorm_and_scale():
    body = '''
    layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 } }
    layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" batch_norm_param { eps: 0.01 } }
    layer { name: "sc" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
    layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
    layer { name: "conv2" type: "Convolution" bottom: "conv" top: "conv2" convolution_param { num_output: 3 kernel_size: 1 bias_term: false } }
    layer { name: "bn2" type: "BatchNorm" bottom: "conv2" top: "bn2" }
    layer { name: "bn3" type: "BatchNorm" bottom: "bn2" top: "bn3" }
    layer { name: "sc3" type: "Scale" bottom: "bn3" top: "sc3" }
    layer { name: "bn4" type: "BatchNorm" bottom: "sc3" top: "bn4" }
    '''
    net = make_net(net_text((2, 2, 6, 6), body))
    plain = export_and_check(net)
    report = export_and_check(net, fold_bn=True)
    ops = [n.op_type for n in report.exported.model.graph.node]
    assert ops == ["Conv", "Relu", "Conv", "BatchNormalization", "BatchNormalization"]
    verdicts = {r.row.layer: r.verdict for r in report.checks[0].rows}
    assert verdicts["conv"] == verdicts["bn"] == "folded into 'sc'" and verdicts["sc"] == "ok"
    assert verdicts["conv2"] == "folded into 'bn2'" and verdicts["bn2"] == "ok"
    assert verdicts["bn3"] == "folded into 'sc3'" and verdicts["sc3"] == verdicts["bn4"] == "ok"
    # the same outputs either way
    x = report.checks[0].inputs["data"]
    a = run_ort(plain.exported.model, {"data": x})
    b = run_ort(report.exported.model, {"data": x})
    np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-5 * np.abs(a[0]).max())


def test_two_inputs_in_place_on_an_input_and_shared_weights():
    """An in-place layer on a graph input gets its own value (the input keeps its name); a
    Convolution/Deconvolution with two bottoms applies the same weights to each."""
    text = '''name: "t"
    layer { name: "data" type: "Input" top: "data" top: "aux" input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } } }
    layer { name: "pw" type: "Power" bottom: "data" top: "data" power_param { scale: 2 } }
    layer { name: "conv" type: "Convolution" bottom: "data" bottom: "aux" top: "c1" top: "c2" convolution_param { num_output: 2 kernel_size: 3 } }
    layer { name: "dc" type: "Deconvolution" bottom: "c1" bottom: "c2" top: "d1" top: "d2" convolution_param { num_output: 2 kernel_size: 3 } }
    '''
    report = export_and_check(make_net(text))
    assert [r.row.value for r in report.checks[0].rows][:3] == ["data", "aux", "data/pw"]
    assert report.exported.outputs == ["d1", "d2"] and list(report.exported.inputs) == ["data", "aux"]
