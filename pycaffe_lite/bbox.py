"""Box maths shared by the SSD layers (PriorBox, DetectionOutput, MultiBoxLoss, DetectionEvaluate,
AnnotatedData), with the semantics of the SSD fork (weiliu89/caffe, ``bbox_util``).

Boxes are arrays ``[..., 4]`` of ``(xmin, ymin, xmax, ymax)`` in image-relative coordinates.
Code types (``PriorBoxParameter.CodeType``): CORNER = 1 (offsets of the corners), CENTER_SIZE = 2
(centre offsets relative to the prior's size, log size ratios), CORNER_SIZE = 3 (corner offsets
relative to the prior's size). Variances scale the code unless ``variance_encoded_in_target``.

The CPU functions compute in the dtype of their inputs (float32 for float32 nets, as the fork's
float arithmetic). ``gpu_*`` launch the kernels of ``bbox.cu`` on device pointers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CORNER, CENTER_SIZE, CORNER_SIZE = 1, 2, 3
KERNELS = Path(__file__).with_suffix(".cu")


def size(boxes: np.ndarray, normalized: bool = True) -> np.ndarray:
    """Area of each box; 0 for an invalid box (xmax < xmin or ymax < ymin). Unnormalized boxes
    (pixel coordinates) count both end pixels: ``(w + 1)(h + 1)``."""
    w = boxes[..., 2] - boxes[..., 0]
    h = boxes[..., 3] - boxes[..., 1]
    area = w * h if normalized else (w + 1) * (h + 1)
    return np.where((w < 0) | (h < 0), np.zeros((), boxes.dtype), area).astype(boxes.dtype)


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Jaccard overlap matrix ``[len(a), len(b)]`` of two box lists (the fork's JaccardOverlap:
    boxes that only touch have overlap 0)."""
    a = np.asarray(a)
    b = np.asarray(b)
    dt = np.result_type(a, b)
    a = a.reshape(-1, 4).astype(dt, copy=False)[:, None, :]
    b = b.reshape(-1, 4).astype(dt, copy=False)[None, :, :]
    iw = np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0])
    ih = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1])
    inter = iw * ih
    union = size(a) + size(b) - inter
    ok = (iw > 0) & (ih > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(ok, inter / np.where(ok, union, 1), 0)
    return out.astype(dt, copy=False)


def coverage(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Fraction of each box of ``a`` covered by box ``b`` (``[len(a)]``; the fork's BBoxCoverage)."""
    a = np.asarray(a, np.float32).reshape(-1, 4)
    b = np.asarray(b, np.float32).reshape(4)
    ix0, iy0 = np.maximum(a[:, 0], b[0]), np.maximum(a[:, 1], b[1])
    ix1, iy1 = np.minimum(a[:, 2], b[2]), np.minimum(a[:, 3], b[3])
    disjoint = (b[0] > a[:, 2]) | (b[2] < a[:, 0]) | (b[1] > a[:, 3]) | (b[3] < a[:, 1])
    inter = np.where(disjoint, 0, size(np.stack([ix0, iy0, ix1, iy1], axis=1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(inter > 0, inter / size(a), 0).astype(np.float32)


def clip(boxes: np.ndarray) -> np.ndarray:
    return np.clip(boxes, 0, 1)


def _prior_geometry(priors):
    pw = priors[..., 2] - priors[..., 0]
    ph = priors[..., 3] - priors[..., 1]
    return pw, ph, (priors[..., 0] + priors[..., 2]) / 2, (priors[..., 1] + priors[..., 3]) / 2


def decode(priors: np.ndarray, variances: np.ndarray, loc: np.ndarray, code_type: int,
           variance_encoded_in_target: bool, clip_boxes: bool = False) -> np.ndarray:
    """Boxes from location predictions ``loc [..., P, 4]`` against priors ``[P, 4]`` and their
    variances ``[P, 4]`` (the fork's DecodeBBox)."""
    dt = loc.dtype
    priors = priors.astype(dt, copy=False)
    var = np.ones_like(priors) if variance_encoded_in_target else variances.astype(dt, copy=False)
    t = loc * var
    if code_type == CORNER:
        out = priors + t
    elif code_type == CENTER_SIZE:
        pw, ph, pcx, pcy = _prior_geometry(priors)
        cx = t[..., 0] * pw + pcx
        cy = t[..., 1] * ph + pcy
        # exponents capped where exp() stays finite and w*h cannot overflow (a box 10^18 times its
        # prior's size; untrained nets predict such): same values below the cap, no inf/NaN above
        cap = dt.type(np.log(np.finfo(dt).max) / 2 - 1) if dt.kind == "f" else None
        w = np.exp(np.minimum(t[..., 2], cap) if cap is not None else t[..., 2]) * pw
        h = np.exp(np.minimum(t[..., 3], cap) if cap is not None else t[..., 3]) * ph
        out = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    elif code_type == CORNER_SIZE:
        pw, ph, _, _ = _prior_geometry(priors)
        scale = np.stack([pw, ph, pw, ph], axis=-1)
        out = priors + t * scale
    else:
        raise ValueError(f"unknown code_type {code_type} (1 CORNER, 2 CENTER_SIZE, 3 CORNER_SIZE)")
    out = out.astype(dt, copy=False)
    return clip(out) if clip_boxes else out


def encode(priors: np.ndarray, variances: np.ndarray, boxes: np.ndarray, code_type: int,
           encode_variance_in_target: bool) -> np.ndarray:
    """Regression targets of ``boxes [M, 4]`` against their priors ``[M, 4]`` (the fork's EncodeBBox);
    the inverse of :func:`decode`."""
    dt = boxes.dtype
    priors = priors.astype(dt, copy=False)
    var = np.ones_like(priors) if encode_variance_in_target else variances.astype(dt, copy=False)
    if code_type == CORNER:
        t = boxes - priors
    elif code_type == CENTER_SIZE:
        pw, ph, pcx, pcy = _prior_geometry(priors)
        bw, bh, bcx, bcy = _prior_geometry(boxes)
        t = np.stack([(bcx - pcx) / pw, (bcy - pcy) / ph, np.log(bw / pw), np.log(bh / ph)], axis=-1)
    elif code_type == CORNER_SIZE:
        pw, ph, _, _ = _prior_geometry(priors)
        t = (boxes - priors) / np.stack([pw, ph, pw, ph], axis=-1)
    else:
        raise ValueError(f"unknown code_type {code_type} (1 CORNER, 2 CENTER_SIZE, 3 CORNER_SIZE)")
    return (t / var).astype(dt, copy=False)


def max_score_index(scores: np.ndarray, threshold: float, top_k: int) -> np.ndarray:
    """Indices of the scores above ``threshold``, highest first (ties: lower index first), at most
    ``top_k`` of them (``top_k < 0``: all)."""
    idx = np.flatnonzero(scores > np.float32(threshold) if scores.dtype == np.float32 else scores > threshold)
    order = idx[np.argsort(-scores[idx], kind="stable")]
    return order[:top_k] if top_k > -1 else order


def nms(boxes: np.ndarray, scores: np.ndarray, score_threshold: float, nms_threshold: float,
        eta: float = 1.0, top_k: int = -1) -> list[int]:
    """The fork's ApplyNMSFast: greedy suppression over the candidates of :func:`max_score_index`;
    a candidate is kept when its overlap with every kept box is at most the (adaptive) threshold,
    which is multiplied by ``eta`` after each kept box while above 0.5."""
    cand = max_score_index(scores, score_threshold, top_k)
    if len(cand) == 0:
        return []
    ov = iou(boxes[cand], boxes[cand])
    thr = np.float32(nms_threshold)
    kept: list[int] = []
    if eta >= 1:  # a fixed threshold: suppressing forward is the same test (overlaps are symmetric)
        suppressed = np.zeros(len(cand), bool)
        for k in range(len(cand)):
            if not suppressed[k]:
                kept.append(k)
                suppressed[k + 1:] |= ov[k, k + 1:] > thr
        return [int(cand[k]) for k in kept]
    for k in range(len(cand)):
        if not kept or bool((ov[k, kept] <= thr).all()):
            kept.append(k)
            if thr > 0.5:
                thr = np.float32(thr * np.float32(eta))
    return [int(cand[k]) for k in kept]


def nms_by_loss(boxes: np.ndarray, scores: np.ndarray, nms_threshold: float, top_k: int) -> list[int]:
    """The fork's ApplyNMS (used by hard-example mining): like :func:`nms` without a score threshold
    or eta, the candidates ordered by ``scores`` (all of them with ``top_k < 0``)."""
    order = np.argsort(-scores, kind="stable")
    if top_k > -1:
        order = order[:top_k]
    ov = iou(boxes[order], boxes[order])
    kept: list[int] = []
    for k in range(len(order)):
        if all(ov[k, j] <= nms_threshold for j in kept):
            kept.append(k)
    return [int(order[k]) for k in kept]


def match(gt: np.ndarray, preds: np.ndarray, bipartite_only: bool, overlap_threshold: float,
          ignore_cross_boundary: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The fork's MatchBBox against all ground truths: ``(indices, overlaps)`` per prediction.
    First bipartite: repeatedly the highest overlap between an unmatched prediction and an unused
    ground truth (ties: lowest prediction, then lowest gt) pairs them. Then (PER_PREDICTION) every
    other prediction takes its best gt with overlap >= ``overlap_threshold``. Index -1: none,
    -2: ignored because the prediction crosses the image border. Overlaps: each prediction's best."""
    num = len(preds)
    indices = np.full(num, -1, np.int64)
    overlaps = np.zeros(num, np.float32)
    if len(gt) == 0:
        return indices, overlaps
    ov = iou(preds.astype(np.float32), gt.astype(np.float32))
    if ignore_cross_boundary:
        cross = ((preds < 0) | (preds > 1)).any(axis=1)
        indices[cross] = -2
        ov[cross] = 0
    ov = np.where(ov > 1e-6, ov, 0).astype(np.float32)
    overlaps[:] = ov.max(axis=1)
    work = ov.copy()
    work[indices == -2] = 0
    for _ in range(len(gt)):
        flat = int(np.argmax(work))
        i, j = divmod(flat, work.shape[1])
        if work[i, j] <= 0:
            break
        indices[i] = j
        overlaps[i] = work[i, j]
        work[i, :] = 0
        work[:, j] = 0
    if not bipartite_only:
        rest = np.flatnonzero(indices == -1)
        if len(rest):
            cand = np.where(ov[rest] >= np.float32(overlap_threshold), ov[rest], -1)
            best = np.argmax(cand, axis=1)
            ok = cand[np.arange(len(rest)), best] > 0
            indices[rest[ok]] = best[ok]
            overlaps[rest[ok]] = ov[rest[ok], best[ok]]
    return indices, overlaps


def average_precision(tp: list[tuple[float, int]], fp: list[tuple[float, int]], num_pos: int,
                      version: str) -> float:
    """The fork's ComputeAP: ``tp``/``fp`` are (score, 0/1) per detection; versions "11point"
    (VOC2007), "MaxIntegral" (VOC2012 / ILSVRC) and "Integral" (the plain area under the curve)."""
    if not tp or num_pos == 0:
        return 0.0
    order = np.argsort(-np.array([s for s, _ in tp], np.float32), kind="stable")
    tp_cum = np.cumsum(np.array([tp[i][1] for i in order]))
    order_f = np.argsort(-np.array([s for s, _ in fp], np.float32), kind="stable")
    fp_cum = np.cumsum(np.array([fp[i][1] for i in order_f]))
    prec = (tp_cum / (tp_cum + fp_cum)).astype(np.float32)
    rec = (tp_cum / num_pos).astype(np.float32)
    eps = 1e-6
    num = len(prec)
    ap = 0.0
    if version == "11point":
        max_precs = [0.0] * 11
        start = num - 1
        for j in range(10, -1, -1):
            for i in range(start, -1, -1):
                if rec[i] < j / 10.0:
                    start = i
                    if j > 0:
                        max_precs[j - 1] = max_precs[j]
                    break
                max_precs[j] = max(max_precs[j], float(prec[i]))
        ap = sum(m / 11 for m in reversed(max_precs))
    elif version == "MaxIntegral":
        cur_rec, cur_prec = float(rec[-1]), float(prec[-1])
        for i in range(num - 2, -1, -1):
            cur_prec = max(float(prec[i]), cur_prec)
            if abs(cur_rec - rec[i]) > eps:
                ap += cur_prec * abs(cur_rec - float(rec[i]))
            cur_rec = float(rec[i])
        ap += cur_rec * cur_prec
    elif version == "Integral":
        prev = 0.0
        for i in range(num):
            if abs(rec[i] - prev) > eps:
                ap += float(prec[i]) * abs(float(rec[i]) - prev)
            prev = float(rec[i])
    else:
        raise ValueError(f"unknown ap_version {version!r} (11point, MaxIntegral, Integral)")
    return float(ap)


def mean_average_precision(rows_list, background: int = 0, ap_version: str = "Integral"):
    """mAP over DetectionEvaluate tops gathered from several forwards (the fork's TestDetection):
    ``(mAP, {class: AP})``. Every class with a ground-truth count row counts in the mean; a class
    without any detection has AP 0."""
    num_pos: dict[int, int] = {}
    tps: dict[int, list] = {}
    fps: dict[int, list] = {}
    for rows in rows_list:
        for r in np.asarray(rows).reshape(-1, 5):
            label = int(r[1])
            if int(r[0]) == -1:
                num_pos[label] = num_pos.get(label, 0) + int(r[2])
            else:
                tps.setdefault(label, []).append((float(r[2]), int(r[3])))
                fps.setdefault(label, []).append((float(r[2]), int(r[4])))
    aps = {c: average_precision(tps.get(c, []), fps.get(c, []), num_pos[c], ap_version)
           for c in sorted(num_pos) if c != background}
    return (float(np.mean(list(aps.values()))) if aps else 0.0), aps


# -- data augmentation (the fork's sampler.cpp and DataTransformer's annotation handling) ----------
def project(src: np.ndarray, box: np.ndarray) -> np.ndarray | None:
    """``box`` in the coordinates of the window ``src`` (clipped to [0, 1]), or None when it lies
    outside the window or nothing of it is left (the fork's ProjectBBox)."""
    if box[0] >= src[2] or box[2] <= src[0] or box[1] >= src[3] or box[3] <= src[1]:
        return None
    sw, sh = src[2] - src[0], src[3] - src[1]
    out = np.array([(box[0] - src[0]) / sw, (box[1] - src[1]) / sh,
                    (box[2] - src[0]) / sw, (box[3] - src[1]) / sh], np.float32)
    out = clip(out)
    return out if size(out) > 0 else None


def meets_emit_constraint(window: np.ndarray, box: np.ndarray, emit_type: int, emit_overlap: float) -> bool:
    """EmitConstraint: CENTER (0) keeps a box whose centre lies in the window; MIN_OVERLAP (1) one
    covered by the window by more than ``emit_overlap`` of its area."""
    if emit_type == 0:
        cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        return bool(window[0] <= cx <= window[2] and window[1] <= cy <= window[3])
    return bool(coverage(box[None], window)[0] > emit_overlap)


def sample_box(rng: np.random.Generator, sampler) -> np.ndarray:
    """A random window (the fork's SampleBBox): scale and aspect ratio uniform in the sampler's
    ranges, the ratio clamped to [scale², 1/scale²], the offset uniform inside the image."""
    scale = rng.uniform(sampler.min_scale, sampler.max_scale)
    ar = rng.uniform(sampler.min_aspect_ratio, sampler.max_aspect_ratio)
    ar = min(max(ar, scale ** 2), 1 / scale ** 2)
    w, h = scale * np.sqrt(ar), scale / np.sqrt(ar)
    x0 = rng.uniform(0, 1 - w) if w < 1 else 0.0
    y0 = rng.uniform(0, 1 - h) if h < 1 else 0.0
    return np.array([x0, y0, x0 + w, y0 + h], np.float32)


def satisfies(window: np.ndarray, objects: np.ndarray, constraint) -> bool:
    """The fork's SatisfySampleConstraint (including its way of carrying ``found`` from one object
    to the next): no bound set -> True; else some object meeting the bounds."""
    kinds = [("min_jaccard_overlap", "max_jaccard_overlap"), ("min_sample_coverage", "max_sample_coverage"),
             ("min_object_coverage", "max_object_coverage")]
    has = [constraint.HasField(lo) or constraint.HasField(hi) for lo, hi in kinds]
    if not any(has):
        return True
    found = False
    for obj in objects:
        values = [iou(window[None], obj[None])[0, 0], coverage(window[None], obj)[0], coverage(obj[None], window)[0]]
        skip = False
        for (lo, hi), on, v in zip(kinds, has, values):
            if not on:
                continue
            if (constraint.HasField(lo) and v < getattr(constraint, lo)) or \
                    (constraint.HasField(hi) and v > getattr(constraint, hi)):
                skip = True
                break
            found = True
        if skip:
            continue
        if found:
            return True
    return found


def generate_samples(rng: np.random.Generator, objects: np.ndarray, batch_samplers) -> list[np.ndarray]:
    """Windows from every ``BatchSampler`` (the fork's GenerateBatchSamples): up to ``max_sample``
    satisfying windows out of ``max_trials`` tries each (only samplers using the original image)."""
    out: list[np.ndarray] = []
    for bs in batch_samplers:
        if not bs.use_original_image:
            continue
        found = 0
        for _ in range(bs.max_trials):
            if bs.HasField("max_sample") and found >= bs.max_sample:
                break
            window = sample_box(rng, bs.sampler)
            if satisfies(window, objects, bs.sample_constraint):
                found += 1
                out.append(window)
    return out
