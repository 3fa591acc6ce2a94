"""ONNX export of the fork and sequence layers as they landed in ``layers/``: each a small net built
from prototxt text, exported, and proven by the built-in check (ONNX Runtime against the layer's own
forward, every blob within 1e-5 of its range). Inputs that must hold valid values (indices, masks,
selectors, rois, flags) are fed explicitly; a few converters are also compared with numpy here."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_testing import export_and_check, make_net

from pycaffe_lite.onnx import ExportError, export_net

RNG = np.random.default_rng(11)


def inputs(*named) -> str:
    """An Input layer with one top per (name, shape)."""
    tops = " ".join(f'top: "{n}"' for n, _ in named)
    shapes = " ".join("shape { " + " ".join(f"dim: {d}" for d in s) + " }" for _, s in named)
    return f'name: "t"\nlayer {{ name: "in" type: "Input" {tops} input_param {{ {shapes} }} }}\n'


def check_with(net, feeds: dict, **kwargs):
    """Export and check on ``feeds`` only (random inputs would not be valid indices or masks)."""
    feeds = {k: np.asarray(v, np.float32) for k, v in feeds.items()}
    report = export_net(net, None, check_inputs=[feeds], random_check=False, **kwargs)
    onnx.checker.check_model(report.exported.model, full_check=True)
    assert len(report.checks) == 1 and report.checks[0].ok, report.checks[0].table()
    assert all(r.verdict.startswith("ok") for r in report.checks[0].rows), report.checks[0].table()
    return report


def ort_run(report, feeds):
    sess = ort.InferenceSession(report.exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {k: np.asarray(v, np.float32) for k, v in feeds.items()})


def test_depthwise_types():
    net = make_net(inputs(("data", (2, 4, 7, 7))) + '''
    layer { name: "dw" type: "DepthwiseConvolution" bottom: "data" top: "dw"
            convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 2 } }
    layer { name: "cd" type: "ConvolutionDepthwise" bottom: "dw" top: "cd"
            convolution_param { num_output: 8 kernel_size: 3 dilation: 2 pad: 2 bias_term: false } }
    ''')
    report = export_and_check(net)
    groups = [a.i for n in report.exported.model.graph.node if n.op_type == "Conv" for a in n.attribute
              if a.name == "group"]
    assert groups == [4, 8]


@pytest.mark.parametrize("axis_shape", [(1, (2, 3, 6, 5)), (2, (2, 2, 3, 6, 5))])
def test_im2col(axis_shape):
    axis, shape = axis_shape
    net = make_net(inputs(("data", shape)) + f'''
    layer {{ name: "cols" type: "Im2col" bottom: "data" top: "cols"
            convolution_param {{ kernel_h: 3 kernel_w: 2 stride: 2 pad: 1 dilation: 1 axis: {axis} }} }}''')
    report = export_and_check(net)
    x = RNG.standard_normal(shape).astype(np.float32)
    (y,) = ort_run(report, {"data": x})
    # numpy: channel (c, kh, kw) at output (i, j) holds x[c, 2i - 1 + kh, 2j - 1 + kw], 0 outside
    img = x.reshape(-1, 3, 6, 5)
    padded = np.pad(img, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ho, wo = (6 + 2 - 3) // 2 + 1, (5 + 2 - 2) // 2 + 1
    ref = np.stack([padded[:, :, kh:kh + 2 * ho:2, kw:kw + 2 * wo:2][:, :, :ho, :wo]
                    for kh in range(3) for kw in range(2)], axis=2)
    np.testing.assert_array_equal(y.reshape(ref.shape[0], -1), ref.reshape(ref.shape[0], -1))


def test_axpy():
    net = make_net(inputs(("a", (2, 3)), ("x", (2, 3, 4, 5)), ("y", (2, 3, 4, 5)), ("a4", (2, 3, 1, 1))) + '''
    layer { name: "axpy" type: "Axpy" bottom: "a" bottom: "x" bottom: "y" top: "z" }
    layer { name: "axpy4" type: "Axpy" bottom: "a4" bottom: "x" bottom: "z" top: "z4" }''')
    report = export_and_check(net)
    a, x, y = (RNG.standard_normal(s).astype(np.float32) for s in ((2, 3), (2, 3, 4, 5), (2, 3, 4, 5)))
    (z4,) = ort_run(report, {"a": a, "x": x, "y": y, "a4": a.reshape(2, 3, 1, 1)})
    ax = a[:, :, None, None] * x
    np.testing.assert_allclose(z4, ax + (ax + y), rtol=1e-6, atol=1e-6)


BN_LAYOUTS = {
    "pspnet_test": ("TEST", 'bn_param { slope_filler { type: "gaussian" } bias_filler { type: "gaussian" } }'),
    "pspnet_frozen_train": ("TRAIN", 'bn_param { frozen: true eps: 1e-3 }'),
    "pspnet_train": ("TRAIN", 'bn_param { slope_filler { type: "gaussian" } eps: 1e-4 }'),
    "segnet_inference": ("TEST", 'bn_param { bn_mode: INFERENCE scale_filler { type: "gaussian" } '
                                 'shift_filler { type: "gaussian" } }'),
    "segnet_learn": ("TEST", 'bn_param { scale_filler { type: "gaussian" } shift_filler { type: "gaussian" } }'),
}


@pytest.mark.parametrize("layout", sorted(BN_LAYOUTS))
def test_bn(layout):
    from google.protobuf import text_format

    from pycaffe_lite import common
    from pycaffe_lite.net import Net
    from pycaffe_lite.schema import caffe_pb2

    phase, param = BN_LAYOUTS[layout]
    tops = 'top: "y" top: "m" top: "v"' if layout == "segnet_learn" else 'top: "y"'
    text = inputs(("data", (3, 4, 5, 2))) + f'layer {{ name: "bn" type: "BN" bottom: "data" {tops} {param} }}'
    common.set_mode_cpu()
    net = Net(text_format.Parse(text, caffe_pb2.NetParameter()), phase=getattr(common, phase))
    blobs = net.params["bn"]
    if len(blobs) == 4:  # plausible running statistics
        blobs[2].data[...] = RNG.normal(0, 1, blobs[2].shape)
        blobs[3].data[...] = RNG.uniform(0.2, 2, blobs[3].shape)
    report = export_and_check(net)
    if layout == "segnet_learn":
        assert report.exported.outputs == ["y", "m", "v"]


def test_batch_reindex_and_filter():
    net = make_net(inputs(("data", (5, 3, 2)), ("idx", (5,)), ("sel", (5, 1))) + '''
    layer { name: "re" type: "BatchReindex" bottom: "data" bottom: "idx" top: "re" }
    layer { name: "f" type: "Filter" bottom: "data" bottom: "re" bottom: "sel" top: "fd" top: "fr" }''',
                   random=False)
    data = RNG.standard_normal((5, 3, 2))
    idx = np.array([4, 0, 0, 2, 3])
    sel = np.array([[1], [0], [0], [2.5], [-1]])
    report = check_with(net, {"data": data, "idx": idx, "sel": sel})
    fd, fr = ort_run(report, {"data": data, "idx": idx, "sel": sel})
    keep = [0, 3, 4]
    np.testing.assert_array_equal(fd, data[keep].astype(np.float32))
    np.testing.assert_array_equal(fr, data[idx][keep].astype(np.float32))
    out = report.exported.model.graph.output[0].type.tensor_type.shape.dim[0]
    assert out.dim_param == "selected"
    report = check_with(net, {"data": data, "idx": idx, "sel": sel}, dynamic_batch=True)
    fd, fr = ort_run(report, {"data": data[:4], "idx": idx[:4] % 4, "sel": sel[:4]})
    np.testing.assert_array_equal(fd, data[[0, 3]].astype(np.float32))


def test_reverse_and_transpose():
    net = make_net(inputs(("data", (4, 2, 3, 5))) + '''
    layer { name: "rev" type: "Reverse" bottom: "data" top: "rev" reverse_param { axis: 2 } }
    layer { name: "rev0" type: "Reverse" bottom: "rev" top: "rev0" }
    layer { name: "tr" type: "Transpose" bottom: "rev0" top: "tr" transpose_param { dim: 3 dim: 0 dim: 2 dim: 1 } }''')
    report = export_and_check(net)
    x = RNG.standard_normal((4, 2, 3, 5)).astype(np.float32)
    (y,) = ort_run(report, {"data": x})
    np.testing.assert_array_equal(y, x[::-1, :, ::-1].transpose(3, 0, 2, 1))


def test_lstm_unit():
    net = make_net(inputs(("c_prev", (1, 3, 4)), ("gates", (1, 3, 16)), ("cont", (1, 3))) + '''
    layer { name: "unit" type: "LSTMUnit" bottom: "c_prev" bottom: "gates" bottom: "cont" top: "c" top: "h" }''')
    c_prev, gates = RNG.standard_normal((1, 3, 4)), RNG.standard_normal((1, 3, 16)) * 2
    cont = np.array([[1, 0, 1]])
    report = check_with(net, {"c_prev": c_prev, "gates": gates, "cont": cont})
    c, h = ort_run(report, {"c_prev": c_prev, "gates": gates, "cont": cont})
    sig = 1 / (1 + np.exp(-gates.reshape(3, 4, 4)))
    g = np.tanh(gates.reshape(3, 4, 4)[:, 3])
    ref_c = cont.reshape(3, 1) * sig[:, 1] * c_prev[0] + sig[:, 0] * g
    np.testing.assert_allclose(c[0], ref_c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h[0], sig[:, 2] * np.tanh(ref_c), rtol=1e-5, atol=1e-6)


def test_ctpn_lstm():
    body = '''layer { name: "lstm" type: "Lstm" bottom: "x" top: "h"
        lstm_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" } } }'''
    net = make_net(inputs(("x", (6, 2, 3, 1))) + body)
    report = export_and_check(net)
    assert any(n.op_type == "LSTM" for n in report.exported.model.graph.node)
    clipped = make_net(inputs(("x", (6, 2, 3)), ("clip", (6, 2))) + body.replace('bottom: "x"', 'bottom: "x" bottom: "clip"'))
    with pytest.raises(ExportError, match=r"layer 'lstm' \(Lstm\).*clip"):
        export_and_check(clipped)


def _mask(n, c, h, w, k, s, out_hw, rng):
    """A valid MAX-pooling mask: each cell names a position inside its window (flat in the output)."""
    ho, wo = out_hw
    r = np.arange(h)[:, None] * s + rng.integers(0, k, (n, c, h, w))
    q = np.arange(w)[None, :] * s + rng.integers(0, k, (n, c, h, w))
    return np.minimum(r, ho - 1) * wo + np.minimum(q, wo - 1)


@pytest.mark.parametrize("form", ["mask", "start", "recompute", "recompute_big", "ave", "tile", "pooling_param_ave"])
def test_unpooling(form):
    n, c, h, w = 2, 3, 3, 4
    params = {
        "mask": 'unpooling_param { unpool: MAX kernel_size: 2 stride: 2 }',
        "start": 'unpooling_param { unpool: MAX kernel_size: 3 stride: 2 }',
        "recompute": 'unpooling_param { unpool: MAX kernel_size: 3 stride: 2 }',
        "recompute_big": 'unpooling_param { unpool: MAX kernel_size: 3 stride: 2 }',
        "ave": 'unpooling_param { unpool: AVE kernel_size: 3 stride: 2 unpool_h: 8 unpool_w: 8 }',
        "tile": 'unpooling_param { unpool: TILE kernel_size: 2 stride: 3 }',
        "pooling_param_ave": 'pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }',
    }[form]
    named = [("x", (n, c, h, w))]
    bottoms = 'bottom: "x"'
    feeds = {"x": RNG.standard_normal((n, c, h, w))}
    if form == "mask":
        named.append(("mask", (n, c, h, w)))
        bottoms += ' bottom: "mask"'
        feeds["mask"] = _mask(n, c, h, w, 2, 2, (6, 8), RNG)
    if form.startswith("recompute"):  # big: the pre-pooling input holds more windows than x has cells
        pre = (n, c, 7, 9) if form == "recompute" else (n, c, 10, 12)
        named.append(("pre", pre))
        bottoms += ' bottom: "pre"'
        feeds["pre"] = RNG.standard_normal(pre)
    ltype = "UnPooling" if form == "tile" else "Unpooling"
    net = make_net(inputs(*named) + f'layer {{ name: "un" type: "{ltype}" {bottoms} top: "y" {params} }}')
    check_with(net, feeds)


def test_upsample_segnet_mask_and_yolo():
    n, c, h, w = 1, 2, 3, 4
    net = make_net(inputs(("x", (n, c, h, w)), ("mask", (n, c, h, w))) + '''
    layer { name: "up" type: "Upsample" bottom: "x" bottom: "mask" top: "up" upsample_param { scale: 2 } }
    layer { name: "up2" type: "Upsample" bottom: "x" bottom: "mask" top: "up2"
            upsample_param { upsample_h: 5 upsample_w: 8 } }
    layer { name: "yolo" type: "Upsample" bottom: "x" top: "yolo" upsample_param { scale_h: 2 scale_w: 3 } }''')
    mask = _mask(n, c, h, w, 2, 2, (5, 8), RNG)
    x = RNG.standard_normal((n, c, h, w))
    report = check_with(net, {"x": x, "mask": mask})
    up = ort_run(report, {"x": x, "mask": mask})[0]
    ref = np.zeros((n * c, 6 * 8))
    ref[np.arange(n * c)[:, None], mask.reshape(n * c, -1)] = x.reshape(n * c, -1)
    np.testing.assert_array_equal(up, ref.reshape(n, c, 6, 8).astype(np.float32))


def test_dynamic_batch_scatter():
    net = make_net(inputs(("x", (2, 2, 3, 4)), ("mask", (2, 2, 3, 4))) + '''
    layer { name: "up" type: "Upsample" bottom: "x" bottom: "mask" top: "up" upsample_param { scale: 2 } }''')
    mask = _mask(2, 2, 3, 4, 2, 2, (6, 8), RNG)
    report = check_with(net, {"x": RNG.standard_normal((2, 2, 3, 4)), "mask": mask}, dynamic_batch=True)
    mask3 = _mask(3, 2, 3, 4, 2, 2, (6, 8), RNG)
    x3 = RNG.standard_normal((3, 2, 3, 4))
    (up,) = ort_run(report, {"x": x3, "mask": mask3})
    assert up.shape == (3, 2, 6, 8)
    np.testing.assert_array_equal(up.reshape(6, -1)[np.arange(6)[:, None], mask3.reshape(6, -1)],
                                  x3.reshape(6, -1).astype(np.float32))


def test_detection_evaluate_is_left_out():
    from pycaffe_lite.onnx.registry import DROPPED, load_converters

    assert "DetectionEvaluate" in DROPPED and "DetectionEvaluate" not in load_converters()


@pytest.mark.parametrize("pool", ["kernel_size: 3 stride: 2 pad: 1", "kernel_size: 2 stride: 2", "kernel_size: 3 stride: 2"])
def test_pooling_mask_into_unpooling(pool):
    """MAX pooling's mask top (ceil-rounded windows, padding) feeds DeconvNet's Unpooling."""
    net = make_net(inputs(("x", (2, 3, 7, 9))) + f'''
    layer {{ name: "pool" type: "Pooling" bottom: "x" top: "p" top: "mask" pooling_param {{ pool: MAX {pool} }} }}
    layer {{ name: "un" type: "Unpooling" bottom: "p" bottom: "mask" top: "y"
            unpooling_param {{ unpool: MAX kernel_size: 2 stride: 2 unpool_h: 7 unpool_w: 9 }} }}''')
    report = export_and_check(net)
    assert all(r.verdict == "ok" for r in report.checks[0].rows if r.row.layer in ("pool", "un"))


@pytest.mark.parametrize("ltype", ["LSTM", "RNN"])
@pytest.mark.parametrize("variant", ["plain", "static", "exposed"])
def test_bvlc_recurrent_scan(ltype, variant):
    """BVLC's RNN / LSTM as a Scan: cont resets mid-sequence, a static input, exposed h0/c0."""
    T, N, D = 5, 3, 4
    named = [("x", (T, N, 2, 3)), ("cont", (T, N))]
    bottoms = 'bottom: "x" bottom: "cont"'
    tops = 'top: "y"'
    feeds = {"x": RNG.standard_normal((T, N, 2, 3)),
             "cont": np.array([[0, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 1], [0, 1, 1]])}
    if variant == "static":
        named.append(("xs", (N, 5)))
        bottoms += ' bottom: "xs"'
        feeds["xs"] = RNG.standard_normal((N, 5))
    expose = variant == "exposed"
    if expose:
        states = ["h0", "c0"] if ltype == "LSTM" else ["h0"]
        for s in states:
            named.append((s, (1, N, D)))
            feeds[s] = RNG.standard_normal((1, N, D))
        bottoms += "".join(f' bottom: "{s}"' for s in states)
        tops += "".join(f' top: "{s[0]}T"' for s in states)
        feeds["cont"][0] = 1  # step 1 continues from the exposed state
    net = make_net(inputs(*named) + f'''
    layer {{ name: "rec" type: "{ltype}" {bottoms} {tops} recurrent_param {{ num_output: {D} expose_hidden: {str(expose).lower()}
             weight_filler {{ type: "uniform" min: -0.5 max: 0.5 }} bias_filler {{ type: "uniform" min: -0.5 max: 0.5 }} }} }}''')
    report = check_with(net, feeds)
    assert any(n.op_type == "Scan" for n in report.exported.model.graph.node)
    if not expose:
        assert any("zero initial state" in note for note in report.exported.notes)


def test_depthwise_bn_folded():
    net = make_net(inputs(("data", (2, 4, 6, 6))) + '''
    layer { name: "dw" type: "ConvolutionDepthwise" bottom: "data" top: "dw" convolution_param { kernel_size: 3 pad: 1 } }
    layer { name: "bn" type: "BatchNorm" bottom: "dw" top: "dw" }
    layer { name: "sc" type: "Scale" bottom: "dw" top: "dw" scale_param { bias_term: true } }''')
    report = export_and_check(net, fold_bn=True)
    assert [n.op_type for n in report.exported.model.graph.node] == ["Conv"]


@pytest.mark.parametrize("ltype", ["Lstm", "LSTM"])
def test_recurrent_dynamic_batch(ltype):
    """With a dynamic first axis (here the time axis T) the recurrent exports run other lengths."""
    bvlc = ltype == "LSTM"
    named = [("x", (4, 2, 3))] + ([("cont", (4, 2))] if bvlc else [])
    param = "recurrent_param" if bvlc else "lstm_param"
    net = make_net(inputs(*named) + f'''
    layer {{ name: "l" type: "{ltype}" bottom: "x"{' bottom: "cont"' if bvlc else ""} top: "h" {param} {{ num_output: 3
             weight_filler {{ type: "gaussian" std: 0.5 }} }} }}''')
    feeds = {"x": RNG.standard_normal((4, 2, 3))}
    if bvlc:
        feeds["cont"] = np.array([[0, 0], [1, 1], [1, 0], [1, 1]])
    report = check_with(net, feeds, dynamic_batch=True)
    feeds = {"x": RNG.standard_normal((6, 2, 3))}
    if bvlc:
        feeds["cont"] = np.ones((6, 2)) * (np.arange(6) > 0)[:, None]
    (h,) = ort_run(report, feeds)
    assert h.shape == (6, 2, 3)


def test_fp16_keeps_computed_constants():
    """With fp16 weights, constants the converters compute (AVE unpooling's 1 / window size) stay
    float32: only param blobs are rounded, as the check's reference rounds them."""
    net = make_net(inputs(("x", (1, 2, 7, 7))) + '''
    layer { name: "p" type: "Pooling" bottom: "x" top: "p" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
    layer { name: "u" type: "Unpooling" bottom: "p" top: "u" unpooling_param { unpool: AVE kernel_size: 3 stride: 2 } }
    layer { name: "c" type: "Im2col" bottom: "u" top: "c" convolution_param { kernel_size: 2 } }''')
    export_and_check(net, fp16=True)
