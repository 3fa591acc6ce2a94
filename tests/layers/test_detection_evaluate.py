"""DetectionEvaluate (SSD fork): hand-checked tp/fp rows, difficult handling, pixel mode, AP versions."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import bbox
from pycaffe_lite.testing.layer_testing import run_layer

A, B, C, D = [0.1, 0.1, 0.4, 0.4], [0.5, 0.5, 0.9, 0.9], [0.2, 0.6, 0.5, 0.9], [0, 0, 0.5, 0.5]
GT = np.array([[0, 1, 0, *A, 0], [0, 1, 1, *B, 1], [0, 2, 0, *C, 0], [1, 2, 0, *D, 0],
               [-1, -1, -1, -1, -1, -1, -1, -1]]).reshape(1, 1, -1, 8)
DET = np.array([[0, 1, 0.8, 0.11, 0.1, 0.41, 0.4], [0, 1, 0.9, *A], [0, 1, 0.7, *B], [0, 2, 0.6, 0.7, 0, 0.9, 0.2],
                [1, 1, 0.5, *D], [2, 2, 0.4, *D]]).reshape(1, 1, -1, 7)


def test_rows_in_the_forks_format(mode):
    _, _, top = run_layer("type: 'DetectionEvaluate' detection_evaluate_param { num_classes: 3 }", [DET, GT],
                          propagate=[False, False])
    expect = [[-1, 1, 2, -1, -1], [-1, 2, 2, -1, -1],
              [0, 1, 0.9, 1, 0], [0, 1, 0.8, 0, 1], [0, 1, 0.7, 1, 0], [0, 2, 0.6, 0, 1],
              [1, 1, 0.5, 0, 1], [2, 2, 0.4, 0, 1]]
    np.testing.assert_allclose(top[0].cpu_data().reshape(-1, 5), expect, rtol=1e-6)


def test_difficult_ground_truth_not_evaluated():
    _, _, top = run_layer("type: 'DetectionEvaluate' detection_evaluate_param { num_classes: 3 "
                          "evaluate_difficult_gt: false }", [DET, GT], propagate=[False, False])
    rows = top[0].cpu_data().reshape(-1, 5)
    assert rows[0, 2] == 1 and list(rows[4]) == pytest.approx([0, 1, 0.7, 0, 0])


def test_pixel_mode_with_name_size_file(tmp_path):
    # a 1-pixel shift on a 10 x 10 image: overlap counted with end pixels (+1) as the fork does
    (tmp_path / "sizes.txt").write_text("a 10 10\n")
    gt = np.array([[0, 1, 0, 0.0, 0.0, 0.4, 0.4, 0]]).reshape(1, 1, 1, 8)
    det = np.array([[0, 1, 0.9, 0.1, 0.1, 0.5, 0.5]]).reshape(1, 1, 1, 7)
    text = ("type: 'DetectionEvaluate' detection_evaluate_param {{ num_classes: 2 overlap_threshold: {t} "
            "name_size_file: '" + str(tmp_path / "sizes.txt") + "' }}")
    iou = 16 / (25 + 25 - 16)  # 5x5 pixel boxes overlapping 4x4 pixels
    hit = run_layer(text.format(t=iou - 0.01), [det, gt], propagate=[False, False])[2][0].cpu_data().reshape(-1, 5)
    miss = run_layer(text.format(t=iou + 0.01), [det, gt], propagate=[False, False])[2][0].cpu_data().reshape(-1, 5)
    assert list(hit[1, 3:]) == [1, 0] and list(miss[1, 3:]) == [0, 1]


@pytest.mark.parametrize("version,expect", [("Integral", 0.5 + 0.5 * 2 / 3), ("MaxIntegral", 0.5 + 0.5 * 2 / 3),
                                            ("11point", (6 + 5 * 2 / 3) / 11)])
def test_average_precision(version, expect):
    tp = [(0.9, 1), (0.8, 0), (0.7, 1), (0.5, 0)]
    fp = [(s, 1 - t) for s, t in tp]
    assert bbox.average_precision(tp, fp, 2, version) == pytest.approx(expect, rel=1e-6)


def test_mean_average_precision_from_rows():
    _, _, top = run_layer("type: 'DetectionEvaluate' detection_evaluate_param { num_classes: 3 }", [DET, GT],
                          propagate=[False, False])
    m, aps = bbox.mean_average_precision([top[0].cpu_data()], 0)
    assert aps[1] == pytest.approx(0.5 + 0.5 * 2 / 3, rel=1e-6) and aps[2] == 0
    assert m == pytest.approx(aps[1] / 2, rel=1e-6)


def test_errors():
    with pytest.raises(caffe.NetError, match="num_classes"):
        run_layer("type: 'DetectionEvaluate'", [DET, GT], propagate=[False, False])
    with pytest.raises(caffe.NetError, match=r"\(1, 1, n, 8\)"):
        run_layer("type: 'DetectionEvaluate' detection_evaluate_param { num_classes: 3 }", [DET, DET],
                  propagate=[False, False])
