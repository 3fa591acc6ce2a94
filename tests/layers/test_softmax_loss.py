"""SoftmaxWithLoss: hand-checked losses for every normalization mode and ignore_label, the
probability top, label checks, gradients, CPU-vs-GPU agreement."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def naive_loss(x, labels, axis=1, ignore=None, mode="VALID"):
    """Loop-based reference: returns (loss, gradient for loss weight 1)."""
    x = np.moveaxis(np.asarray(x, np.float64), axis, -1)  # (..., C)
    lab = np.asarray(labels).reshape(x.shape[:-1]).astype(int)
    total, valid, grad = 0.0, 0, np.zeros_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        if ignore is not None and lab[idx] == ignore:
            continue
        e = np.exp(x[idx] - x[idx].max())
        p = e / e.sum()
        total -= np.log(max(p[lab[idx]], np.finfo(np.float32).tiny))
        valid += 1
        grad[idx] = p
        grad[idx][lab[idx]] -= 1
    outer = int(np.prod(x.shape[:axis]))
    norm = {"FULL": lab.size, "VALID": valid, "BATCH_SIZE": outer, "NONE": 1}[mode]
    norm = max(norm, 1)
    return total / norm, np.moveaxis(grad / norm, -1, axis)


def run(text, x, labels, ntop=1, weight=1.0, dtype=np.float64):
    layer = make_layer(f"type: 'SoftmaxWithLoss' {text}", dtype)
    bottom, top = blobs([x, labels], dtype), empty_blobs(ntop, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = weight
    layer.backward(top, [True, False], bottom)
    return layer, bottom, top


def test_hand_checked_two_samples():
    # equal scores: p = 1/4 each -> loss ln 4 per sample, mean over the 2 samples
    x = np.zeros((2, 4))
    _, bottom, top = run("", x, np.array([1.0, 3.0]))
    np.testing.assert_allclose(top[0].data, np.log(4.0), rtol=1e-14)
    np.testing.assert_allclose(bottom[0].diff, [[0.125, -0.375, 0.125, 0.125], [0.125, 0.125, 0.125, -0.375]])


@pytest.mark.parametrize("mode_name", ["FULL", "VALID", "BATCH_SIZE", "NONE"])
@pytest.mark.parametrize("ignore", [None, 2])
def test_normalization_modes(mode, mode_name, ignore):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 2, 2))
    labels = rng.integers(0, 4, (3, 1, 2, 2)).astype(float)
    labels[0, 0, 0, 0], labels[1, 0, 1, 1] = 2, 2  # at least two ignored positions when ignore=2
    ign = f"ignore_label: {ignore}" if ignore is not None else ""
    _, bottom, top = run(f"loss_param {{ normalization: {mode_name} {ign} }}", x, labels, weight=1.5)
    loss, grad = naive_loss(x, labels, ignore=ignore, mode=mode_name)
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, 1.5 * grad, rtol=1e-11, atol=1e-15)
    if ignore is not None:  # no gradient at ignored positions
        mask = np.broadcast_to(labels == ignore, x.shape)
        assert np.all(bottom[0].diff[mask] == 0)


def test_ignore_label_hand_checked():
    # sample 0 label 0 with p = [e/(e+1), 1/(e+1)]; sample 1 ignored; VALID divides by 1
    x = np.array([[1.0, 0.0], [5.0, -3.0]])
    _, bottom, top = run("loss_param { ignore_label: 7 }", x, np.array([0.0, 7.0]))
    np.testing.assert_allclose(top[0].data, np.log1p(np.exp(-1.0)), rtol=1e-14)
    np.testing.assert_allclose(bottom[0].diff[1], [0.0, 0.0])
    np.testing.assert_allclose(bottom[0].diff[0], [np.e / (np.e + 1) - 1, 1 / (np.e + 1)], rtol=1e-14)


@pytest.mark.parametrize("normalize,expected", [("true", "VALID"), ("false", "BATCH_SIZE")])
def test_legacy_normalize(normalize, expected):
    rng = np.random.default_rng(1)
    x, labels = rng.standard_normal((2, 3, 3)), rng.integers(0, 3, (2, 3)).astype(float)
    labels[0, 0] = 1
    _, _, top = run(f"loss_param {{ normalize: {normalize} ignore_label: 1 }}", x, labels)
    np.testing.assert_allclose(top[0].data, naive_loss(x, labels, ignore=1, mode=expected)[0], rtol=1e-12)
    # an explicit normalization wins over the legacy flag
    _, _, top = run(f"loss_param {{ normalize: {normalize} normalization: NONE }}", x, labels)
    np.testing.assert_allclose(top[0].data, naive_loss(x, labels, mode="NONE")[0], rtol=1e-12)


def test_all_ignored_gives_zero_loss():
    _, bottom, top = run("loss_param { ignore_label: 0 }", np.ones((2, 3)), np.zeros(2))
    assert top[0].data == 0.0
    assert np.all(bottom[0].diff == 0)


def test_axis_and_probability_top(mode):
    rng = np.random.default_rng(2)
    x, labels = rng.standard_normal((2, 3, 4)), rng.integers(0, 4, (2, 3)).astype(float)
    layer, bottom, top = run("softmax_param { axis: 2 }", x, labels, ntop=2)
    loss, grad = naive_loss(x, labels, axis=2)
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, grad, rtol=1e-11, atol=1e-15)
    e = np.exp(x - x.max(axis=2, keepdims=True))
    np.testing.assert_allclose(top[1].data, e / e.sum(axis=2, keepdims=True), rtol=1e-12)
    assert layer.loss(0) == 1.0 and layer.loss(1) == 0.0


def test_tiny_probability_is_clamped():
    _, _, top = run("", np.array([[0.0, 2000.0]]), np.array([0.0]))
    np.testing.assert_allclose(top[0].data, -np.log(float(np.finfo(np.float32).tiny)), rtol=1e-12)


def test_label_count_mismatch_is_clear():
    layer = make_layer("type: 'SoftmaxWithLoss'")
    with pytest.raises(ShapeError, match="number of labels must match.*needs 6 labels.*holds 4"):
        layer.setup(blobs([np.zeros((2, 3, 3)), np.zeros((2, 2))]), empty_blobs(1))


def test_label_out_of_range_is_clear(mode):
    layer = make_layer("type: 'SoftmaxWithLoss'")
    bottom, top = blobs([np.zeros((2, 3)), np.array([0.0, 3.0])]), empty_blobs(1)
    layer.setup(bottom, top)
    with pytest.raises(NetError, match=r"label 3 out of range.*\[0, 3\)"):
        layer.forward(bottom, top)


def test_labels_cannot_be_backpropagated(mode):
    layer = make_layer("type: 'SoftmaxWithLoss'")
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    bottom, top = blobs([np.zeros((2, 3)), np.array([0.0, 1.0])]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    with pytest.raises(NetError, match="cannot backpropagate to label"):
        layer.backward(top, [True, True], bottom)


@pytest.mark.parametrize(
    "text,shape",
    [
        ("", (3, 4)),
        ("loss_param { ignore_label: 1 normalization: FULL }", (2, 3, 2)),
        ("softmax_param { axis: 2 } loss_param { normalization: BATCH_SIZE }", (2, 2, 3)),
    ],
)
def test_gradient(mode, text, shape):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape)
    axis = 2 if "axis: 2" in text else 1
    lshape = shape[:axis] + shape[axis + 1 :]
    labels = rng.integers(0, shape[axis], lshape).astype(float)
    layer = make_layer(f"type: 'SoftmaxWithLoss' {text}")
    GradientChecker(1e-3, 1e-4).check(layer, blobs([x, labels]), empty_blobs(1), check_bottom=[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "text",
    ["", "loss_param { ignore_label: 2 }", "loss_param { ignore_label: 0 normalization: FULL }",
     "loss_param { normalization: BATCH_SIZE }", "loss_param { normalization: NONE ignore_label: 1 }",
     "softmax_param { axis: 2 }"],
)
def test_cpu_gpu_agree(dtype, text):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5, 4)) * 3
    axis = 2 if "axis: 2" in text else 1
    labels = rng.integers(0, x.shape[axis], (3, 4) if axis == 1 else (3, 5)).astype(float)
    tol = 2e-5 if dtype == np.float32 else 1e-11
    assert_cpu_gpu_agree(f"type: 'SoftmaxWithLoss' {text}", [x, labels], ntop=2, propagate=[True, False],
                         dtype=dtype, rtol=tol, atol=tol)


def test_in_a_net_auto_top_and_no_label_gradient(mode):
    from pycaffe_lite.proto.protoio import parse_text
    from pycaffe_lite.schema import caffe_pb2

    text = """force_backward: true
    layer { name: "data" type: "Input" top: "data" top: "label"
            input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "data" bottom: "label" loss_weight: 2 }"""
    net = caffe.Net(parse_text(text, caffe_pb2.NetParameter(), "<net>"), caffe.TRAIN, dtype=np.float64)
    x = np.random.default_rng(5).standard_normal((2, 3))
    net.blobs["data"].data[...] = x
    net.blobs["label"].data[...] = [1, 2]
    (loss,) = net.forward().values()  # the loss layer got an automatic top
    expected, grad = naive_loss(x, np.array([1, 2]))
    np.testing.assert_allclose(loss, expected, rtol=1e-12)
    net.backward()
    np.testing.assert_allclose(net.blobs["data"].diff, 2 * grad, rtol=1e-11)
    assert np.all(net.blobs["label"].diff == 0)  # force_backward never reaches the labels


@pytest.mark.parametrize("ignore", ["", "loss_param { ignore_label: -1 }"])
def test_nan_label_is_named_not_a_huge_integer(mode, ignore):
    """(On the GPU a NaN label used to be truncated to class 0 or the ignore label.)"""
    layer = make_layer(f"type: 'SoftmaxWithLoss' {ignore}")
    bottom, top = blobs([np.zeros((2, 3)), np.array([0.0, np.nan])]), empty_blobs(1)
    layer.setup(bottom, top)
    with pytest.raises(NetError, match=r"label nan is not a number: labels must be class indices in \[0, 3\)"):
        layer.forward(bottom, top)
