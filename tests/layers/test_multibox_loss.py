"""MultiBoxLoss (SSD fork): a hand-built scene whose matches, mined negatives and losses are computed
here independently; gradient checks of the loc and conf gradients; errors."""

import math

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

C = 3
# priors (xmin, ymin, xmax, ymax): 0 and 3 equal the two ground truths, 1 overlaps gt 0 with IoU 0.6,
# 6 overlaps gt 1 with IoU 0.25 (still a negative candidate), the rest are far from both.
PRIORS = np.array([
    [0.1, 0.1, 0.3, 0.3],
    [0.1, 0.1, 0.3, 0.2 + 0.1 * 0.6 / 0.5 * 0.5 + 0.0],  # fixed below to exact IoU 0.6
    [0.6, 0.0, 0.7, 0.1],
    [0.5, 0.5, 0.9, 0.9],
    [0.0, 0.8, 0.1, 0.9],
    [0.8, 0.0, 0.9, 0.1],
    [0.5, 0.5, 0.7, 0.7],
    [0.3, 0.6, 0.4, 0.7],
])
PRIORS[1] = [0.1, 0.1, 0.3, 0.1 + 0.2 * 0.6]   # inside gt 0, 60 % of its area -> IoU 0.6
P = len(PRIORS)
VAR = np.array([0.1, 0.1, 0.2, 0.2])
GT = np.array([[0, 1, 0, 0.1, 0.1, 0.3, 0.3, 0], [0, 2, 0, 0.5, 0.5, 0.9, 0.9, 0],
               [-1, -1, -1, -1, -1, -1, -1, -1]])  # a padding row (image -1) is skipped


def _iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _encode(prior, box):
    pw, ph = prior[2] - prior[0], prior[3] - prior[1]
    bw, bh = box[2] - box[0], box[3] - box[1]
    return np.array([((box[0] + box[2]) / 2 - (prior[0] + prior[2]) / 2) / pw / VAR[0],
                     ((box[1] + box[3]) / 2 - (prior[1] + prior[3]) / 2) / ph / VAR[1],
                     math.log(bw / pw) / VAR[2], math.log(bh / ph) / VAR[3]])


def _inputs(seed=0, num=2):
    rng = np.random.default_rng(seed)
    loc = rng.uniform(-0.8, 0.8, (num, P * 4))
    conf = rng.normal(0, 1, (num, P * C))
    prior = np.stack([PRIORS.ravel(), np.tile(VAR, P)])[None]
    return [loc, conf, prior, GT.reshape(1, 1, -1, 8)]


TEXT = ("type: 'MultiBoxLoss' multibox_loss_param {{ num_classes: 3 overlap_threshold: 0.5 code_type: CENTER_SIZE "
        "neg_pos_ratio: {ratio} {extra} }} {loss}")


def _softmax_nll(x, label):
    z = x - x.max()
    return -(z[label] - math.log(np.exp(z).sum()))


def _smooth_l1(d):
    return sum(0.5 * v * v if abs(v) < 1 else abs(v) - 0.5 for v in d)


@pytest.mark.parametrize("ratio,loc_type", [(1.0, "SMOOTH_L1"), (3.0, "SMOOTH_L1"), (1.0, "L2")])
def test_forward_reference(mode, ratio, loc_type):
    arrays = _inputs()
    assert abs(_iou(PRIORS[1], GT[0, 3:7]) - 0.6) < 1e-12 and abs(_iou(PRIORS[6], GT[1, 3:7]) - 0.25) < 1e-12
    _, _, top = run_layer(TEXT.format(ratio=ratio, extra=f"loc_loss_type: {loc_type}", loss=""), arrays)
    loc = arrays[0].reshape(2, P, 4)
    conf = arrays[1].reshape(2, P, C)
    matches = {0: 0, 3: 1, 1: 0}  # prior -> gt (bipartite 0, 3; per prediction 1)
    loc_loss = 0.0
    for j, g in matches.items():
        d = loc[0, j] - _encode(PRIORS[j], GT[g, 3:7])
        loc_loss += _smooth_l1(d) if loc_type == "SMOOTH_L1" else 0.5 * (d * d).sum()
    conf_loss = sum(_softmax_nll(conf[0, j], int(GT[g, 1])) for j, g in matches.items())
    candidates = sorted((j for j in range(P) if j not in matches), key=lambda j: -_softmax_nll(conf[0, j], 0))
    negatives = candidates[: int(len(matches) * ratio)]   # image 1 has no ground truth: not used
    conf_loss += sum(_softmax_nll(conf[0, j], 0) for j in negatives)
    np.testing.assert_allclose(float(top[0].cpu_data()), (loc_loss + conf_loss) / 3, rtol=1e-6)


def test_normalizations_and_terms(mode):
    arrays = _inputs()
    base = float(run_layer(TEXT.format(ratio=1, extra="", loss=""), arrays)[2][0].cpu_data())
    for mode_name, div in [("FULL", 2 * P), ("BATCH_SIZE", 2), ("NONE", 1)]:
        v = float(run_layer(TEXT.format(ratio=1, extra="", loss=f"loss_param {{ normalization: {mode_name} }}"),
                            arrays)[2][0].cpu_data())
        np.testing.assert_allclose(v, base * 3 / div, rtol=1e-9)
    only_conf = float(run_layer(TEXT.format(ratio=1, extra="", loss="propagate_down: false propagate_down: true "
                                            "propagate_down: false propagate_down: false"), arrays)[2][0].cpu_data())
    assert 0 < only_conf < base


@pytest.mark.parametrize("extra", [
    "",
    "loc_loss_type: L2 match_type: BIPARTITE",
    "conf_loss_type: LOGISTIC",
    "mining_type: NONE",
    "mining_type: HARD_EXAMPLE sample_size: 4",
    "CORNER",
    "use_prior_for_matching: false",
    "bp_inside: true ignore_cross_boundary_bbox: true",
])
@pytest.mark.slow
def test_gradient(mode, extra):
    text = TEXT.format(ratio=2, extra=extra, loss="")
    if extra == "CORNER":
        text = TEXT.format(ratio=2, extra="", loss="").replace("CENTER_SIZE", "CORNER")
    layer = make_layer(text)
    checker = GradientChecker(1e-4, 1e-3)
    checker.check(layer, blobs(_inputs(3)), empty_blobs(1), check_bottom=[0, 1])


def test_gradient_lands_on_matched_and_mined_rows():
    layer, bottom, top = run_layer(TEXT.format(ratio=1, extra="", loss=""), _inputs(), propagate=[True, True, False, False])
    dloc = bottom[0].cpu_diff().reshape(2, P, 4)
    assert set(np.flatnonzero(np.abs(dloc[0]).sum(1))) == {0, 1, 3}
    assert not dloc[1].any() and not bottom[1].cpu_diff().reshape(2, P, C)[1].any()
    assert len(np.flatnonzero(np.abs(bottom[1].cpu_diff().reshape(2, P, C)[0]).sum(1))) == 6


def test_errors():
    with pytest.raises(caffe.NetError, match="num_classes"):
        run_layer("type: 'MultiBoxLoss'", _inputs())
    with pytest.raises(caffe.NetError, match="confidence bottom"):
        run_layer("type: 'MultiBoxLoss' multibox_loss_param { num_classes: 4 }", _inputs())
    bad = _inputs()
    bad[3] = np.array([[0, 0, 0, 0.1, 0.1, 0.3, 0.3, 0]]).reshape(1, 1, 1, 8)
    with pytest.raises(caffe.NetError, match="background label"):
        run_layer(TEXT.format(ratio=1, extra="", loss=""), bad)
    with pytest.raises(caffe.NetError, match="share_location"):
        run_layer("type: 'MultiBoxLoss' multibox_loss_param { num_classes: 3 share_location: false }", _inputs())


@pytest.mark.gpu
@pytest.mark.parametrize("extra", ["", "conf_loss_type: LOGISTIC loc_loss_type: L2"])
def test_cpu_gpu_agree(extra):
    assert_cpu_gpu_agree(TEXT.format(ratio=2, extra=extra, loss=""), _inputs(3), propagate=[True, True, False, False])
