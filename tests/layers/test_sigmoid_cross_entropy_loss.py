"""SigmoidCrossEntropyLoss: losses against the textbook formula for every normalization, ignore_label,
stability for large scores, gradients, CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def naive(x, t, ignore=None, mode="BATCH_SIZE"):
    """Loop over elements with p = 1/(1+e^-x) in high precision: (loss, gradient for weight 1)."""
    x, t = np.asarray(x, np.float64), np.asarray(t, np.float64).reshape(np.shape(x))
    total, valid, grad = 0.0, 0, np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        if ignore is not None and int(t[idx]) == ignore:
            continue
        p = 1 / (1 + np.exp(-np.longdouble(x[idx])))
        total -= float(t[idx] * np.log(p) + (1 - t[idx]) * np.log1p(-p))
        grad[idx] = float(p) - t[idx]
        valid += 1
    norm = {"FULL": x.size, "VALID": valid, "BATCH_SIZE": x.shape[0], "NONE": 1}[mode]
    norm = max(norm, 1)
    return total / norm, grad / norm


def run(text, x, t, weight=1.0, dtype=np.float64):
    layer = make_layer(f"type: 'SigmoidCrossEntropyLoss' {text}", dtype)
    bottom, top = blobs([x, t], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = weight
    layer.backward(top, [True, False], bottom)
    return layer, bottom, top


def test_hand_checked():
    # x = 0: p = 1/2, every element costs ln 2; default normalization divides by the batch size 2
    _, bottom, top = run("", np.zeros((2, 3)), np.array([[1, 0, 0.5], [0, 1, 1]]))
    np.testing.assert_allclose(top[0].data, 3 * np.log(2), rtol=1e-14)
    np.testing.assert_allclose(bottom[0].diff, [[-0.25, 0.25, 0], [0.25, -0.25, -0.25]], rtol=1e-14)


@pytest.mark.parametrize("mode_name", ["FULL", "VALID", "BATCH_SIZE", "NONE"])
@pytest.mark.parametrize("ignore", [None, -1])
def test_normalization_modes(mode, mode_name, ignore):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 2)) * 3
    t = rng.uniform(0, 1, (3, 4))
    t[0, 1], t[2, 3] = -1, -1  # ignored when ignore_label is -1
    ign = f"ignore_label: {ignore}" if ignore is not None else ""
    _, bottom, top = run(f"loss_param {{ normalization: {mode_name} {ign} }}", x, t, weight=0.5)
    loss, grad = naive(x, t, ignore, mode_name)
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, 0.5 * grad, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("normalize,expected", [("true", "VALID"), ("false", "BATCH_SIZE")])
def test_legacy_normalize_and_default(normalize, expected):
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((2, 5)), rng.integers(0, 2, (2, 5)).astype(float)
    t[0, 0] = 3
    _, _, top = run(f"loss_param {{ normalize: {normalize} ignore_label: 3 }}", x, t)
    np.testing.assert_allclose(top[0].data, naive(x, t, 3, expected)[0], rtol=1e-12)
    _, _, top = run("loss_param { ignore_label: 3 }", x, t)  # BVLC's default here is BATCH_SIZE
    np.testing.assert_allclose(top[0].data, naive(x, t, 3, "BATCH_SIZE")[0], rtol=1e-12)


def test_stable_for_large_scores(mode):
    x = np.array([[800.0, -800.0, 40.0, -40.0]])
    t = np.array([[0.0, 1.0, 1.0, 0.0]])
    _, bottom, top = run("", x, t)
    np.testing.assert_allclose(top[0].data, 1600 + 2 * np.log1p(np.exp(-40.0)), rtol=1e-14)
    assert np.all(np.isfinite(bottom[0].diff))
    tiny = np.exp(-40) / (1 + np.exp(-40))  # sigmoid(40) rounds to 1: its gradient may come out 0
    np.testing.assert_allclose(bottom[0].diff, [[1, -1, -tiny, tiny]], rtol=1e-12, atol=1e-16)


def test_all_ignored_gives_zero():
    _, bottom, top = run("loss_param { ignore_label: 0 normalization: VALID }", np.ones((2, 2)), np.zeros((2, 2)))
    assert top[0].data == 0.0 and np.all(bottom[0].diff == 0)


def test_shape_errors_and_labels():
    layer = make_layer("type: 'SigmoidCrossEntropyLoss'")
    with pytest.raises(ShapeError, match="same count"):
        layer.setup(blobs([np.zeros((2, 3)), np.zeros((2, 4))]), empty_blobs(1))
    with pytest.raises(ShapeError, match="same first dimension"):
        make_layer("type: 'SigmoidCrossEntropyLoss'").setup(blobs([np.zeros((2, 3)), np.zeros((3, 2))]),
                                                            empty_blobs(1))
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    layer, bottom, top = run("", np.zeros((2, 2)), np.zeros((2, 2)))
    with pytest.raises(NetError, match="cannot backpropagate to label"):
        layer.backward(top, [True, True], bottom)


@pytest.mark.parametrize("text", ["", "loss_param { ignore_label: 1 normalization: VALID }",
                                  "loss_param { normalization: FULL }"])
def test_gradient(mode, text):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 2))
    t = rng.uniform(0, 1, (2, 3, 2))
    t[0, 0, 0] = 1.0
    layer = make_layer(f"type: 'SigmoidCrossEntropyLoss' {text}")
    GradientChecker(1e-3, 1e-4).check(layer, blobs([x, t]), empty_blobs(1), check_bottom=[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("text", ["", "loss_param { ignore_label: 1 normalization: VALID }",
                                  "loss_param { ignore_label: 0 normalization: FULL }",
                                  "loss_param { normalization: NONE }", "loss_param { normalization: VALID }"])
def test_cpu_gpu_agree(dtype, text):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 50)) * 4
    t = rng.integers(0, 2, (3, 50)).astype(float)
    t[:, ::7] = rng.uniform(0, 1, (3, 8))
    tol = 2e-5 if dtype == np.float32 else 1e-11
    assert_cpu_gpu_agree(f"type: 'SigmoidCrossEntropyLoss' {text}", [x, t], propagate=[True, False], dtype=dtype,
                         rtol=tol, atol=tol)
