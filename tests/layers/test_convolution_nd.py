"""N-D Convolution / Deconvolution (1-D, 3-D, 4-D, force_nd_im2col): forward against naive loops,
float64 gradients on CPU and GPU, CPU-vs-GPU agreement, BVLC's geometry rules."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def layer_text(kind: str, body: str) -> str:
    return (f'name: "l" type: "{kind}" convolution_param {{ {body} weight_filler {{ type: "gaussian" std: 0.5 }} '
            f'bias_filler {{ type: "uniform" min: -1 max: 1 }} }}')


def _axes(values, d, default):
    values = list(values) or [default]
    return tuple(values * d) if len(values) == 1 else tuple(values)


def naive_conv_nd(x, w, bias, kernel, pad, stride, dilation, group):
    """Every output element and kernel tap visited explicitly (zero padding)."""
    n, c, *size = x.shape
    m = w.shape[0]
    out = [(s + 2 * p - (d * (k - 1) + 1)) // st + 1 for s, k, p, st, d in zip(size, kernel, pad, stride, dilation)]
    cg, mg = c // group, m // group
    y = np.zeros((n, m, *out))
    for g in range(group):
        for o in itertools.product(*map(range, out)):
            for k in itertools.product(*map(range, kernel)):
                i = [oo * st - p + kk * d for oo, kk, p, st, d in zip(o, k, pad, stride, dilation)]
                if all(0 <= ii < s for ii, s in zip(i, size)):
                    xs = x[(slice(None), slice(g * cg, (g + 1) * cg), *i)]
                    ws = w[(slice(g * mg, (g + 1) * mg), slice(None), *k)]
                    y[(slice(None), slice(g * mg, (g + 1) * mg), *o)] += xs @ ws.T
    if bias is not None:
        y += np.asarray(bias).reshape((m,) + (1,) * len(out))
    return y


def naive_deconv_nd(x, w, bias, kernel, pad, stride, dilation, group):
    """Transposed convolution by scattering every input element through every kernel tap."""
    n, c, *size = x.shape
    m = w.shape[1] * group
    out = [st * (s - 1) + d * (k - 1) + 1 - 2 * p for s, k, p, st, d in zip(size, kernel, pad, stride, dilation)]
    cg, mg = c // group, m // group
    y = np.zeros((n, m, *out))
    for g in range(group):
        for i in itertools.product(*map(range, size)):
            for k in itertools.product(*map(range, kernel)):
                o = [ii * st - p + kk * d for ii, kk, p, st, d in zip(i, k, pad, stride, dilation)]
                if all(0 <= oo < s for oo, s in zip(o, out)):
                    xs = x[(slice(None), slice(g * cg, (g + 1) * cg), *i)]  # (N, cg)
                    ws = w[(slice(g * cg, (g + 1) * cg), slice(None), *k)]  # (cg, mg)
                    y[(slice(None), slice(g * mg, (g + 1) * mg), *o)] += xs @ ws
    if bias is not None:
        y += np.asarray(bias).reshape((m,) + (1,) * len(out))
    return y


# (bottom shape, body, kernel, pad, stride, dilation, group)
CONFIGS = [
    ((2, 3, 9), "num_output: 4 kernel_size: 3 stride: 2 pad: 1", (3,), (1,), (2,), (1,), 1),
    ((2, 2, 5, 6, 4), "num_output: 3 kernel_size: 3 pad: 1", (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1),
    ((1, 4, 7, 6, 5), "num_output: 4 kernel_size: 3 kernel_size: 2 kernel_size: 1 stride: 2 stride: 1 stride: 2 "
     "pad: 1 pad: 0 pad: 1 dilation: 1 dilation: 2 dilation: 1 group: 2",
     (3, 2, 1), (1, 0, 1), (2, 1, 2), (1, 2, 1), 2),
    ((2, 3, 4, 5, 4), "num_output: 3 kernel_size: 2 group: 3 bias_term: false", (2, 2, 2), (0, 0, 0), (1, 1, 1),
     (1, 1, 1), 3),
    ((1, 2, 3, 4, 3, 4), "num_output: 2 kernel_size: 2 stride: 1 pad: 1", (2,) * 4, (1,) * 4, (1,) * 4, (1,) * 4, 1),
]


def _run(kind, shape, body, seed=0):
    rng = np.random.default_rng(seed)
    layer = make_layer(layer_text(kind, body))
    bottom, top = blobs([rng.standard_normal(shape)]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("shape,body,kernel,pad,stride,dilation,group", CONFIGS)
def test_convolution_forward_matches_naive(mode, shape, body, kernel, pad, stride, dilation, group):
    layer, bottom, top = _run("Convolution", shape, body)
    assert layer.nd
    bias = layer.blobs[1].data if len(layer.blobs) > 1 else None
    want = naive_conv_nd(bottom[0].data, layer.blobs[0].data, bias, kernel, pad, stride, dilation, group)
    assert top[0].shape == want.shape
    np.testing.assert_allclose(top[0].data, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape,body,kernel,pad,stride,dilation,group", CONFIGS)
def test_deconvolution_forward_matches_naive(mode, shape, body, kernel, pad, stride, dilation, group):
    layer, bottom, top = _run("Deconvolution", shape, body)
    assert layer.blobs[0].shape == (shape[1], layer.num_output // group) + kernel
    bias = layer.blobs[1].data if len(layer.blobs) > 1 else None
    want = naive_deconv_nd(bottom[0].data, layer.blobs[0].data, bias, kernel, pad, stride, dilation, group)
    assert top[0].shape == want.shape
    np.testing.assert_allclose(top[0].data, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
def test_force_nd_im2col_matches_2d_path(mode, kind):
    body = "num_output: 4 kernel_size: 3 kernel_size: 2 stride: 2 stride: 1 pad: 1 dilation: 1 dilation: 2 group: 2"
    plain, bottom, top = _run(kind, (2, 4, 7, 6), body)
    forced, fbottom, ftop = _run(kind, (2, 4, 7, 6), body + " force_nd_im2col: true")
    assert forced.nd and not plain.nd
    for p, q in zip(forced.blobs, plain.blobs):
        p.data[...] = q.data
    fbottom[0].data[...] = bottom[0].data
    forced.forward(fbottom, ftop)
    np.testing.assert_allclose(ftop[0].data, top[0].data, rtol=1e-12, atol=1e-12)
    for layer, b, t in ((plain, bottom, top), (forced, fbottom, ftop)):
        t[0].diff[...] = np.linspace(-1, 1, t[0].count).reshape(t[0].shape)
        layer.backward(t, [True], b)
    np.testing.assert_allclose(fbottom[0].diff, bottom[0].diff, rtol=1e-12, atol=1e-12)
    for p, q in zip(forced.blobs, plain.blobs):
        np.testing.assert_allclose(p.diff, q.diff, rtol=1e-12, atol=1e-12)


GRAD_CONFIGS = [
    ((2, 2, 5), "num_output: 2 kernel_size: 3 stride: 2 pad: 1"),
    ((1, 2, 4, 3, 4), "num_output: 2 kernel_size: 2 kernel_size: 3 kernel_size: 2 stride: 2 stride: 1 stride: 1 "
     "pad: 1 pad: 1 pad: 0 dilation: 1 dilation: 1 dilation: 2"),
    ((2, 4, 3, 3, 3), "num_output: 2 kernel_size: 2 group: 2"),
]


@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("shape,body", GRAD_CONFIGS)
@pytest.mark.slow
def test_gradient(mode, kind, shape, body):
    rng = np.random.default_rng(5)
    layer = make_layer(layer_text(kind, body))
    bottom, top = blobs([rng.standard_normal(shape)]), empty_blobs(1)
    checked = GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)
    assert checked == bottom[0].count + sum(b.count for b in layer.blobs)


def test_channel_axis_two_3d(mode):
    """axis: 2 leaves two batch axes; spatial axes are the three after it."""
    rng = np.random.default_rng(1)
    layer = make_layer(layer_text("Convolution", "num_output: 2 kernel_size: 2 axis: 2"))
    x = rng.standard_normal((2, 3, 2, 3, 4, 3))
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape == (2, 3, 2, 2, 3, 2)
    want = naive_conv_nd(x.reshape(6, 2, 3, 4, 3), layer.blobs[0].data, layer.blobs[1].data, (2, 2, 2), (0,) * 3,
                         (1,) * 3, (1,) * 3, 1)
    np.testing.assert_allclose(top[0].data.reshape(want.shape), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind,shape,body,match", [
    ("Convolution", (1, 2, 4, 4, 4), "num_output: 2 kernel_size: 5", r"larger than the input \(4, 4, 4\)"),
    ("Convolution", (1, 2, 4, 4, 4), "num_output: 2 kernel_size: 2 stride: 1 stride: 2", "stride has 2 values"),
    ("Convolution", (1, 2, 4, 4, 4), "num_output: 2 kernel_size: 2 dilation: 0", "dilation must be positive"),
    ("Convolution", (1, 2, 4), "num_output: 2 kernel_size: 2 pad_h: 1 pad_w: 1", "pad_h and pad_w can only"),
    ("Deconvolution", (1, 2, 2, 2, 2), "num_output: 2 kernel_size: 1 pad: 1", "smaller than twice the pad"),
    ("Convolution", (1, 2, 4, 4, 4), "num_output: 2 kernel_size: 3 engine: WINOGRAD",
     "engine WINOGRAD runs 2-D convolutions only.*3 spatial axes"),
    ("Convolution", (1, 2, 4, 4), "num_output: 2 kernel_size: 3 engine: DEPTHWISE force_nd_im2col: true",
     "engine DEPTHWISE runs 2-D convolutions only.*force_nd_im2col"),
])
def test_errors(kind, shape, body, match):
    layer = make_layer(layer_text(kind, body))
    with pytest.raises(NetError, match=match) as info:
        layer.setup(blobs([np.zeros(shape)]), empty_blobs(1))
    assert "layer 'l'" in str(info.value)


def test_reshape_keeps_axis_count():
    layer, bottom, top = _run("Convolution", (1, 2, 4, 4, 4), "num_output: 2 kernel_size: 2")
    bottom[0].reshape((1, 2, 4, 4))
    with pytest.raises(NetError, match="must keep 3 spatial axes"):
        layer.reshape(bottom, top)


def test_net_3d_conv_relu_pool_trains():
    """A 3-D net through the Net (the Convolution -> ReLU fusion included) builds and runs backward."""
    import pycaffe_lite as caffe
    from pycaffe_lite.net_spec import NetSpec

    ns = NetSpec()
    ns.data = caffe.layers.Input(shape=dict(dim=[2, 1, 6, 6, 6]))
    ns.conv = caffe.layers.Convolution(ns.data, num_output=2, kernel_size=3, pad=1,
                                       weight_filler=dict(type="gaussian", std=0.3))
    ns.relu = caffe.layers.ReLU(ns.conv, in_place=True)
    ns.up = caffe.layers.Deconvolution(ns.relu, convolution_param=dict(num_output=1, kernel_size=2, stride=2,
                                                                      weight_filler=dict(type="gaussian", std=0.3)))
    ns.loss = caffe.layers.EuclideanLoss(ns.up, caffe.layers.DummyData(shape=dict(dim=[2, 1, 12, 12, 12])))
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".prototxt", delete=False) as f:
        f.write(str(ns.to_proto()))
    net = caffe.Net(f.name, caffe.TRAIN)
    rng = np.random.default_rng(2)
    net.blobs["data"].data[...] = rng.standard_normal((2, 1, 6, 6, 6))
    net.forward()
    conv = net.blobs["conv"].data.copy()
    assert conv.shape == (2, 2, 6, 6, 6) and conv.min() >= 0
    net.backward()
    assert np.abs(net.params["conv"][0].diff).sum() > 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("shape,body", [(c[0], c[1]) for c in CONFIGS] + [
    ((2, 4, 6, 5), "num_output: 2 kernel_size: 3 stride: 2 pad: 1 force_nd_im2col: true")])
def test_cpu_gpu_agree(shape, body, dtype, kind):
    rng = np.random.default_rng(3)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else {}
    assert_cpu_gpu_agree(layer_text(kind, body), [rng.standard_normal(shape)], dtype=dtype, **tol)


NET_3D = """
name: "v" input: "data" input_shape { dim: 1 dim: 2 dim: 4 dim: 5 dim: 4 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" batch_norm_param { use_global_stats: true } }
layer { name: "sc" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
"""


def test_3d_test_net_folds_batchnorm_like_unfused(tmp_path, monkeypatch):
    (tmp_path / "n.prototxt").write_text(NET_3D)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 4, 5, 4))
    outs = []
    for fusion in ("1", "0"):
        monkeypatch.setenv("PYCAFFE_LITE_FUSION", fusion)
        caffe_net = __import__("pycaffe_lite").Net(str(tmp_path / "n.prototxt"), 1)  # TEST
        r = np.random.default_rng(9)
        for name in ("conv", "bn", "sc"):
            for blob in caffe_net.params[name]:
                blob.data[...] = r.uniform(0.5, 1.5, blob.data.shape)
        outs.append(caffe_net.forward(data=x)["pool"].copy())
    assert outs[0].shape == (1, 3, 2, 3, 2)
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)


NET_3D_TRAIN = """
name: "vol"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 1 dim: 6 dim: 6 dim: 6 } } }
layer { name: "target" type: "DummyData" top: "target"
        dummy_data_param { shape { dim: 2 dim: 1 dim: 6 dim: 6 dim: 6 } data_filler { type: "constant" value: 0.5 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.4 }
                            bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "dw" type: "DepthwiseConvolution" bottom: "conv" top: "dw"
        convolution_param { kernel_size: 3 kernel_size: 1 kernel_size: 3 pad: 1 pad: 0 pad: 1
                            weight_filler { type: "gaussian" std: 0.4 } } }
layer { name: "pool" type: "Pooling" bottom: "dw" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "avg" type: "Pooling" bottom: "pool" top: "avg" pooling_param { pool: AVE kernel_size: 3 stride: 1 pad: 1 } }
layer { name: "up" type: "Deconvolution" bottom: "avg" top: "up"
        convolution_param { num_output: 1 kernel_size: 2 stride: 2 weight_filler { type: "gaussian" std: 0.4 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "up" bottom: "target" top: "loss" }
"""


@pytest.mark.gpu
def test_3d_net_trains_alike_on_cpu_and_gpu():
    """SGD steps of a 3-D net (N-D Convolution, DepthwiseConvolution, MAX/AVE pooling, Deconvolution) on both
    devices, the GPU ones through the executor's captured training iterations: same weights after."""
    import pycaffe_lite as caffe
    from pycaffe_lite.proto.protoio import parse_text
    from pycaffe_lite.schema import caffe_pb2
    from pycaffe_lite.solvers import sgd_solvers

    results = []
    for gpu in (False, True):
        caffe.set_mode_gpu() if gpu else caffe.set_mode_cpu()
        try:
            text = f'net_param {{ {NET_3D_TRAIN} }} base_lr: 0.002 lr_policy: "fixed" momentum: 0.9 random_seed: 4'
            s = sgd_solvers.SOLVERS["SGD"](parse_text(text, caffe_pb2.SolverParameter()), dtype=np.float64,
                                           progress=False)
            s.net.blobs["data"].data[...] = np.random.default_rng(1).normal(size=(2, 1, 6, 6, 6))
            s.step(4)
            results.append([b.data.copy() for b in s.net.learnable_params])
        finally:
            caffe.set_mode_cpu()
    for a, b in zip(*results):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-10)


VNET_STYLE = """name: "vnet_tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 1 dim: 8 dim: 8 dim: 8 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 1 dim: 1 dim: 8 dim: 8 dim: 8 } } }
layer { name: "conv_in" type: "Convolution" bottom: "data" top: "conv_in"
  convolution_param { num_output: 4 kernel_size: 5 pad: 2 stride: 1 weight_filler { type: "xavier" } engine: CAFFE } }
layer { name: "bn_in" type: "BatchNorm" bottom: "conv_in" top: "conv_in" }
layer { name: "prelu_in" type: "PReLU" bottom: "conv_in" top: "conv_in" }
layer { name: "down" type: "Convolution" bottom: "conv_in" top: "down"
  convolution_param { num_output: 8 kernel_size: 2 stride: 2 weight_filler { type: "xavier" } } }
layer { name: "prelu_d" type: "PReLU" bottom: "down" top: "down" }
layer { name: "up" type: "Deconvolution" bottom: "down" top: "up"
  convolution_param { num_output: 4 kernel_size: 2 stride: 2 weight_filler { type: "xavier" } } }
layer { name: "sum" type: "Eltwise" bottom: "up" bottom: "conv_in" top: "sum" }
layer { name: "cat" type: "Concat" bottom: "sum" bottom: "conv_in" top: "cat" }
layer { name: "score" type: "Convolution" bottom: "cat" top: "score"
  convolution_param { num_output: 2 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss" }
"""


def _vnet_pass(tmp_path, gpu: bool):
    import pycaffe_lite as caffe

    (tmp_path / "vnet.prototxt").write_text(VNET_STYLE)
    caffe.set_mode_gpu() if gpu else caffe.set_mode_cpu()
    try:
        caffe.set_random_seed(3)
        net = caffe.Net(str(tmp_path / "vnet.prototxt"), caffe.TRAIN)
        rng = np.random.default_rng(6)
        net.blobs["data"].data[...] = rng.random((1, 1, 8, 8, 8))
        net.blobs["label"].data[...] = rng.random((1, 1, 8, 8, 8)) > 0.5
        loss = float(net.forward()["loss"])
        net.backward()
        return loss, [p.diff.copy() for name in ("conv_in", "down", "up", "score") for p in net.params[name]]
    finally:
        caffe.set_mode_cpu()


def test_vnet_style_net_runs_forward_and_backward(tmp_path):
    """A V-Net-shaped 3-D net (5x5x5 conv, BatchNorm, PReLU, strided down-conv, Deconvolution up, Eltwise,
    Concat, 1x1x1 scores, SoftmaxWithLoss over voxels) builds, and its gradients reach every layer."""
    loss, diffs = _vnet_pass(tmp_path, gpu=False)
    assert 0 < loss < 5
    assert all(np.abs(d).sum() > 0 for d in diffs)


@pytest.mark.gpu
def test_vnet_style_net_cpu_gpu_agree(tmp_path):
    cpu_loss, cpu_diffs = _vnet_pass(tmp_path, gpu=False)
    gpu_loss, gpu_diffs = _vnet_pass(tmp_path, gpu=True)
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-4)
    for a, b in zip(cpu_diffs, gpu_diffs):
        np.testing.assert_allclose(b, a, rtol=2e-3, atol=1e-4)
