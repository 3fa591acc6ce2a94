"""The published-style example nets exported whole and proven by the built-in check: SSDLite
(MobileNet v1 with depthwise convolutions and SSDLite heads, through PriorBox and DetectionOutput)
and SSD300-VGG16 at small widths and inputs, and the segmentation examples (PSPNet-style BN +
dilated convolutions + Interp + ArgMax; SegNet's pooling masks, BN INFERENCE and mask Upsample)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx_testing import export_and_check, randomize

from pycaffe_lite import common
from pycaffe_lite.net import Net

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "ssd"))
sys.path.insert(0, str(REPO / "examples" / "segmentation"))
import segment  # noqa: E402
import ssd_nets  # noqa: E402


def _net(param, seed=0):
    common.set_mode_cpu()
    net = Net(param, phase=common.TEST)
    randomize(net, seed)
    return net


def _spread_scores(net, factor=6.0):
    """Larger confidence logits, so that the softmax scores pass the 0.01 threshold unevenly."""
    for name, blobs in net.params.items():
        if "conf" in name:
            for b in blobs:
                b.data[...] *= factor


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.slow
def test_ssdlite_small(fp16):
    """fp16: the weights stored as float16, PriorBox's computed priors kept float32."""
    net = _net(ssd_nets.ssdlite_mobilenet(num_classes=5, size=96, width=0.125))
    _spread_scores(net)
    report = export_and_check(net, fp16=fp16)
    types = {r.row.type for r in report.checks[0].rows if r.verdict == "ok"}
    assert {"PriorBox", "DetectionOutput", "Permute", "Convolution"} <= types
    assert report.exported.outputs == ["detection_out"]
    assert net.blobs["detection_out"].shape[2] > 1  # some detections, not the empty row


@pytest.mark.slow
def test_ssd300_vgg16_narrow():
    net = _net(ssd_nets.ssd300_vgg16(num_classes=5, size=300, width=0.0625))
    _spread_scores(net)
    report = export_and_check(net)
    assert any(r.row.type == "Normalize" and r.verdict == "ok" for r in report.checks[0].rows)


def test_segmentation_deploy():
    net = _net(segment.deploy_net(num_classes=5, size=(32, 40), width=4))
    for blobs in net.params.values():  # frozen BN: plausible running statistics
        if len(blobs) == 4:
            blobs[2].data[...] = np.random.default_rng(1).normal(0, 0.2, blobs[2].shape)
            blobs[3].data[...] = np.random.default_rng(2).uniform(0.5, 2, blobs[3].shape)
    report = export_and_check(net)
    assert report.exported.outputs == ["label"]


def test_segnet():
    net = _net(segment.segnet_net(num_classes=4, size=(12, 20), width=4))
    report = export_and_check(net)
    masks = [r for r in report.checks[0].rows if r.row.top.endswith("_mask")]
    assert len(masks) == 3 and all(r.verdict == "ok" for r in masks)
