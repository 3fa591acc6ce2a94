"""Forks' layers and fields met in published deploy files (issue 36): BReLU (DehazeNet),
ContinuationIndicator (dlunion's OCR fork), UnPooling with a mask of more channels (DeconvNet),
DetectionOutput's ``clip`` (OpenCV's SSD face detector) and ``use_polygon`` with PriorBox's
``denser_prior_boxes`` (TextBoxes++). Prototxts written here."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import CaffeError
from pycaffe_lite.proto import caffe_pb2
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import (
    assert_cpu_gpu_agree,
    blobs,
    empty_blobs,
    make_layer,
    run_layer,
    unpool_reference,
)

# -- BReLU ------------------------------------------------------------------------------------
BRELU = 'type: "BReLU" brelu_param { minval: -0.5 maxval: 0.75 }'


def test_brelu_forward_backward(mode):
    x = np.array([[-2.0, -0.5, -0.2, 0.0, 0.5, 0.75, 3.0, np.nan]])
    layer, bottom, top = run_layer(BRELU, [x])
    np.testing.assert_array_equal(top[0].cpu_data(), [[-0.5, -0.5, -0.2, 0.0, 0.5, 0.75, 0.75, np.nan]])
    dy = top[0].cpu_diff()
    inside = np.array([[0, 1, 1, 1, 1, 1, 0, 0]], bool)  # both bounds pass the gradient, as the fork
    np.testing.assert_array_equal(bottom[0].cpu_diff(), np.where(inside, dy, 0))


def test_brelu_defaults_are_zero_and_one():
    _, _, top = run_layer('type: "BReLU"', [np.array([-1.0, 0.3, 2.0])])
    np.testing.assert_array_equal(top[0].cpu_data(), [0.0, 0.3, 1.0])


def test_brelu_gradient(mode):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1.5, 1.5, (2, 3, 4, 5))
    x[np.abs(x + 0.5) < 0.02] += 0.1  # away from the kinks
    x[np.abs(x - 0.75) < 0.02] += 0.1
    layer = make_layer(BRELU)
    bottom, top = blobs([x]), empty_blobs(1)
    assert GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top) == x.size


@pytest.mark.gpu
def test_brelu_gpu_agrees():
    x = np.random.default_rng(1).uniform(-2, 2, (3, 4, 5, 6)).astype(np.float32)
    assert_cpu_gpu_agree(BRELU, [x], dtype=np.float32, rtol=0, atol=0)


# -- ContinuationIndicator ----------------------------------------------------------------------
def test_continuation_indicator_in_a_net(mode):
    text = """input: "data" input_shape { dim: 2 dim: 3 dim: 1 dim: 5 }
layer { name: "cont" type: "ContinuationIndicator" top: "cont"
        continuation_indicator_param { time_step: 5 batch_size: 2 } }
layer { name: "seq" type: "Permute" bottom: "data" top: "seq" permute_param { order: 3 order: 0 order: 1 order: 2 } }
layer { name: "flat" type: "Reshape" bottom: "seq" top: "flat" reshape_param { shape { dim: 5 dim: 2 dim: 3 } } }
layer { name: "lstm" type: "LSTM" bottom: "flat" bottom: "cont" top: "h"
        recurrent_param { num_output: 4 weight_filler { type: "gaussian" std: 0.3 } } }
"""
    net = caffe.Net(parse_text(text, caffe_pb2.NetParameter()), caffe.TEST)
    net.blobs["data"].data[...] = np.random.default_rng(2).standard_normal((2, 3, 1, 5))
    net.forward()
    cont = net.blobs["cont"].data
    assert cont.shape == (5, 2)
    np.testing.assert_array_equal(cont, [[0, 0]] + [[1, 1]] * 4)
    assert net.blobs["h"].shape == (5, 2, 4) and np.isfinite(net.blobs["h"].data).all()


def test_continuation_indicator_defaults_and_errors():
    _, _, top = run_layer('type: "ContinuationIndicator" continuation_indicator_param { time_step: 3 }', [])
    np.testing.assert_array_equal(top[0].cpu_data(), [[0], [1], [1]])  # batch_size defaults to 1
    _, _, top = run_layer('type: "ContinuationIndicator" continuation_indicator_param { time_step: 2 }',
                          [np.zeros((1, 3, 4, 4))])  # a bottom is accepted and not read
    np.testing.assert_array_equal(top[0].cpu_data(), [[0], [1]])
    with pytest.raises(CaffeError, match="time_step is required"):
        run_layer('type: "ContinuationIndicator"', [])


# -- UnPooling with more mask channels ----------------------------------------------------------
def test_unpooling_reads_the_first_planes_of_a_wider_mask(mode):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 2, 3))
    wide = rng.integers(0, 16, (2, 5, 2, 3)).astype(np.float64)  # 5 mask planes for 3 value planes
    text = 'type: "UnPooling" unpooling_param { unpool: MAX kernel_size: 2 stride: 2 unpool_h: 4 unpool_w: 4 }'
    layer, bottom, top = run_layer(text, [x, wide], propagate=[True, False])
    want = unpool_reference(x, wide[:, :3], 4, 4)
    np.testing.assert_array_equal(top[0].cpu_data(), want)
    dy = top[0].cpu_diff().reshape(6, 16)
    idx = wide[:, :3].reshape(6, 6).astype(int)
    np.testing.assert_array_equal(bottom[0].cpu_diff().reshape(6, 6), np.take_along_axis(dy, idx, axis=1))
    with pytest.raises(CaffeError, match="first 3 channels"):
        run_layer(text, [x, wide[:, :2]])  # fewer planes than values: neither a mask nor the input


# -- DetectionOutput clip / TextBoxes++ ---------------------------------------------------------
def detection_bottoms(num_priors: int, per: int, seed: int = 4):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.0, 1.0, (num_priors, 2))
    sizes = rng.uniform(0.2, 0.6, (num_priors, 2))
    boxes = np.concatenate([centres - sizes / 2, centres + sizes / 2], axis=1)
    prior = np.stack([boxes.reshape(-1), np.tile([0.1, 0.1, 0.2, 0.2], num_priors)])[None]
    loc = rng.normal(0, 0.5, (2, num_priors * per))
    logits = rng.normal(0, 1, (2, num_priors, 2))
    conf = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).reshape(2, -1)
    return loc, conf, prior


DET = ('type: "DetectionOutput" detection_output_param {{ num_classes: 2 code_type: CENTER_SIZE '
       'nms_param {{ nms_threshold: 0.45 }} confidence_threshold: 0.2 {extra} }}')


def test_detection_output_clip_clamps_decoded_boxes_before_nms(mode):
    loc, conf, prior = detection_bottoms(12, 4)
    _, _, plain = run_layer(DET.format(extra=""), [loc, conf, prior])
    _, _, clipped = run_layer(DET.format(extra="clip: true"), [loc, conf, prior])
    rows, crows = plain[0].cpu_data()[0, 0], clipped[0].cpu_data()[0, 0]
    assert (rows[:, 3:] < 0).any() or (rows[:, 3:] > 1).any()  # the data do leave [0, 1]
    assert crows[:, 3:].min() >= 0 and crows[:, 3:].max() <= 1
    # rows whose boxes were inside [0, 1] are unchanged (same image, label and score)
    inside = [r for r in rows if r[3:].min() >= 0 and r[3:].max() <= 1]
    for r in inside:
        assert any(np.allclose(r, c) for c in crows)


def test_textboxes_denser_priors_and_polygons(mode):
    text = """input: "feat" input_shape { dim: 1 dim: 4 dim: 2 dim: 3 }
input: "img" input_shape { dim: 1 dim: 3 dim: 40 dim: 60 }
layer { name: "p" type: "PriorBox" bottom: "feat" bottom: "img" top: "p" prior_box_param {
  min_size: 10 max_size: 20 aspect_ratio: 2 flip: false denser_prior_boxes: true variance: 0.1 variance: 0.1
  variance: 0.2 variance: 0.2 } }
"""
    net = caffe.Net(parse_text(text, caffe_pb2.NetParameter()), caffe.TEST)
    net.forward()
    boxes = net.blobs["p"].data[0, 0].reshape(2, 3, 6, 4)  # 3 priors per cell, each then its denser copy
    step = 20.0  # 40 / 2 and 60 / 3
    for k in range(3):
        plain, dense = boxes[:, :, 2 * k], boxes[:, :, 2 * k + 1]
        np.testing.assert_allclose(dense[..., [0, 2]], plain[..., [0, 2]])
        np.testing.assert_allclose((dense[..., 1] - plain[..., 1]) * 40, step / 2, rtol=1e-5)
    np.testing.assert_allclose(boxes[1, 2, 1], [(2.5 * step - 5) / 60, (2 * step - 5) / 40,
                                                (2.5 * step + 5) / 60, (2 * step + 5) / 40], rtol=1e-6)

    loc, conf, prior = detection_bottoms(10, 12, seed=5)
    layer, _, top = run_layer(DET.format(extra="use_polygon: true"), [loc, conf, prior])
    rows = top[0].cpu_data()[0, 0]
    assert rows.shape[1] == 15 and len(rows) > 0
    _, _, boxes_only = run_layer(DET.format(extra=""), [loc.reshape(2, 10, 12)[..., :4].reshape(2, -1), conf, prior])
    np.testing.assert_allclose(rows[:, :7], boxes_only[0].cpu_data()[0, 0], rtol=1e-6)  # NMS on the boxes
    pri = prior[0, 0].reshape(10, 4)
    var = prior[0, 1].reshape(10, 4)
    offs = loc.reshape(2, 10, 12)[..., 4:]
    for r in rows:
        i = int(r[0])
        j = int(np.argmin(np.abs(conf.reshape(2, 10, 2)[i, :, int(r[1])] - r[2])))
        px0, py0, px1, py1 = pri[j]
        corners = np.array([px0, py0, px1, py0, px1, py1, px0, py1])
        scale = np.tile([var[j, 0] * (px1 - px0), var[j, 1] * (py1 - py0)], 4)
        np.testing.assert_allclose(r[7:], corners + offs[i, j] * scale, rtol=1e-5, atol=1e-7)
    with pytest.raises(CaffeError, match="use_polygon: true"):
        run_layer(DET.format(extra=""), [loc, conf, prior])  # 12 values per prior without use_polygon
    with pytest.raises(CaffeError, match="CENTER_SIZE"):
        make_layer(DET.format(extra="use_polygon: true").replace("CENTER_SIZE", "CORNER")).setup(
            blobs([loc, conf, prior]), empty_blobs(1))
