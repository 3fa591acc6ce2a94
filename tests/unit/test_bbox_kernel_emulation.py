"""The GPU DetectionOutput selection (pycaffe_lite/bbox.cu) replayed step by step in Python: candidates
compacted in an arbitrary order, sorted by counting ranks, NMS writing its kept list in place over
the sorted one, keep_top_k by ranks over (score, class, position) keys. Runs without a GPU and must
give what the host path (the fork's algorithm) gives; the device itself is checked by
tests/layers/test_detection_output.py::test_cpu_gpu_agree."""

import numpy as np
import pytest

from pycaffe_lite import bbox
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer


def _emulate(boxes, conf, bg, score_thr, nms_thr, eta, top_k, keep_top_k, rng):
    num, npri, ncls = conf.shape
    kept = np.zeros((num, ncls, npri), np.int64)
    count = np.zeros((num, ncls), np.int64)
    for img in range(num):
        for c in range(ncls):
            if c == bg:
                continue
            score = conf[img, :, c]
            cand = [p for p in rng.permutation(npri) if score[p] > score_thr]  # atomicAdd order: arbitrary
            for pk in cand:
                rank = sum(1 for pj in cand if score[pj] > score[pk] or (score[pj] == score[pk] and pj < pk))
                kept[img, c, rank] = pk
            total = min(len(cand), top_k) if top_k > -1 else len(cand)
            b = boxes[img, 0]
            m, thr = 0, np.float32(nms_thr)
            for k in range(total):
                pk = kept[img, c, k]
                suppressed = any(bbox.iou(b[pk][None], b[kept[img, c, j]][None])[0, 0] > thr for j in range(m))
                if not suppressed:
                    kept[img, c, m] = pk
                    if eta < 1 and thr > 0.5:
                        thr = np.float32(thr * np.float32(eta))
                    m += 1
            count[img, c] = m
    results = []
    for img in range(num):
        ents = [(conf[img, kept[img, c, m], c], c * npri + m) for c in range(ncls) for m in range(count[img, c])]
        keep_all = keep_top_k < 0 or len(ents) <= keep_top_k
        chosen = {}
        for s, key in ents:
            rank = sum(1 for s2, k2 in ents if s2 > s or (s2 == s and k2 < key))
            if keep_all or rank < keep_top_k:
                chosen.setdefault(key // npri, []).append(key % npri)
        results.append({c: [int(kept[img, c, m]) for m in sorted(ms)] for c, ms in chosen.items()})
    return results


@pytest.mark.parametrize("params,kw", [
    ("", {}),
    ("confidence_threshold: 0.15 keep_top_k: 6", dict(score_thr=0.15, keep_top_k=6)),
    ("nms_param { nms_threshold: 0.8 eta: 0.8 top_k: 5 }", dict(nms_thr=0.8, eta=0.8, top_k=5)),
    ("keep_top_k: 3 confidence_threshold: 0.0", dict(keep_top_k=3, score_thr=0.0)),
])
def test_kernel_algorithm_matches_host_path(params, kw):
    rng = np.random.default_rng(2)
    num, npri, ncls = 2, 10, 3
    centers = rng.uniform(0.3, 0.7, (npri, 2))
    prior_boxes = np.concatenate([centers - 0.15, centers + 0.15], 1)
    prior = np.stack([prior_boxes.ravel(), np.tile([0.1, 0.1, 0.2, 0.2], npri)])[None]
    loc = rng.normal(0, 0.3, (num, npri * 4))
    conf = rng.uniform(0, 1, (num, npri, ncls))
    conf[0, 3, 1] = conf[0, 4, 1]  # a tie
    conf = (conf / conf.sum(-1, keepdims=True)).astype(np.float32)
    text = "type: 'DetectionOutput' detection_output_param { num_classes: 3 code_type: CENTER_SIZE " + params
    if "nms_param" not in params:
        text += " nms_param { nms_threshold: 0.45 }"
    layer = make_layer(text + " }", np.float32)
    bottom = blobs([loc, conf.reshape(num, -1), prior], np.float32)
    layer.setup(bottom, empty_blobs(1, np.float32))
    boxes = layer._decoded(bottom)
    host = layer.select(boxes, conf)
    args = dict(bg=0, score_thr=-np.finfo(np.float32).max, nms_thr=0.45, eta=1.0, top_k=-1, keep_top_k=-1)
    args.update(kw)
    emulated = _emulate(boxes, conf, rng=np.random.default_rng(9), **args)
    assert [{c: v for c, v in r.items() if v} for r in host] == [{c: v for c, v in r.items() if v} for r in emulated]
