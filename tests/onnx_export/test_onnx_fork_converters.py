"""The fork layers' converters (SSD, PSPNet, Faster R-CNN, ShuffleNet, YOLO and MobileNet ports),
run on their own in ONNX Runtime against numpy versions of the forks' forward passes, so they are
tested before the layers themselves land; with the layers, the export check covers them in nets."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_testing import randomize  # noqa: F401  (skips this module without onnx)

from pycaffe_lite.blob import Blob
from pycaffe_lite.onnx import CONVERTERS, load_converters
from pycaffe_lite.onnx.graph import GraphBuilder, LayerContext

RNG = np.random.default_rng(7)


def run(type_name: str, params: dict, inputs: list[np.ndarray], top_shape, blobs=(), dynamic=False, layer=None):
    """Convert a stand-in layer of ``type_name`` with ``params`` (its LayerParameter fields) and run it."""
    load_converters()
    g = GraphBuilder(17)
    names = []
    for i, x in enumerate(inputs):
        name = f"in{i}"
        g.add_input(name, ["N", *x.shape[1:]] if dynamic else list(x.shape))
        names.append(name)
    if layer is None:
        layer = SimpleNamespace(name="L", type=type_name, layer_param=SimpleNamespace(**params),
                                blobs=[SimpleNamespace(cpu_data=lambda a=a: a, math_data=lambda a=a: a) for a in blobs])
    g.used.add("out")
    ctx = LayerContext(g, layer, names, [tuple(x.shape) for x in inputs], [tuple(top_shape)], ["out"],
                       dynamic_batch=dynamic)
    out = CONVERTERS[type_name](ctx)[0]
    g.add_output(out, ["N", *top_shape[1:]] if dynamic else list(top_shape))
    model = g.model("t")
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: x.astype(np.float32) for n, x in zip(names, inputs)})[0]


def test_relu6():
    x = RNG.normal(0, 5, (2, 3, 4))
    np.testing.assert_allclose(run("ReLU6", {}, [x], x.shape), np.clip(x, 0, 6), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("order,perm", [([0, 2, 3, 1], [0, 2, 3, 1]), ([0, 3], [0, 3, 1, 2]), ([], [0, 1, 2, 3])])
def test_permute(order, perm):
    x = RNG.normal(size=(2, 3, 4, 5))
    y = run("Permute", {"permute_param": SimpleNamespace(order=order)}, [x], x.transpose(perm).shape)
    np.testing.assert_array_equal(y, x.transpose(perm).astype(np.float32))


@pytest.mark.parametrize("across", [True, False])
@pytest.mark.parametrize("shared", [True, False])
def test_normalize(across, shared):
    x = RNG.normal(size=(2, 4, 3, 5))
    scale = np.array([2.5]) if shared else RNG.uniform(1, 20, 4)
    p = SimpleNamespace(across_spatial=across, channel_shared=shared, eps=1e-10)
    y = run("Normalize", {"norm_param": p}, [x], x.shape, blobs=[scale])
    ref = np.empty_like(x)
    for n in range(2):  # SSD's loop: eps inside the square root
        if across:
            ref[n] = x[n] / np.sqrt((x[n] ** 2).sum() + 1e-10)
        else:
            ref[n] = x[n] / np.sqrt(1e-10 + (x[n] ** 2).sum(axis=0, keepdims=True))
        ref[n] *= scale[0] if shared else scale[:, None, None]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dynamic", [False, True])
def test_shuffle_channel(dynamic):
    x = RNG.normal(size=(2, 6, 3, 2))
    y = run("ShuffleChannel", {"shuffle_channel_param": SimpleNamespace(group=3)}, [x], x.shape, dynamic=dynamic)
    ref = np.empty_like(x)
    k = 2
    for i in range(k):  # output channel i*g + j holds input channel j*k + i
        for j in range(3):
            ref[:, i * 3 + j] = x[:, j * k + i]
    np.testing.assert_array_equal(y, ref.astype(np.float32))


def _roi_pool_ref(x, rois, ph, pw, scale):
    """Fast R-CNN's forward, written out."""
    out = np.zeros((len(rois), x.shape[1], ph, pw))
    h, w = x.shape[2:]
    for r, (b, x1, y1, x2, y2) in enumerate(rois):
        sw, sh, ew, eh = (int(np.floor(v * scale + 0.5)) for v in (x1, y1, x2, y2))
        rh, rw = max(eh - sh + 1, 1), max(ew - sw + 1, 1)
        for i in range(ph):
            for j in range(pw):
                h0 = min(max(int(np.floor(i * rh / ph)) + sh, 0), h)
                h1 = min(max(int(np.ceil((i + 1) * rh / ph)) + sh, 0), h)
                w0 = min(max(int(np.floor(j * rw / pw)) + sw, 0), w)
                w1 = min(max(int(np.ceil((j + 1) * rw / pw)) + sw, 0), w)
                if h1 > h0 and w1 > w0:
                    out[r, :, i, j] = x[int(b), :, h0:h1, w0:w1].max(axis=(1, 2))
    return out


def test_roi_pooling():
    x = RNG.normal(size=(2, 3, 12, 10))
    rois = np.array([[0, 0, 0, 30, 40], [1, 8.3, 4.1, 22.7, 17.2], [1, 36, 44, 39, 46], [0, 5, 5, 5, 5]], float)
    p = SimpleNamespace(pooled_h=3, pooled_w=2, spatial_scale=0.25)
    y = run("ROIPooling", {"roi_pooling_param": p}, [x, rois], (4, 3, 3, 2))
    np.testing.assert_allclose(y, _roi_pool_ref(x, rois, 3, 2, 0.25), rtol=1e-6, atol=1e-6)


def _interp_ref(x, oh, ow):
    """Bilinear with corners aligned, as PSPNet's caffe_cpu_interp2."""
    n, c, h, w = x.shape
    out = np.zeros((n, c, oh, ow))
    rh = (h - 1) / (oh - 1) if oh > 1 else 0.0
    rw = (w - 1) / (ow - 1) if ow > 1 else 0.0
    for i in range(oh):
        hr = rh * i
        h0 = int(hr)
        hp = 1 if h0 < h - 1 else 0
        lh = hr - h0
        for j in range(ow):
            wr = rw * j
            w0 = int(wr)
            wp = 1 if w0 < w - 1 else 0
            lw = wr - w0
            out[:, :, i, j] = ((1 - lh) * ((1 - lw) * x[:, :, h0, w0] + lw * x[:, :, h0, w0 + wp])
                               + lh * ((1 - lw) * x[:, :, h0 + hp, w0] + lw * x[:, :, h0 + hp, w0 + wp]))
    return out


@pytest.mark.parametrize("pads,out_hw,dynamic", [((0, 0), (9, 13), False), ((-1, -2), (7, 5), False),
                                                 ((0, 0), (3, 2), True)])
def test_interp(pads, out_hw, dynamic):
    x = RNG.normal(size=(2, 3, 5, 7))
    p = SimpleNamespace(pad_beg=pads[0], pad_end=pads[1])
    y = run("Interp", {"interp_param": p}, [x], (2, 3, *out_hw), dynamic=dynamic)
    crop = x[:, :, -pads[0]:x.shape[2] + pads[1], -pads[0]:x.shape[3] + pads[1]]
    np.testing.assert_allclose(y, _interp_ref(crop, *out_hw), rtol=1e-5, atol=1e-5)


def test_upsample_nearest():
    x = RNG.normal(size=(2, 3, 4, 5))
    y = run("Upsample", {"upsample_param": SimpleNamespace(scale=2)}, [x], (2, 3, 8, 10))
    np.testing.assert_array_equal(y, x.repeat(2, axis=2).repeat(2, axis=3).astype(np.float32))


def test_prior_box_is_a_constant():
    """PriorBox's top is computed by the layer (from shapes only) and stored as a constant."""
    top = Blob((1, 2, 8), np.float32)
    priors = RNG.uniform(0, 1, (1, 2, 8)).astype(np.float32)

    class FakePriorBox:
        name, type, layer_param, blobs = "pb", "PriorBox", SimpleNamespace(), []

        def forward_cpu(self, bottom, tops):
            tops[0].mutable_cpu_data()[...] = priors

    load_converters()
    g = GraphBuilder(17)
    g.add_input("feat", [1, 4, 2, 2])
    g.used.add("out")
    ctx = LayerContext(g, FakePriorBox(), ["feat"], [(1, 4, 2, 2)], [(1, 2, 8)], ["out"],
                       bottom_blobs=[Blob((1, 4, 2, 2), np.float32)], top_blobs=[top])
    out = CONVERTERS["PriorBox"](ctx)[0]
    g.add_output(out, None)
    sess = ort.InferenceSession(g.model("t").SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"feat": np.zeros((1, 4, 2, 2), np.float32)})[0], priors)


def test_two_bottom_upsample_scatters_at_the_mask():
    x = RNG.normal(size=(1, 2, 2, 2))
    mask = np.array([[[[0, 3], [9, 14]], [[5, 2], [8, 15]]]])
    y = run("Upsample", {}, [x, mask], (1, 2, 4, 4))
    ref = np.zeros((2, 16))
    ref[np.arange(2)[:, None], mask.reshape(2, 4)] = x.reshape(2, 4)
    np.testing.assert_array_equal(y, ref.reshape(1, 2, 4, 4).astype(np.float32))


class Msg(SimpleNamespace):
    """A stand-in protobuf message: HasField is true for the fields given."""

    def HasField(self, name):  # noqa: N802  (protobuf's name)
        return name in vars(self)


def _detections_ref(loc, conf, prior, num_classes, bg, conf_thr, nms_thr, top_k, keep_top_k, code):
    """SSD's DetectionOutput for one image, written out (share_location, eta 1)."""
    P = prior.shape[-1] // 4
    pb, pv = prior.reshape(2, P, 4)
    lo = loc.reshape(P, 4)
    if code == 1:  # CORNER
        boxes = pb + pv * lo
    else:  # CENTER_SIZE
        pw, ph = pb[:, 2] - pb[:, 0], pb[:, 3] - pb[:, 1]
        cx = pv[:, 0] * lo[:, 0] * pw + (pb[:, 0] + pb[:, 2]) / 2
        cy = pv[:, 1] * lo[:, 1] * ph + (pb[:, 1] + pb[:, 3]) / 2
        w, h = np.exp(pv[:, 2] * lo[:, 2]) * pw, np.exp(pv[:, 3] * lo[:, 3]) * ph
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    scores = conf.reshape(P, num_classes)

    def iou(a, b):
        iw, ih = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
        if iw <= 0 or ih <= 0:
            return 0.0
        inter = iw * ih
        return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)

    kept = {}
    for c in range(num_classes):
        if c == bg:
            continue
        cand = [i for i in np.argsort(-scores[:, c], kind="stable") if scores[i, c] > conf_thr][:top_k]
        keep = []
        for i in cand:
            if all(iou(boxes[i], boxes[j]) <= nms_thr for j in keep):
                keep.append(i)
        kept[c] = keep
    pairs = sorted(((scores[i, c], c, i) for c, ks in kept.items() for i in ks), key=lambda t: -t[0])
    if keep_top_k > -1:
        pairs = pairs[:keep_top_k]
    rows = [[0, c, s, *boxes[i]] for s, c, i in sorted(pairs, key=lambda t: (t[1], -t[0]))]
    return np.array(rows or [[0, -1, -1, -1, -1, -1, -1]], np.float64).reshape(1, 1, -1, 7)


@pytest.mark.parametrize("code,conf_thr,keep_top_k,seed", [
    (2, 0.2, 7, 0),    # keep_top_k cuts
    (2, 0.05, -1, 1),  # no keep_top_k: every NMS survivor
    (1, 0.3, 4, 2),    # CORNER code
    (2, 1.0, 5, 3),    # nothing above the threshold: the [0, -1, ...] row
])
def test_detection_output(code, conf_thr, keep_top_k, seed):
    """SSD's decode, per-class top_k + NMS, keep_top_k and row order (label, then score)."""
    P, C = 40, 4
    RNG = np.random.default_rng(seed)
    centers = RNG.uniform(0.1, 0.9, (P, 2))
    sizes = RNG.uniform(0.05, 0.4, (P, 2))
    pb = np.concatenate([centers - sizes / 2, centers + sizes / 2], axis=1)
    pv = np.tile([0.1, 0.1, 0.2, 0.2], (P, 1))
    prior = np.stack([pb, pv]).reshape(1, 2, P * 4)
    loc = RNG.normal(0, 1, (1, P * 4))
    logits = RNG.normal(0, 2, (P, C))
    conf = (np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).reshape(1, P * C)
    p = Msg(num_classes=C, share_location=True, background_label_id=0, code_type=code,
            variance_encoded_in_target=False, keep_top_k=keep_top_k, confidence_threshold=conf_thr,
            nms_param=Msg(nms_threshold=0.45, top_k=12, eta=1.0))
    ref = _detections_ref(loc.astype(np.float32).astype(np.float64), conf.astype(np.float32).astype(np.float64),
                          prior.astype(np.float32).astype(np.float64), C, 0, conf_thr, 0.45, 12, keep_top_k, code)
    y = run("DetectionOutput", {"detection_output_param": p}, [loc, conf, prior], (1, 1, 1, 7))
    assert y.shape == ref.shape and (y.shape[2] > 1 if conf_thr < 1 else y.shape[2] == 1)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
