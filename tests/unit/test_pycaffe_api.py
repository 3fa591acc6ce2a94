"""pycaffe surface: Net construction both ways, forward/backward ranges and kwargs, forward_all,
forward_backward_all, blob lifetimes, caffemodel and HDF5 weights, Classifier, Detector, Timer, logs."""

import gc
import sys
import time

import numpy as np
import pytest

import pycaffe_lite as caffe
import pycaffe_lite.proto.hdf5_weights
from pycaffe_lite import io as cio
from pycaffe_lite.classifier import Classifier
from pycaffe_lite.detector import Detector
from pycaffe_lite.errors import NetError, WeightsError
from pycaffe_lite.glog import init_log, log
from pycaffe_lite.net import Net
from pycaffe_lite.timer import Timer

TRAIN_NET = """
name: "small"
force_backward: true
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 5 dim: 2 dim: 3 dim: 3 } shape { dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 3 kernel_size: 2
          weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 }
          bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""

DEPLOY_NET = """
name: "deploy"
force_backward: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 3 dim: 3 dim: 4 dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 }
          bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


@pytest.fixture
def train_path(tmp_path):
    p = tmp_path / "train.prototxt"
    p.write_text(TRAIN_NET)
    return str(p)


@pytest.fixture
def deploy_path(tmp_path):
    p = tmp_path / "deploy.prototxt"
    p.write_text(DEPLOY_NET)
    return str(p)


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def _conv_ref(x, w, b):
    n, c, h, wd = x.shape
    o, _, k, _ = w.shape
    out = np.zeros((n, o, h - k + 1, wd - k + 1))
    for i in range(h - k + 1):
        for j in range(wd - k + 1):
            patch = x[:, :, i : i + k, j : j + k].reshape(n, -1)
            out[:, :, i, j] = patch @ w.reshape(o, -1).T + b
    return out


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((5, 2, 3, 3)).astype(np.float32), rng.integers(0, 4, 5).astype(np.float32)


# -- construction -----------------------------------------------------------------------------
def test_construct_both_ways_with_saved_weights(train_path, tmp_path):
    caffe.set_random_seed(1)
    net = Net(train_path, caffe.TRAIN)
    weights = str(tmp_path / "small.caffemodel")
    net.save(weights)
    caffe.set_random_seed(2)
    fresh = Net(train_path, caffe.TEST)
    assert not np.allclose(fresh.params["conv"][0].data, net.params["conv"][0].data)
    for loaded in (Net(train_path, weights, caffe.TEST), Net(train_path, caffe.TEST, weights=weights)):
        assert loaded.phase == caffe.TEST
        for name in ("conv", "ip"):
            for a, b in zip(loaded.params[name], net.params[name]):
                np.testing.assert_array_equal(a.data, b.data)
    fresh.copy_from(weights)
    np.testing.assert_array_equal(fresh.params["ip"][1].data, net.params["ip"][1].data)


def test_forward_backward_full(train_path):
    caffe.set_random_seed(3)
    net = Net(train_path, caffe.TRAIN)
    x, y = _inputs()
    out = net.forward(data=x, label=y)
    w, b = (p.data.astype(np.float64) for p in net.params["conv"])
    wi, bi = (p.data.astype(np.float64) for p in net.params["ip"])
    conv = _conv_ref(x.astype(np.float64), w, b)
    ip = conv.reshape(5, -1) @ wi.T + bi
    p = _softmax(ip)
    loss = -np.mean(np.log(p[np.arange(5), y.astype(int)]))
    assert set(out) == {"loss"}
    assert float(out["loss"]) == pytest.approx(loss, rel=1e-4)
    np.testing.assert_allclose(net.blobs["conv"].data, conv, rtol=1e-4, atol=1e-5)
    grads = net.backward()
    assert set(grads) == {"data", "label"}
    dip = (p - np.eye(4)[y.astype(int)]) / 5
    dconv = (dip @ wi).reshape(conv.shape)
    dx = np.zeros_like(x, dtype=np.float64)
    for i in range(2):
        for j in range(2):
            dx[:, :, i : i + 2, j : j + 2] += np.einsum("no,ockl->nckl", dconv[:, :, i, j], w)
    np.testing.assert_allclose(grads["data"], dx, rtol=1e-3, atol=1e-5)


def test_forward_start_end_and_extra_blobs(train_path):
    net = Net(train_path, caffe.TRAIN)
    x, y = _inputs(1)
    net.forward(data=x, label=y)
    full_ip = net.blobs["ip"].data.copy()
    out = net.forward(end="conv")
    assert set(out) == {"conv"}
    out = net.forward(blobs=["conv"], start="ip", end="ip")
    assert set(out) == {"ip", "conv"}
    np.testing.assert_allclose(out["ip"], full_ip, rtol=1e-6)
    # start after a changed intermediate: only later layers see it
    net.blobs["conv"].data[...] = 0
    out = net.forward(start="ip", end="ip")
    np.testing.assert_allclose(out["ip"], np.broadcast_to(net.params["ip"][1].data, (5, 4)), rtol=1e-6)


def test_backward_start_end_and_top_diff_kwargs(train_path):
    net = Net(train_path, caffe.TRAIN)
    x, y = _inputs(2)
    net.forward(data=x, label=y)
    g = np.random.default_rng(5).standard_normal((5, 4)).astype(np.float32)
    out = net.backward(start="ip", end="ip", ip=g, diffs=["ip"])
    assert set(out) == {"conv", "ip"}
    wi = net.params["ip"][0].data
    np.testing.assert_allclose(out["conv"].reshape(5, -1), g @ wi, rtol=1e-4, atol=1e-6)
    with pytest.raises(NetError, match="no_such_blob"):
        net.backward(no_such_blob=g)


# -- forward_all / forward_backward_all -------------------------------------------------------
def test_forward_all_pads_last_batch(mode, deploy_path):
    net = Net(deploy_path, caffe.TEST)
    x = np.random.default_rng(6).standard_normal((7, 3, 4, 4)).astype(np.float32)
    out = net.forward_all(data=x, blobs=["ip"])
    assert set(out) == {"prob", "ip"}
    w, b = net.params["ip"][0].data, net.params["ip"][1].data
    ip = x.reshape(7, -1).astype(np.float64) @ w.T + b
    assert out["ip"].shape == (7, 5)
    np.testing.assert_allclose(out["ip"], ip, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["prob"], _softmax(ip), rtol=1e-4, atol=1e-6)
    # exactly one batch, and fewer items than a batch
    np.testing.assert_allclose(net.forward_all(data=x[:3])["prob"], _softmax(ip[:3]), rtol=1e-4, atol=1e-6)
    one = net.forward_all(data=x[:1])["prob"]
    assert one.shape == (1, 5)
    np.testing.assert_allclose(one, _softmax(ip[:1]), rtol=1e-4, atol=1e-6)


def test_forward_all_without_inputs_runs_once(deploy_path):
    net = Net(deploy_path, caffe.TEST)
    net.blobs["data"].data[...] = 1
    out = net.forward_all()
    assert out["prob"].shape == (3, 5)
    net.blobs["prob"].data[...] = -1  # outputs are copies
    assert np.all(out["prob"] > 0)


def test_forward_backward_all(mode, deploy_path):
    net = Net(deploy_path, caffe.TEST)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 3, 4, 4)).astype(np.float32)
    g = rng.standard_normal((5, 5)).astype(np.float32)
    outs, diffs = net.forward_backward_all(data=x, prob=g)
    w, b = net.params["ip"][0].data.astype(np.float64), net.params["ip"][1].data
    p = _softmax(x.reshape(5, -1) @ w.T + b)
    np.testing.assert_allclose(outs["prob"], p, rtol=1e-4, atol=1e-6)
    dip = p * (g - np.sum(g * p, axis=1, keepdims=True))
    assert diffs["data"].shape == (5, 3, 4, 4)
    np.testing.assert_allclose(diffs["data"].reshape(5, -1), dip @ w, rtol=1e-3, atol=1e-5)
    with pytest.raises(NetError, match="neither inputs"):
        net.forward_backward_all(ip=g)


def test_batch_length_mismatch(deploy_path):
    net = Net(deploy_path, caffe.TEST)
    with pytest.raises(caffe.ShapeError, match="same number of items"):
        net.forward_backward_all(data=np.zeros((4, 3, 4, 4)), prob=np.zeros((3, 5)))


# -- lifetimes --------------------------------------------------------------------------------
def test_blobs_and_params_outlive_net(deploy_path):
    net = Net(deploy_path, caffe.TEST)
    net.forward(data=np.full((3, 3, 4, 4), 0.5, np.float32))
    prob = net.blobs["prob"]
    weight = net.params["ip"][0]
    prob_view = prob.data
    expected_prob = prob_view.copy()
    expected_w = weight.data.copy()
    layers = net.layers
    del net
    gc.collect()
    np.testing.assert_array_equal(prob.data, expected_prob)
    np.testing.assert_array_equal(prob_view, expected_prob)
    np.testing.assert_array_equal(weight.data, expected_w)
    weight.data[...] = 2.0
    assert np.all(layers[1].blobs[0].data == 2.0)


# -- HDF5 weights -----------------------------------------------------------------------------
def test_save_load_hdf5(train_path, tmp_path):
    h5py = pytest.importorskip("h5py")
    caffe.set_random_seed(8)
    net = Net(train_path, caffe.TRAIN)
    path = str(tmp_path / "w.h5")
    net.save_hdf5(path)
    with h5py.File(path, "r") as f:
        assert set(f["data"]) == set(net._layer_names)
        assert set(f["data"]["conv"]) == {"0", "1"}
        np.testing.assert_array_equal(f["data"]["ip"]["0"][()], net.params["ip"][0].data)
        assert f["data"]["ip"]["0"].dtype == np.float32
        assert len(f["data"]["loss"]) == 0
    assert pycaffe_lite.proto.hdf5_weights.is_hdf5_file(path)
    assert not pycaffe_lite.proto.hdf5_weights.is_hdf5_file(train_path)
    caffe.set_random_seed(9)
    other = Net(train_path, caffe.TEST)
    other.load_hdf5(path)
    for name in ("conv", "ip"):
        for a, b in zip(other.params[name], net.params[name]):
            np.testing.assert_array_equal(a.data, b.data)


def test_hdf5_write_diff_and_shape_mismatch(train_path, tmp_path):
    h5py = pytest.importorskip("h5py")
    net = Net(train_path, caffe.TRAIN)
    net.params["ip"][0].diff[...] = 3.0
    path = str(tmp_path / "d.h5")
    net.save_hdf5(path, write_diff=True)
    with h5py.File(path, "r") as f:
        assert np.all(f["diff"]["ip"]["0"][()] == 3.0)
    bad = str(tmp_path / "bad.h5")
    with h5py.File(bad, "w") as f:
        f.create_dataset("data/ip/0", data=np.zeros((2, 2), np.float32))
    with pytest.raises(WeightsError, match="'ip' param 0: shape mismatch"):
        net.load_hdf5(bad)
    with h5py.File(bad, "w") as f:
        f.create_group("weights")
    with pytest.raises(WeightsError, match="no 'data' group"):
        net.load_hdf5(bad)


def test_hdf5_shared_params_stored_once(tmp_path):
    pytest.importorskip("h5py")
    text = """
    layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
    layer { name: "a" type: "InnerProduct" bottom: "data" top: "a" param { name: "w" } param { name: "b" }
            inner_product_param { num_output: 3 weight_filler { type: "gaussian" } } }
    layer { name: "b" type: "InnerProduct" bottom: "a" top: "b" param { name: "w" } param { name: "b" }
            inner_product_param { num_output: 3 } }
    """
    p = tmp_path / "shared.prototxt"
    p.write_text(text)
    net = Net(str(p), caffe.TEST)
    path = str(tmp_path / "s.h5")
    net.save_hdf5(path)
    import h5py

    with h5py.File(path, "r") as f:
        assert set(f["data"]["a"]) == {"0", "1"} and len(f["data"]["b"]) == 0
    other = Net(str(p), caffe.TEST)
    other.load_hdf5(path)
    np.testing.assert_array_equal(other.params["b"][0].data, net.params["a"][0].data)


def test_hdf5_missing_h5py_message(train_path, tmp_path, monkeypatch):
    net = Net(train_path, caffe.TEST)
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(ImportError, match="pip install h5py"):
        net.save_hdf5(str(tmp_path / "x.h5"))


# -- Classifier / Detector --------------------------------------------------------------------
@pytest.fixture
def deploy_weights(deploy_path, tmp_path):
    caffe.set_random_seed(10)
    net = Net(deploy_path, caffe.TEST)
    path = str(tmp_path / "deploy.caffemodel")
    net.save(path)
    return path, [p.data.astype(np.float64).copy() for p in net.params["ip"]]


def _manual_scores(crop_hwk, w, b, mean, raw_scale, swap):
    x = crop_hwk.transpose(2, 0, 1)[list(swap)] * raw_scale - mean[:, None, None]
    return _softmax(x.reshape(-1) @ w.T + b)


def test_classifier_center_and_oversample(deploy_path, deploy_weights):
    weights, (w, b) = deploy_weights
    mean = np.array([0.1, 0.2, 0.3])
    clf = Classifier(deploy_path, weights, image_dims=(6, 6), mean=mean, raw_scale=2.0, channel_swap=(2, 1, 0))
    rng = np.random.default_rng(11)
    images = [rng.random((9, 7, 3)).astype(np.float32) for _ in range(4)]
    center = clf.predict(images, oversample=False)
    assert center.shape == (4, 5)
    full = clf.predict(images)
    assert full.shape == (4, 5)
    for n, im in enumerate(images):
        resized = cio.resize_image(im, (6, 6))
        ref = _manual_scores(resized[1:5, 1:5], w, b, mean, 2.0, (2, 1, 0))
        np.testing.assert_allclose(center[n], ref, rtol=1e-4, atol=1e-6)
        crops = []
        for i, j in ((0, 0), (0, 2), (2, 0), (2, 2), (1, 1)):
            crops.append(resized[i : i + 4, j : j + 4])
        crops += [c[:, ::-1] for c in crops]
        ref10 = np.mean([_manual_scores(c, w, b, mean, 2.0, (2, 1, 0)) for c in crops], axis=0)
        np.testing.assert_allclose(full[n], ref10, rtol=1e-4, atol=1e-6)


def test_detector_windows_and_context(deploy_path, deploy_weights, tmp_path):
    Image = pytest.importorskip("PIL.Image")
    weights, (w, b) = deploy_weights
    rgb = np.random.default_rng(12).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    fname = str(tmp_path / "img.png")
    Image.fromarray(rgb).save(fname)
    det = Detector(deploy_path, weights, raw_scale=1.0)
    windows = [(0, 0, 4, 4), (2, 1, 8, 7), (1, 1, 3, 6)]
    dets = det.detect_windows([(fname, windows)])
    assert [tuple(d["window"]) for d in dets] == windows
    assert all(d["filename"] == fname for d in dets)
    img = rgb / 255.0
    for d, (y0, x0, y1, x1) in zip(dets, windows):
        crop = cio.resize_image(img[y0:y1, x0:x1], (4, 4))
        ref = _manual_scores(crop, w, b, np.zeros(3), 1.0, (0, 1, 2))
        np.testing.assert_allclose(d["prediction"], ref, rtol=1e-4, atol=1e-6)
    ctx = Detector(deploy_path, weights, context_pad=1)
    out = ctx.crop(img.astype(np.float32), np.array([0, 0, 3, 3]))
    assert out.shape == (4, 4, 3)
    # scale 2 around the window -> box (-2,-2,6,6); one padded row/column of the (zero) mean
    assert np.all(out[0] == 0) and np.all(out[:, 0] == 0)
    np.testing.assert_allclose(out[1:, 1:], cio.resize_image(img[0:6, 0:6], (3, 3)), rtol=1e-5)


# -- Timer / logging --------------------------------------------------------------------------
def test_timer():
    t = Timer()
    assert t.ms == 0.0 and not t.has_run_at_least_once
    t.start()
    assert t.running
    time.sleep(0.02)
    t.stop()
    assert not t.running
    assert 15 <= t.ms < 2000
    assert t.seconds() == pytest.approx(t.milliseconds() / 1000)
    first = t.ms
    t.start()
    t.stop()
    assert t.ms < first


def test_logging(capsys):
    init_log(0)
    log("hello from pycaffe")
    err = capsys.readouterr().err
    assert "hello from pycaffe" in err and err.startswith("I")
    init_log(1, True)
    log("hidden info")
    assert "hidden info" not in capsys.readouterr().out
    with pytest.raises(ValueError, match="level"):
        init_log(7)


# -- a BVLC pycaffe script, unchanged -----------------------------------------------------------
def test_bvlc_style_script(deploy_path, deploy_weights, tmp_path):
    missing = [n for n in ("io", "Classifier", "Timer", "NetSpec", "layers", "params") if not hasattr(caffe, n)]
    if missing:
        pytest.skip(f"pycaffe_lite/__init__.py does not export {missing} yet")
    Image = pytest.importorskip("PIL.Image")
    weights, (w, b) = deploy_weights
    img_path = str(tmp_path / "cat.png")
    Image.fromarray(np.random.default_rng(13).integers(0, 256, (4, 4, 3), dtype=np.uint8)).save(img_path)
    # --- the script ---
    caffe.set_mode_cpu()
    net = caffe.Net(deploy_path, weights, caffe.TEST)
    transformer = caffe.io.Transformer({"data": net.blobs["data"].data.shape})
    transformer.set_transpose("data", (2, 0, 1))
    transformer.set_raw_scale("data", 255)
    transformer.set_channel_swap("data", (2, 1, 0))
    net.blobs["data"].reshape(1, 3, 4, 4)
    net.reshape()
    image = caffe.io.load_image(img_path)
    net.blobs["data"].data[...] = transformer.preprocess("data", image)
    out = net.forward()
    prob = out["prob"][0]
    # --- check ---
    ref = _manual_scores(image.astype(np.float64), w, b, np.zeros(3), 255.0, (2, 1, 0))
    np.testing.assert_allclose(prob, ref, rtol=1e-4, atol=1e-6)
    assert prob.argmax() == ref.argmax()
