"""Accuracy: hand-checked top-k with ties and ignore_label, per-class top, axis, label checks,
no backward, CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer

SCORES = np.array(
    [
        [0.1, 0.5, 0.3, 0.1],  # label 1: clear winner
        [0.4, 0.4, 0.1, 0.1],  # label 0: tied with class 1 -> not top-1
        [0.4, 0.4, 0.1, 0.1],  # label 1: tied with class 0 -> not top-1
        [0.2, 0.2, 0.2, 0.2],  # label 3: all tied -> only top-4
        [0.9, 0.0, 0.05, 0.05],  # label 2: class 0 and the tied class 3 beat it -> top-3
        [0.0, 0.0, 0.0, 1.0],  # ignored
    ]
)
LABELS = np.array([1, 0, 1, 3, 2, -1], dtype=float)


def run(text, scores, labels, ntop=1, dtype=np.float64):
    layer = make_layer(f"type: 'Accuracy' {text}", dtype)
    bottom, top = blobs([scores, labels], dtype), empty_blobs(ntop, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize(
    "k,total,per_class",
    [(1, 1 / 5, [0, 0.5, 0, 0]), (2, 3 / 5, [1, 1, 0, 0]), (3, 4 / 5, [1, 1, 1, 0]), (4, 1.0, [1, 1, 1, 1])],
)
def test_top_k_ties_and_ignore(mode, k, total, per_class):
    _, _, top = run(f"accuracy_param {{ top_k: {k} ignore_label: -1 }}", SCORES, LABELS, ntop=2)
    assert top[0].shape == () and top[1].shape == (4,)
    np.testing.assert_allclose(top[0].data, total, rtol=1e-12)
    np.testing.assert_allclose(top[1].data, per_class, rtol=1e-12)


def test_ignore_label_that_is_a_class(mode):
    labels = np.array([1, 0, 1, 3, 2, 0], dtype=float)  # positions labelled 0 are skipped
    _, _, top = run("accuracy_param { ignore_label: 0 }", SCORES, labels, ntop=2)
    np.testing.assert_allclose(top[0].data, 1 / 4)  # samples 0, 2, 3, 4: only sample 0 right
    np.testing.assert_allclose(top[1].data, [0, 0.5, 0, 0])


def test_everything_ignored_gives_zero(mode):
    _, _, top = run("accuracy_param { ignore_label: 2 }", SCORES[:2], np.array([2.0, 2.0]), ntop=2)
    assert top[0].data == 0 and np.all(top[1].data == 0)


def naive_accuracy(scores, labels, axis, k):
    s = np.moveaxis(scores, axis, -1).reshape(-1, scores.shape[axis])
    lab = labels.reshape(-1).astype(int)
    hits = [(row >= row[lab_i]).sum() - 1 < k for row, lab_i in zip(s, lab)]
    return np.mean(hits)


@pytest.mark.parametrize("shape,axis,k", [((4, 5, 2, 3), 1, 1), ((4, 5, 2, 3), 1, 3), ((3, 2, 6), 2, 2), ((6, 4), -1, 2)])
def test_axis_random(mode, shape, axis, k):
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, shape).astype(float)  # small integers: many ties
    ax = axis % len(shape)
    labels = rng.integers(0, shape[ax], shape[:ax] + shape[ax + 1 :]).astype(float)
    _, _, top = run(f"accuracy_param {{ axis: {axis} top_k: {k} }}", scores, labels)
    np.testing.assert_allclose(top[0].data, naive_accuracy(scores, labels, ax, k), rtol=1e-12)


def test_top_k_larger_than_classes_is_clear():
    layer = make_layer("type: 'Accuracy' accuracy_param { top_k: 5 }")
    with pytest.raises(ShapeError, match="top_k must be less than or equal to the number of classes"):
        layer.setup(blobs([SCORES, LABELS]), empty_blobs(1))


def test_label_count_mismatch_is_clear():
    layer = make_layer("type: 'Accuracy'")
    with pytest.raises(ShapeError, match="number of labels must match"):
        layer.setup(blobs([np.zeros((2, 3, 2)), np.zeros(2)]), empty_blobs(1))


def test_label_out_of_range_is_clear(mode):
    if mode == "cpu":
        with pytest.raises(NetError, match="label 4 out of range"):
            run("", SCORES[:2], np.array([4.0, 0.0]))
    else:  # the GPU forward reads nothing back: the accuracy becomes NaN
        _, _, top = run("", SCORES[:2], np.array([4.0, 0.0]))
        assert np.isnan(top[0].data)


def test_no_backward(mode):
    layer, bottom, top = run("", SCORES[:5], LABELS[:5])
    assert not layer.allow_force_backward(0)
    layer.backward(top, [False, False], bottom)  # nothing asked: fine
    with pytest.raises(NetError, match="no backward"):
        layer.backward(top, [True, False], bottom)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("text", ["", "accuracy_param { top_k: 2 ignore_label: 1 }", "accuracy_param { axis: 2 top_k: 3 }"])
def test_cpu_gpu_agree(dtype, text):
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 5, (6, 5, 7)).astype(float)
    axis = 2 if "axis: 2" in text else 1
    labels = rng.integers(0, scores.shape[axis], (6, 7) if axis == 1 else (6, 5)).astype(float)
    assert_cpu_gpu_agree(f"type: 'Accuracy' {text}", [scores, labels], ntop=2, propagate=[False, False],
                         dtype=dtype, rtol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_scores_give_nan_not_a_confident_accuracy(mode, bad):
    """A NaN score compares false with everything, so the true class would look unbeaten: the
    headline must say NaN (the item predicts nothing), not 1."""
    scores = SCORES.copy()
    scores[0, 2] = bad  # row 0 (label 1) has an undefined score
    _, _, top = run("accuracy_param { ignore_label: -1 }", scores, LABELS, ntop=2)
    assert np.isnan(top[0].data)
    per_class = top[1].data
    assert np.isnan(per_class[1]) and per_class[0] == 0 and per_class[3] == 0
    scores = SCORES.copy()
    scores[5, 0] = np.nan  # only in an ignored position: no effect
    _, _, top = run("accuracy_param { ignore_label: -1 }", scores, LABELS)
    np.testing.assert_allclose(top[0].data, 1 / 5, rtol=1e-12)


def test_nan_label_is_named_not_a_huge_integer():
    labels = LABELS.copy()
    labels[2] = np.nan
    with pytest.raises(NetError, match=r"label nan is not a number"):
        run("", SCORES, labels)


@pytest.mark.gpu
def test_nan_label_gives_nan_on_the_gpu(mode):
    if mode != "gpu":
        pytest.skip("GPU path: no host read during forward")
    labels = LABELS.copy()
    labels[2] = np.nan
    _, _, top = run("", SCORES, labels)
    assert np.isnan(top[0].data)
