"""DetectionOutput exported at any batch (``dynamic_batch``): every image's selection inside the
graph. The export at one batch passes the built-in check, and the same model run in ONNX Runtime at
other batches gives the rows of pycaffe-lite's forward at those batches: images in order, keep_top_k
per image, an image without detections contributing no row, the per-image empty rows when no image
has any."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx_testing import export_and_check, make_net
from test_onnx_fork_layers import check_with, ssd_head

A, CLASSES = 4, 4  # priors per cell, classes (background 0) of ssd_head


def _net(variant: str, batch: int):
    code, extra, keep, nms = {
        "center": ("CENTER_SIZE", "confidence_threshold: 0.2", 3, "nms_threshold: 0.45 top_k: 8"),
        "corner_size": ("CORNER_SIZE", "confidence_threshold: 0.2", 5, "nms_threshold: 0.45 top_k: 8"),
        "no_keep": ("CENTER_SIZE", "confidence_threshold: 0.2", -1, "nms_threshold: 0.3"),
        "none_pass": ("CENTER_SIZE", "confidence_threshold: 1.0", 5, "nms_threshold: 0.45 top_k: 8"),
    }[variant]
    net = make_net(ssd_head(code, extra, keep, nms=nms, batch=batch), seed=3)
    for blob in net.params["conf"]:  # spread the scores
        blob.data[...] *= 4
    if variant == "corner_size":
        for blob in net.params["loc"]:
            blob.data[...] *= 0.05
    bias = net.params["conf"][1].data
    bias[np.arange(A) * CLASSES] += 10.0  # background wins where the features are weak
    return net


def _feeds(batch: int, seed: int) -> np.ndarray:
    """Images of different strength; image 1 (when there) all zeros: background everywhere."""
    x = np.random.default_rng(seed).standard_normal((batch, 3, 6, 6)).astype(np.float32)
    x *= np.float32(20.0) / (1 + np.arange(batch, dtype=np.float32)).reshape(-1, 1, 1, 1)
    if batch > 1:
        x[1] = 0
    return x


def _caffe(net, x: np.ndarray) -> np.ndarray:
    net.blobs["data"].reshape(x.shape)
    net.reshape()
    net.blobs["data"].data[...] = x
    net.forward()
    return np.array(net.blobs["det"].data, copy=True)


@pytest.mark.parametrize("variant", ["center", "corner_size", "no_keep", "none_pass"])
def test_detection_output_any_batch(variant):
    net = _net(variant, 3)
    report = export_and_check(net, dynamic_batch=True, check_inputs=[{"data": _feeds(3, 0)}])
    det = [r for r in report.checks[1].rows if r.row.layer == "det"][0]
    assert det.verdict == "ok", report.checks[1].table()
    sess = ort.InferenceSession(report.exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    seen_missing = False
    for batch, seed in [(1, 1), (2, 2), (4, 3), (3, 4)]:
        x = _feeds(batch, seed)
        ref = _caffe(net, x)
        (got,) = sess.run(["det"], {"data": x})
        assert got.shape == ref.shape, (batch, got.shape, ref.shape)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * max(1.0, float(np.abs(ref).max())))
        images = ref[0, 0, :, 0]
        assert np.all(np.diff(images) >= 0)  # images in order
        if variant == "none_pass":
            assert ref.shape[2] == batch and np.all(ref[0, 0, :, 1] == -1)
            assert np.array_equal(images, np.arange(batch))
            continue
        present = set(images.astype(int).tolist())
        assert 0 in present and (batch < 2 or 1 not in present)  # image 1 (zeros) has none
        seen_missing |= batch > 1
        keep = {"center": 3, "corner_size": 5, "no_keep": -1}[variant]
        counts = np.bincount(images.astype(int), minlength=batch)
        if keep > 0:
            assert counts.max() <= keep
        for i in present:  # labels ascending, scores descending within a label
            rows = ref[0, 0][images == i]
            assert np.all(np.diff(rows[:, 1]) >= 0)
            for c in set(rows[:, 1]):
                assert np.all(np.diff(rows[rows[:, 1] == c, 2]) <= 0)
    assert seen_missing or variant == "none_pass"


def test_detection_output_keep_top_k_cuts_per_image():
    """keep_top_k 3 with more than 3 NMS survivors in each of two images: each image keeps its own
    3 best (the export at batch 2, checked by the built-in check)."""
    x = np.random.default_rng(7).standard_normal((2, 3, 6, 6)).astype(np.float32) * 20
    net = _net("no_keep", 2)
    check_with(net, {"data": x}, dynamic_batch=True)
    uncut = np.bincount(net.blobs["det"].data[0, 0, :, 0].astype(int), minlength=2)
    assert uncut.min() > 3, uncut
    net = _net("center", 2)
    check_with(net, {"data": x}, dynamic_batch=True)
    out = net.blobs["det"].data[0, 0]
    assert np.array_equal(np.bincount(out[:, 0].astype(int), minlength=2), [3, 3]), out


def test_detection_output_tied_scores_keep_the_layers_order():
    """Every prior of an image with the same scores (confidence weights 0): NMS, keep_top_k and the
    row order must break the ties as the layer does (lower prior, then lower class)."""
    net = _net("center", 2)
    net.params["conf"][0].data[...] = 0
    bias = net.params["conf"][1].data
    bias[...] = np.tile([0.0, 1.0, 1.0, 0.5], A)  # classes 1 and 2 tie too
    x = np.random.default_rng(8).standard_normal((2, 3, 6, 6)).astype(np.float32) * 3
    check_with(net, {"data": x}, dynamic_batch=True)
    out = net.blobs["det"].data[0, 0]
    assert len(set(out[:, 2].tolist())) <= 2 and out.shape[0] == 6  # tied scores, 3 rows per image
