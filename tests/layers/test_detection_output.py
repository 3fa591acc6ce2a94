"""DetectionOutput (SSD fork): decode x NMS x keep_top_k against a plain-Python reference."""

import math

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, run_layer

P, C, N = 12, 4, 2


def _priors(rng):
    c = rng.uniform(0.2, 0.8, (P, 2))
    s = rng.uniform(0.1, 0.4, (P, 2))
    boxes = np.concatenate([c - s / 2, c + s / 2], axis=1)
    var = np.tile([0.1, 0.1, 0.2, 0.2], (P, 1))
    return np.stack([boxes.ravel(), var.ravel()])[None]


def _inputs(seed, share=True):
    rng = np.random.default_rng(seed)
    nloc = 1 if share else C
    loc = rng.normal(0, 0.5, (N, P * nloc * 4))
    logits = rng.normal(0, 2, (N, P, C))
    conf = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    # a few clusters of near-duplicate priors make NMS matter
    prior = _priors(rng)
    prior[0, 0, 4:8] = prior[0, 0, 0:4] + 0.01
    prior[0, 0, 8:12] = prior[0, 0, 0:4] - 0.02
    return [loc, conf.reshape(N, -1), prior]


def _decode_one(pr, var, t, code, in_target):
    if in_target:
        var = [1, 1, 1, 1]
    if code == 1:
        return [pr[k] + var[k] * t[k] for k in range(4)]
    pw, ph = pr[2] - pr[0], pr[3] - pr[1]
    if code == 3:
        return [pr[0] + var[0] * t[0] * pw, pr[1] + var[1] * t[1] * ph,
                pr[2] + var[2] * t[2] * pw, pr[3] + var[3] * t[3] * ph]
    cx = var[0] * t[0] * pw + (pr[0] + pr[2]) / 2
    cy = var[1] * t[1] * ph + (pr[1] + pr[3]) / 2
    w, h = math.exp(var[2] * t[2]) * pw, math.exp(var[3] * t[3]) * ph
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def _overlap(a, b):
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return 0.0
    iw, ih = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    area = [max(0.0, (x[2] - x[0])) * max(0.0, (x[3] - x[1])) if x[2] >= x[0] and x[3] >= x[1] else 0.0
            for x in (a, b)]
    return iw * ih / (area[0] + area[1] - iw * ih)


def _reference(arrays, num_classes, share=True, bg=0, code=2, in_target=False, thr=None, nms=0.45,
               top_k=-1, keep=-1, eta=1.0):
    loc, conf, prior = arrays
    nloc = 1 if share else num_classes
    pr = prior[0, 0].reshape(P, 4)
    var = prior[0, 1].reshape(P, 4)
    rows = []
    for i in range(N):
        dets = {}
        for c in range(num_classes):
            if c == bg:
                continue
            lc = 0 if share else c
            boxes = [_decode_one(pr[j], var[j], loc[i].reshape(P, nloc, 4)[j, lc], code, in_target) for j in range(P)]
            scores = conf[i].reshape(P, num_classes)[:, c]
            cand = [j for j in range(P) if thr is None or scores[j] > thr]
            cand.sort(key=lambda j: (-scores[j], j))
            if top_k > -1:
                cand = cand[:top_k]
            kept, t = [], nms
            for j in cand:
                if all(_overlap(boxes[j], boxes[k]) <= t for k in kept):
                    kept.append(j)
                    if eta < 1 and t > 0.5:
                        t *= eta
            dets[c] = [(scores[j], j, boxes[j]) for j in kept]
        total = sum(len(v) for v in dets.values())
        if -1 < keep < total:
            flat = sorted(((d[0], c, k) for c in sorted(dets) for k, d in enumerate(dets[c])),
                          key=lambda x: -x[0])[:keep]
            new = {}
            for _, c, k in flat:
                new.setdefault(c, []).append(dets[c][k])
            dets = new
        for c in sorted(dets):
            for s, _, b in dets[c]:
                rows.append([i, c, s, *b])
    if not rows:
        return np.array([[i, -1, -1, -1, -1, -1, -1] for i in range(N)], float)
    return np.array(rows)


CASES = [
    ("code_type: CENTER_SIZE", {}),
    ("code_type: CENTER_SIZE confidence_threshold: 0.2 keep_top_k: 5", dict(thr=0.2, keep=5)),
    ("code_type: CORNER nms_param { nms_threshold: 0.3 top_k: 4 }", dict(code=1, nms=0.3, top_k=4)),
    ("code_type: CORNER_SIZE variance_encoded_in_target: true", dict(code=3, in_target=True)),
    ("code_type: CENTER_SIZE background_label_id: 2 nms_param { nms_threshold: 0.9 eta: 0.7 }",
     dict(bg=2, nms=0.9, eta=0.7)),
    ("code_type: CENTER_SIZE share_location: false confidence_threshold: 0.1", dict(share=False, thr=0.1)),
    ("code_type: CENTER_SIZE confidence_threshold: 1.5", dict(thr=1.5)),   # nothing: one -1 row per image
]


@pytest.mark.parametrize("params,kw", CASES)
def test_forward_matches_reference(mode, params, kw):
    share = kw.get("share", True)
    arrays = _inputs(11, share)
    if "nms_param" not in params:
        params += " nms_param { nms_threshold: 0.45 }"
    _, _, top = run_layer(f"type: 'DetectionOutput' detection_output_param {{ num_classes: {C} {params} }}",
                          arrays, dtype=np.float64)
    ref = _reference(arrays, C, **kw)
    out = top[0].cpu_data()
    assert out.shape == (1, 1, len(ref), 7)
    np.testing.assert_allclose(out[0, 0], ref, rtol=1e-9, atol=1e-12)


def test_float32_net_matches_reference_decisions():
    arrays = _inputs(5)
    _, _, top = run_layer("type: 'DetectionOutput' detection_output_param { num_classes: 4 code_type: CENTER_SIZE "
                          "nms_param { nms_threshold: 0.45 } keep_top_k: 7 }", arrays, dtype=np.float32)
    ref = _reference(arrays, C, keep=7)
    np.testing.assert_allclose(top[0].cpu_data()[0, 0], ref, rtol=1e-5, atol=1e-6)


def test_errors():
    arrays = _inputs(1)
    with pytest.raises(caffe.NetError, match="num_classes"):
        run_layer("type: 'DetectionOutput'", arrays)
    with pytest.raises(caffe.NetError, match="confidence bottom"):
        run_layer("type: 'DetectionOutput' detection_output_param { num_classes: 5 }", arrays)
    with pytest.raises(caffe.NetError, match="eta"):
        run_layer("type: 'DetectionOutput' detection_output_param { num_classes: 4 nms_param { eta: 0 } }", arrays)


@pytest.mark.gpu
@pytest.mark.parametrize("params,kw", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_gpu_agree(params, kw, dtype):
    arrays = _inputs(11, kw.get("share", True))
    if "nms_param" not in params:
        params += " nms_param { nms_threshold: 0.45 }"
    assert_cpu_gpu_agree(f"type: 'DetectionOutput' detection_output_param {{ num_classes: {C} {params} }}",
                         arrays, propagate=[False] * 3, rtol=1e-6 if dtype == np.float32 else 1e-12,
                         atol=1e-7 if dtype == np.float32 else 1e-14, dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("keep", [-1, 50])
def test_cpu_gpu_agree_many_priors(keep):
    # more priors and candidates than a block has threads: the kernels' strided loops and ranks
    rng = np.random.default_rng(21)
    p, c, n = 700, 5, 2
    centers = rng.uniform(0.1, 0.9, (p, 2))
    sizes = rng.uniform(0.05, 0.3, (p, 2))
    prior = np.stack([np.concatenate([centers - sizes / 2, centers + sizes / 2], 1).ravel(),
                      np.tile([0.1, 0.1, 0.2, 0.2], p)])[None]
    logits = rng.normal(0, 1.5, (n, p, c))
    conf = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    arrays = [rng.normal(0, 0.5, (n, p * 4)), conf.reshape(n, -1), prior]
    assert_cpu_gpu_agree("type: 'DetectionOutput' detection_output_param { num_classes: 5 code_type: CENTER_SIZE "
                         f"confidence_threshold: 0.01 keep_top_k: {keep} nms_param {{ nms_threshold: 0.45 top_k: 300 }} }}",
                         arrays, propagate=[False] * 3, rtol=1e-6, atol=1e-7, dtype=np.float32)
