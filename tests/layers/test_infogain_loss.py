"""InfogainLoss: losses and gradients against a loop, H from bottom 2 and from a binaryproto,
identity H equals SoftmaxWithLoss, ignore_label and normalization, axis, gradient checks,
CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.io import array_to_blobproto
from pycaffe_lite.proto.protoio import write_binary
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer

THRESHOLD = float(np.float32(1e-20))


def naive(x, labels, h, axis=1, ignore=None, mode="VALID"):
    """Loop reference: (loss, gradient for loss weight 1, probabilities)."""
    xm = np.moveaxis(np.asarray(x, np.float64), axis, -1)  # (..., C)
    lab = np.asarray(labels).reshape(xm.shape[:-1]).astype(int)
    h = np.asarray(h, np.float64).reshape(xm.shape[-1], xm.shape[-1])
    total, valid = 0.0, 0
    grad, prob = np.zeros_like(xm), np.zeros_like(xm)
    for idx in np.ndindex(xm.shape[:-1]):
        e = np.exp(xm[idx] - xm[idx].max())
        p = e / e.sum()
        prob[idx] = p
        if ignore is not None and lab[idx] == ignore:
            continue
        row = h[lab[idx]]
        for c in range(len(p)):
            total -= row[c] * np.log(max(p[c], THRESHOLD))
            grad[idx][c] = p[c] * row.sum() - row[c]
        valid += 1
    outer = int(np.prod(xm.shape[:axis]))
    norm = max(1, {"FULL": lab.size, "VALID": valid, "BATCH_SIZE": outer, "NONE": 1}[mode])
    return total / norm, np.moveaxis(grad / norm, -1, axis), np.moveaxis(prob, -1, axis)


def run(text, arrays, ntop=1, weight=1.0, dtype=np.float64):
    layer = make_layer(f"type: 'InfogainLoss' {text}", dtype)
    bottom, top = blobs(arrays, dtype), empty_blobs(ntop, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = weight
    layer.backward(top, [True] + [False] * (len(arrays) - 1), bottom)
    return layer, bottom, top


def _case(seed=0, shape=(4, 3), axis=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 2
    c = shape[axis]
    labels = rng.integers(0, c, shape[:axis] + shape[axis + 1:]).astype(float)
    h = rng.uniform(0, 1, (c, c))
    return x, labels, h


def test_identity_h_is_softmax_with_loss(mode):
    x, labels, _ = _case(1, (3, 4, 2))
    _, b1, t1 = run("", [x, labels, np.eye(4)], ntop=2)
    sm = make_layer("type: 'SoftmaxWithLoss'")
    b2, t2 = blobs([x, labels]), empty_blobs(1)
    sm.setup(b2, t2)
    sm.forward(b2, t2)
    t2[0].diff[...] = 1.0
    sm.backward(t2, [True, False], b2)
    np.testing.assert_allclose(t1[0].data, t2[0].data, rtol=1e-12)
    np.testing.assert_allclose(b1[0].diff, b2[0].diff, rtol=1e-12, atol=1e-15)


def test_general_h_with_probability_top(mode):
    x, labels, h = _case(2, (3, 4, 2, 2))
    layer, bottom, top = run("", [x, labels, h], ntop=2, weight=0.5)
    loss, grad, prob = naive(x, labels, h)
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, 0.5 * grad, rtol=1e-11, atol=1e-15)
    np.testing.assert_allclose(top[1].data, prob, rtol=1e-12)
    assert layer.loss(0) == 1.0 and layer.loss(1) == 0.0


@pytest.mark.parametrize("mode_name", ["FULL", "VALID", "BATCH_SIZE", "NONE"])
def test_ignore_label_and_normalization(mode_name):
    x, labels, h = _case(3, (3, 3, 4))
    labels[0, 0], labels[2, 3] = 1, 1
    _, bottom, top = run(f"loss_param {{ ignore_label: 1 normalization: {mode_name} }}", [x, labels, h])
    loss, grad, _ = naive(x, labels, h, ignore=1, mode=mode_name)
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, grad, rtol=1e-11, atol=1e-15)
    mask = np.broadcast_to((labels == 1)[:, None, :], x.shape)
    assert np.all(bottom[0].diff[mask] == 0)


def test_h_from_binaryproto(mode, tmp_path):
    x, labels, h = _case(4, (5, 3))
    h = h.astype(np.float32).astype(np.float64)  # BlobProto data are floats
    path = tmp_path / "H.binaryproto"
    write_binary(path, array_to_blobproto(h.reshape(1, 1, 3, 3)))
    _, bottom, top = run(f"infogain_loss_param {{ source: '{path}' }}", [x, labels])
    loss, grad, _ = naive(x, labels, h)
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, grad, rtol=1e-11, atol=1e-15)


def test_axis(monkeypatch):
    """BVLC master's infogain_loss_param.axis (the schema may lack the field: patch the reader)."""
    from pycaffe_lite.layers import infogain_loss as infogain_module

    monkeypatch.setattr(infogain_module, "infogain_axis", lambda param: 2)
    x, labels, h = _case(5, (2, 3, 4), axis=2)
    _, bottom, top = run("", [x, labels, h])
    loss, grad, _ = naive(x, labels, h, axis=2)
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, grad, rtol=1e-11, atol=1e-15)


def test_errors(mode, tmp_path):
    with pytest.raises(NetError, match="source is required"):
        make_layer("type: 'InfogainLoss'").setup(blobs([np.zeros((2, 3)), np.zeros(2)]), empty_blobs(1))
    with pytest.raises(NetError, match="normalize is deprecated"):
        make_layer("type: 'InfogainLoss' loss_param { normalize: true }").setup(
            blobs([np.zeros((2, 3)), np.zeros(2), np.eye(3)]), empty_blobs(1))
    with pytest.raises(ShapeError, match="H must be 3x3"):
        make_layer("type: 'InfogainLoss'").setup(blobs([np.zeros((2, 3)), np.zeros(2), np.eye(2)]), empty_blobs(1))
    with pytest.raises(ShapeError, match="number of labels must match"):
        make_layer("type: 'InfogainLoss'").setup(blobs([np.zeros((2, 3, 2)), np.zeros(2), np.eye(3)]),
                                                 empty_blobs(1))
    with pytest.raises(Exception, match="(cannot read|file not found)"):
        make_layer(f"type: 'InfogainLoss' infogain_loss_param {{ source: '{tmp_path / 'missing'}' }}").setup(
            blobs([np.zeros((2, 3)), np.zeros(2)]), empty_blobs(1))
    layer = make_layer("type: 'InfogainLoss'")
    assert layer.allow_force_backward(0)
    assert not layer.allow_force_backward(1) and not layer.allow_force_backward(2)
    bottom, top = blobs([np.zeros((2, 3)), np.array([0.0, 5.0]), np.eye(3)]), empty_blobs(1)
    layer.setup(bottom, top)
    with pytest.raises(NetError, match="label 5 out of range"):
        layer.forward(bottom, top)
    layer, bottom, top = run("", [np.zeros((2, 3)), np.zeros(2), np.eye(3)])
    with pytest.raises(NetError, match=r"cannot backpropagate to label inputs \(bottom 2\)"):
        layer.backward(top, [True, False, True], bottom)


@pytest.mark.parametrize("text,shape", [("", (3, 4)), ("loss_param { ignore_label: 0 normalization: FULL }", (2, 3, 2))])
def test_gradient(mode, text, shape):
    x, labels, h = _case(6, shape)
    labels.reshape(-1)[0] = 0
    layer = make_layer(f"type: 'InfogainLoss' {text}")
    GradientChecker(1e-3, 1e-4).check(layer, blobs([x, labels, h]), empty_blobs(1), check_bottom=[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("text", ["", "loss_param { ignore_label: 2 }", "loss_param { normalization: BATCH_SIZE }",
                                  "loss_param { ignore_label: 0 normalization: NONE }"])
def test_cpu_gpu_agree(dtype, text):
    x, labels, h = _case(7, (3, 5, 4))
    tol = 2e-5 if dtype == np.float32 else 1e-11
    assert_cpu_gpu_agree(f"type: 'InfogainLoss' {text}", [x, labels, h], ntop=2, propagate=[True, False, False],
                         dtype=dtype, rtol=tol, atol=tol)
