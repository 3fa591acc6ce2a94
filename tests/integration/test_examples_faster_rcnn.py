"""examples/faster_rcnn: anchors, box transforms, NMS (CPU and GPU) against naive references, the
ported Python layers on hand-made inputs, and the detection and training scripts end to end."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe

HERE = Path(__file__).resolve().parents[2] / "examples" / "faster_rcnn"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "lib"))



def _script(name):
    """An example script as a module of its own name (``frcnn_<name>``), whatever else is called so."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"frcnn_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


anchors_mod = importlib.import_module("rpn.generate_anchors")
bt = importlib.import_module("fast_rcnn.bbox_transform")
config = importlib.import_module("fast_rcnn.config")
nms_pkg = importlib.import_module("nms")


def naive_iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]) + 1)
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]) + 1)
    inter = iw * ih
    return inter / ((a[2] - a[0] + 1) * (a[3] - a[1] + 1) + (b[2] - b[0] + 1) * (b[3] - b[1] + 1) - inter)


def naive_nms(boxes, scores, thresh):
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    keep = []
    for i in order:
        if all(naive_iou(boxes[i], boxes[k]) <= thresh for k in keep):
            keep.append(i)
    return keep


def random_boxes(n, seed, size=100):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, size, (n, 2))
    wh = rng.uniform(5, 40, (n, 2))
    return np.hstack([xy, xy + wh]), rng.uniform(0, 1, n)


def test_anchors():
    a = anchors_mod.generate_anchors()
    assert a.shape == (9, 4)
    w, h = a[:, 2] - a[:, 0] + 1, a[:, 3] - a[:, 1] + 1
    np.testing.assert_allclose((a[:, 0] + a[:, 2]) / 2, 7.5)  # centred on the 16 x 16 base box
    np.testing.assert_allclose((a[:, 1] + a[:, 3]) / 2, 7.5)
    for i, ratio in enumerate((0.5, 1, 2)):
        for j, scale in enumerate((8, 16, 32)):
            k = 3 * i + j
            assert abs(h[k] / w[k] - ratio) < 0.1
            assert abs(np.sqrt(w[k] * h[k]) / (16 * scale) - 1) < 0.05
    shifted = anchors_mod.shifted_anchors(a, 2, 3, 16)
    assert shifted.shape == (2 * 3 * 9, 4)
    np.testing.assert_array_equal(shifted[9 * 4 + 2], a[2] + [16, 16, 16, 16])  # row 1, column 1


def test_bbox_transform_roundtrip_and_overlaps():
    boxes, _ = random_boxes(20, 1)
    gt, _ = random_boxes(20, 2)
    deltas = bt.bbox_transform(boxes, gt)
    back = bt.bbox_transform_inv(boxes, deltas)
    np.testing.assert_allclose(back[:, :2], gt[:, :2], atol=1e-9)
    np.testing.assert_allclose(back[:, 2:], gt[:, 2:] + 1, atol=1e-9)  # the inverse ends one pixel out
    ov = bt.bbox_overlaps(boxes, gt)
    for i in range(0, 20, 3):
        for j in range(0, 20, 4):
            assert ov[i, j] == pytest.approx(naive_iou(boxes[i], gt[j]) if naive_iou(boxes[i], gt[j]) > 0 else 0)
    clipped = bt.clip_boxes(np.array([[-5.0, -1, 500, 40]]), (30, 60))
    np.testing.assert_array_equal(clipped, [[0, 0, 59, 29]])


@pytest.mark.parametrize("thresh", [0.3, 0.5, 0.7])
def test_cpu_nms(thresh):
    boxes, scores = random_boxes(200, 3)
    scores[10] = scores[11]  # a tie: index order
    assert list(nms_pkg.cpu_nms(boxes, scores, thresh)) == naive_nms(boxes, scores, thresh)


def test_nms_param_str():
    assert config.parse_param_str("'feat_stride': 16") == {"feat_stride": 16}
    assert config.parse_param_str("{'num_classes': 21}") == {"num_classes": 21}
    with pytest.raises(ValueError, match="mapping"):
        config.parse_param_str("feat_stride 16")


@pytest.mark.gpu
@pytest.mark.parametrize("n,thresh", [(1, 0.5), (33, 0.5), (500, 0.7), (3000, 0.3)])
def test_gpu_nms_equals_cpu(gpu_mode, n, thresh):
    boxes, scores = random_boxes(n, 4, size=300)
    np.testing.assert_array_equal(nms_pkg.gpu_nms(boxes, scores, thresh), nms_pkg.cpu_nms(boxes, scores, thresh))
    np.testing.assert_array_equal(nms_pkg.nms(boxes, scores, thresh), nms_pkg.cpu_nms(boxes, scores, thresh))


def _python_layer(module, cls, param_str, bottoms, ntop, phase=caffe.TEST):
    from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

    layer = make_layer(f'type: "Python" phase: {"TEST" if phase == caffe.TEST else "TRAIN"} '
                       f'python_param {{ module: "{module}" layer: "{cls}" param_str: "{param_str}" }}',
                       np.float32)
    bottom, top = blobs(bottoms, np.float32), empty_blobs(ntop, np.float32)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return [t.cpu_data().copy() for t in top]


def test_proposal_layer():
    a, h, w = 9, 6, 8
    rng = np.random.default_rng(5)
    prob = np.zeros((1, 2 * a, h, w))
    prob[0, a:] = rng.uniform(0, 0.5, (a, h, w))
    prob[0, a + 4, 2, 3] = 0.99  # anchor 4 (ratio 1, scale 16: 256 x 256 around (7.5, 7.5)) at (row 2, col 3)
    deltas = np.zeros((1, 4 * a, h, w))
    deltas[0, :, :, :] = rng.normal(0, 0.05, (4 * a, h, w))
    deltas[0, 16:20, 2, 3] = 0  # no change to that anchor
    im_info = np.array([[h * 16, w * 16, 1.0]])
    rois, scores = _python_layer("rpn.proposal_layer", "ProposalLayer", "'feat_stride': 16",
                                 [prob, deltas, im_info], 2)
    anchor = anchors_mod.generate_anchors()[4] + [48, 32, 48, 32]
    expected = bt.clip_boxes(anchor[None].copy(), (h * 16, w * 16))[0]
    np.testing.assert_allclose(rois[0], [0, *expected[:2], *(expected[2:] + 0)], atol=1e-3)
    assert scores[0, 0] == pytest.approx(0.99)
    assert len(rois) <= config.cfg.TEST.RPN_POST_NMS_TOP_N
    assert (np.diff(scores[:, 0]) <= 0).all()
    assert (rois[:, 1] >= 0).all() and (rois[:, 3] <= w * 16 - 1).all() and (rois[:, 4] <= h * 16 - 1).all()
    for i in range(min(len(rois), 30)):
        for j in range(i):
            assert naive_iou(rois[i, 1:], rois[j, 1:]) <= config.cfg.TEST.RPN_NMS_THRESH + 1e-6


def test_anchor_target_layer():
    np.random.seed(0)
    a, h, w = 9, 10, 12
    anchor = anchors_mod.generate_anchors()[3] + [64, 80, 64, 80]  # anchor 3 (128 x 128) at (row 5, col 4)
    gt = np.array([[*anchor, 3]])
    im_info = np.array([[h * 16, w * 16, 1.0]])
    labels, targets, inside, outside = _python_layer(
        "rpn.anchor_target_layer", "AnchorTargetLayer", "'feat_stride': 16",
        [np.zeros((1, 2 * a, h, w)), gt, im_info, np.zeros((1, 3, h * 16, w * 16))], 4, caffe.TRAIN)
    assert labels.shape == (1, 1, a * h, w) and targets.shape == (1, 4 * a, h, w)
    lab = labels.reshape(a, h, w)
    assert lab[3, 5, 4] == 1
    np.testing.assert_allclose(targets[0, 12:16, 5, 4], 0, atol=1e-6)
    np.testing.assert_array_equal(inside[0, 12:16, 5, 4], 1)
    counted = (lab >= 0).sum()
    assert 0 < counted <= config.cfg.TRAIN.RPN_BATCHSIZE
    np.testing.assert_allclose(outside[0, 12:16, 5, 4], 1.0 / counted, rtol=1e-6)
    all_anchors = anchors_mod.shifted_anchors(anchors_mod.generate_anchors(), h, w, 16).reshape(h, w, a, 4)
    outside_image = ((all_anchors[..., 0] < 0) | (all_anchors[..., 1] < 0) | (all_anchors[..., 2] >= w * 16)
                     | (all_anchors[..., 3] >= h * 16)).transpose(2, 0, 1)
    assert (lab[outside_image] == -1).all()


def test_proposal_target_layer():
    np.random.seed(0)
    gt = np.array([[10, 10, 60, 80, 2], [100, 20, 150, 70, 5]], np.float64)
    rois = np.array([[0, 12, 11, 61, 79], [0, 100, 100, 140, 140], [0, 90, 10, 150, 75], [0, 0, 0, 20, 20]])
    out_rois, labels, targets, inside, outside = _python_layer(
        "rpn.proposal_target_layer", "ProposalTargetLayer", "'num_classes': 6", [rois, gt], 5, caffe.TRAIN)
    assert targets.shape == (len(out_rois), 24)
    for r, lab, t, iw, ow in zip(out_rois, labels, targets, inside, outside):
        ious = [naive_iou(r[1:], g[:4]) for g in gt]
        best = int(np.argmax(ious))
        if lab > 0:
            assert ious[best] >= 0.5 and lab == gt[best, 4]
            want = bt.bbox_transform(r[None, 1:].astype(np.float64), gt[best:best + 1, :4])[0] / [0.1, 0.1, 0.2, 0.2]
            np.testing.assert_allclose(t[4 * int(lab):4 * int(lab) + 4], want, rtol=1e-5, atol=1e-5)
            assert iw.sum() == 4 and ow.sum() == 4
        else:
            assert 0.1 <= ious[best] < 0.5 and not t.any() and not iw.any()
    assert set(labels[labels > 0]) == {2, 5}  # the ground-truth boxes themselves are foreground


def test_detect_script_writes_png(tmp_path, capsys):
    detect = _script("detect")
    out = tmp_path / "det.png"
    assert detect.main(["--out", str(out), "--scale", "128"]) == 0
    assert out.stat().st_size > 1000
    text = capsys.readouterr().out
    assert "proposals" in text and "detections after per-class NMS" in text
    from PIL import Image

    assert Image.open(out).size == (320, 240)


@pytest.mark.slow
def test_train_script_runs_and_weights_load(tmp_path):
    train = _script("train")
    assert train.main(["--iters", "3", "--out", str(tmp_path), "--scale", "128"]) == 0
    detect = _script("detect")
    assert detect.main(["--weights", str(tmp_path / "faster_rcnn_small.caffemodel"), "--classes", "4",
                        "--out", str(tmp_path / "d.png"), "--scale", "128"]) == 0


@pytest.mark.gpu
def test_detect_script_on_gpu(tmp_path, capsys):
    """The whole pipeline in GPU mode: the layers' kernels, the Python layers on host copies and the
    GPU NMS inside ProposalLayer."""
    detect = _script("detect")
    try:
        assert detect.main(["--out", str(tmp_path / "g.png"), "--scale", "128", "--gpu", "0"]) == 0
    finally:
        caffe.set_mode_cpu()
    assert "detections after per-class NMS" in capsys.readouterr().out


@pytest.mark.gpu
def test_train_script_on_gpu(tmp_path):
    train = _script("train")
    try:
        assert train.main(["--iters", "3", "--out", str(tmp_path), "--scale", "128", "--gpu", "0"]) == 0
    finally:
        caffe.set_mode_cpu()
