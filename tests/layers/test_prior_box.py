"""PriorBox (SSD fork): the fork's prior order, sizes, steps, clip, variances, errors."""

import math

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, run_layer

FEAT = np.zeros((1, 2, 2, 3))
IMG = np.zeros((1, 3, 8, 12))


def _ref(feat_hw, img_hw, mins, maxs, ars, flip, step=None, offset=0.5):
    """Loop reference: per cell, per min size: square, sqrt(min*max) square, other ratios."""
    (fh, fw), (ih, iw) = feat_hw, img_hw
    sh, sw = (step, step) if step else (ih / fh, iw / fw)
    ratios = [1.0]
    for a in ars:
        if all(abs(a - r) >= 1e-6 for r in ratios):
            ratios += [a] + ([1 / a] if flip else [])
    out = []
    for y in range(fh):
        for x in range(fw):
            cx, cy = (x + offset) * sw, (y + offset) * sh
            for k, m in enumerate(mins):
                shapes = [(m, m)] + ([(math.sqrt(m * maxs[k]),) * 2] if maxs else [])
                shapes += [(m * math.sqrt(r), m / math.sqrt(r)) for r in ratios if abs(r - 1) >= 1e-6]
                for bw, bh in shapes:
                    out += [(cx - bw / 2) / iw, (cy - bh / 2) / ih, (cx + bw / 2) / iw, (cy + bh / 2) / ih]
    return np.array(out)


@pytest.mark.parametrize("params,mins,maxs,ars,flip,step", [
    ("min_size: 2", [2], [], [], True, None),
    ("min_size: 2 max_size: 5 aspect_ratio: 2", [2], [5], [2], True, None),
    ("min_size: 2 max_size: 5 aspect_ratio: 2 aspect_ratio: 3 flip: false", [2], [5], [2, 3], False, None),
    ("min_size: 2 min_size: 3 max_size: 4 max_size: 6 aspect_ratio: 2 aspect_ratio: 0.5", [2, 3], [4, 6],
     [2, 0.5], True, None),
    ("min_size: 3 aspect_ratio: 2 step: 5", [3], [], [2], True, 5.0),
])
def test_forward_matches_reference(mode, params, mins, maxs, ars, flip, step):
    layer, _, top = run_layer(f"type: 'PriorBox' prior_box_param {{ {params} }}", [FEAT, IMG])
    ref = _ref((2, 3), (8, 12), mins, maxs, ars, flip, step)
    assert top[0].shape == (1, 2, len(ref))
    np.testing.assert_allclose(top[0].cpu_data()[0, 0], ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(top[0].cpu_data()[0, 1], 0.1)


def test_hand_checked_first_cell():
    # 2x3 map on a 8x12 image: step 4, first centre (2, 2); min 2, max 8 -> side 4; ratio 4 -> 4 x 1
    _, _, top = run_layer("type: 'PriorBox' prior_box_param { min_size: 2 max_size: 8 aspect_ratio: 4 "
                          "flip: false variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 }", [FEAT, IMG])
    first = top[0].cpu_data()[0, 0, :12].reshape(3, 4)
    np.testing.assert_allclose(first, [[1 / 12, 1 / 8, 3 / 12, 3 / 8], [0, 0, 4 / 12, 4 / 8],
                                       [0, 1.5 / 8, 4 / 12, 2.5 / 8]], atol=1e-7)
    np.testing.assert_allclose(top[0].cpu_data()[0, 1, :8], [0.1, 0.1, 0.2, 0.2] * 2)


def test_clip_img_size_offset_and_truncated_sizes():
    _, _, top = run_layer("type: 'PriorBox' prior_box_param { min_size: 6.7 clip: true img_size: 10 offset: 0 }",
                          [FEAT, IMG])
    boxes = top[0].cpu_data()[0, 0].reshape(-1, 4)
    # min_size truncated to 6 as in the fork; image 10 x 10 from img_size; first centre at (0, 0)
    np.testing.assert_allclose(boxes[0], [0, 0, 0.3, 0.3], atol=1e-7)
    assert boxes.min() >= 0 and boxes.max() <= 1


@pytest.mark.parametrize("params,match", [
    ("", "min_size"),
    ("min_size: 4 max_size: 3", "greater than min_size"),
    ("min_size: 4 max_size: 8 max_size: 9", "max_size"),
    ("min_size: 4 variance: 0.1 variance: 0.2", "one variance or four"),
    ("min_size: 4 img_size: 3 img_h: 3 img_w: 3", "not both"),
    ("min_size: 4 step: 2 step_h: 3 step_w: 3", "not both"),
])
def test_errors(params, match):
    with pytest.raises(caffe.NetError, match=match):
        run_layer(f"type: 'PriorBox' prior_box_param {{ {params} }}", [FEAT, IMG])


@pytest.mark.gpu
def test_cpu_gpu_agree():
    assert_cpu_gpu_agree("type: 'PriorBox' prior_box_param { min_size: 2 max_size: 5 aspect_ratio: 2 clip: true }",
                         [FEAT, IMG], propagate=[False, False])
