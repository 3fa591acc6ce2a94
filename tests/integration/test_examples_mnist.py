"""examples/mnist end to end: BVLC's trained LeNet classifies MNIST as in Caffe, weights round-trip
bit-identically, the classify command reads image files, and train_lenet.py trains through the
LMDB path to >= 95 % test accuracy on the CPU."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.commands.digits import classify_digits
from pycaffe_lite.data import mnist
from pycaffe_lite.errors import DataError
from pycaffe_lite.proto import protoio
from pycaffe_lite.schema import caffe_pb2

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist"
DEPLOY = EXAMPLE / "lenet.prototxt"


@pytest.fixture(scope="module")
def test_set(mnist_dir):
    return mnist.load(*mnist.find_files(mnist_dir, "test"))


@pytest.fixture(scope="module")
def bvlc_net(caffe_fixtures):
    caffe.set_mode_cpu()
    return caffe.Net(str(DEPLOY), caffe.TEST, weights=str(caffe_fixtures / "lenet_iter_10000.caffemodel"))


def forward_all(net, images: np.ndarray, batch: int = 500) -> np.ndarray:
    """Predicted classes, feeding ``images`` (N, 28, 28) uint8 scaled by 1/256 through the input."""
    preds = []
    for start in range(0, len(images), batch):
        x = images[start : start + batch, None].astype(np.float32) * np.float32(0.00390625)
        net.blobs["data"].reshape(x.shape)
        net.reshape()
        preds.append(net.forward(data=x)["prob"].argmax(axis=1))
    return np.concatenate(preds)


def test_example_files_follow_caffes_recipe():
    sp = protoio.read_text(EXAMPLE / "lenet_solver.prototxt", caffe_pb2.SolverParameter())
    assert (sp.net, list(sp.test_iter), sp.test_interval, sp.max_iter, sp.snapshot) == (
        "examples/mnist/lenet_train_test.prototxt", [100], 500, 10000, 5000)
    assert (sp.lr_policy, sp.solver_mode, sp.snapshot_prefix) == ("inv", caffe_pb2.SolverParameter.GPU,
                                                                 "examples/mnist/lenet")
    np.testing.assert_allclose([sp.base_lr, sp.momentum, sp.weight_decay, sp.gamma, sp.power],
                               [0.01, 0.9, 0.0005, 0.0001, 0.75], rtol=1e-6)
    net = protoio.read_text(EXAMPLE / "lenet_train_test.prototxt", caffe_pb2.NetParameter())
    data = [lp for lp in net.layer if lp.type == "Data"]
    assert [(d.data_param.source, d.data_param.batch_size, d.include[0].phase) for d in data] == [
        ("examples/mnist/mnist_train_lmdb", 64, caffe.TRAIN), ("examples/mnist/mnist_test_lmdb", 100, caffe.TEST)]
    assert all(d.transform_param.scale == np.float32(0.00390625) for d in data)
    assert [lp.type for lp in net.layer][2:] == ["Convolution", "Pooling", "Convolution", "Pooling", "InnerProduct",
                                                 "ReLU", "InnerProduct", "Accuracy", "SoftmaxWithLoss"]


def test_bvlc_lenet_classifies_first_1000(bvlc_net, test_set):
    images, labels = test_set
    preds = forward_all(bvlc_net, images[:1000])
    assert (preds == labels[:1000]).mean() >= 0.985
    # The same through classify_digits (arrays in, default MNIST scale, no inversion needed).
    results = classify_digits(bvlc_net, images=list(images[:200]))
    np.testing.assert_array_equal([r.label for r in results], preds[:200])
    probs = np.stack([r.probs for r in results])
    np.testing.assert_allclose(probs.sum(axis=1), 1, rtol=1e-5)


@pytest.mark.slow
def test_train_test_net_through_lmdb_matches_deploy(bvlc_net, caffe_fixtures, test_set, tmp_path):
    """lenet_train_test.prototxt (TEST phase: Data layer -> ... -> Accuracy) on an LMDB of the first
    1000 test images gives the accuracy of the deploy net on the same images."""
    images, labels = test_set
    mnist.write_lmdb(images[:1000], labels[:1000], tmp_path / "test_lmdb")
    param = protoio.read_text(EXAMPLE / "lenet_train_test.prototxt", caffe_pb2.NetParameter())
    for lp in param.layer:
        if lp.type == "Data":
            lp.data_param.source = str(tmp_path / "test_lmdb")
    net = caffe.Net(param, caffe.TEST, weights=str(caffe_fixtures / "lenet_iter_10000.caffemodel"))
    accuracy = np.mean([float(net.forward()["accuracy"]) for _ in range(10)])
    expected = (forward_all(bvlc_net, images[:1000]) == labels[:1000]).mean()
    assert accuracy == pytest.approx(expected, abs=1e-6) and accuracy >= 0.985
    net.layers[0].close()


@pytest.mark.slow
def test_bvlc_lenet_full_test_set_99_14(bvlc_net, test_set):
    images, labels = test_set
    assert int((forward_all(bvlc_net, images) == labels).sum()) == 9914  # 99.14 %, as BVLC Caffe


def test_save_loads_bit_identically(bvlc_net, caffe_fixtures, tmp_path):
    out = tmp_path / "lenet_copy.caffemodel"
    bvlc_net.save(str(out))
    again = caffe.Net(str(DEPLOY), caffe.TEST, weights=str(out))
    original = protoio.read_binary(caffe_fixtures / "lenet_iter_10000.caffemodel", caffe_pb2.NetParameter())
    by_name = {lp.name: lp for lp in original.layer}
    compared = 0
    for name, blobs in again.params.items():
        for i, blob in enumerate(blobs):
            ref = np.asarray(by_name[name].blobs[i].data, dtype=np.float32).reshape(blob.shape)
            assert blob.data.tobytes() == ref.tobytes(), f"{name} param {i} changed"
            assert blob.data.tobytes() == bvlc_net.params[name][i].data.tobytes()
            compared += 1
    assert compared == 8


def test_classify_command_on_image_files(bvlc_net, caffe_fixtures, test_set, tmp_path, capsys):
    Image = pytest.importorskip("PIL.Image")
    from pycaffe_lite.commands import classify

    images, labels = test_set
    files = []
    for i in range(4):
        p = tmp_path / f"digit{i}.png"
        Image.fromarray(images[i]).save(p)
        files.append(p)
    big_inverted = tmp_path / "big_inverted.jpg"  # dark on light, 3x the size, JPEG, RGB
    Image.fromarray(255 - images[4]).resize((84, 84), Image.Resampling.BICUBIC).convert("RGB").save(big_inverted,
                                                                                                     quality=95)
    files.append(big_inverted)
    parser = argparse.ArgumentParser()
    classify.add_arguments(parser)
    args = parser.parse_args(["--model", str(DEPLOY), "--weights", str(caffe_fixtures / "lenet_iter_10000.caffemodel"),
                              *map(str, files)])
    assert classify.run(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5
    got = [int(re.search(r": (\d) \(p=", line).group(1)) for line in lines]
    assert got == list(labels[:5])
    assert all(str(f) in line for f, line in zip(files, lines))
    # Forcing no inversion on the dark-on-light image changes the input (and so the probabilities).
    normal = classify_digits(bvlc_net, images=[big_inverted], invert="auto")[0]
    raw = classify_digits(bvlc_net, images=[big_inverted], invert=False)[0]
    assert not np.allclose(normal.probs, raw.probs)


def test_shipped_mnist_is_checked_and_full():
    d, where = mnist.locate(None, env={})
    assert d == mnist.SHIPPED_DIR and "SHA-256 verified" in where
    assert sorted(p.name for p in d.glob("*.gz")) == sorted(mnist.SHA256)
    images, labels = mnist.load_split(d, "test")
    assert images.shape == (10000, 28, 28) and np.bincount(labels).min() > 800


def test_mnist_locate_rejects_wrong_paths_and_altered_files(tmp_path):
    with pytest.raises(DataError, match=r"\$MNIST_DIR .*nowhere: no such folder"):
        mnist.locate(None, env={"MNIST_DIR": str(tmp_path / "nowhere")})
    with pytest.raises(DataError, match=r"--data .*not all there"):
        mnist.locate(str(tmp_path), env={})
    # --data wins over $MNIST_DIR, which wins over the shipped copy
    assert mnist.locate(str(mnist.SHIPPED_DIR), env={"MNIST_DIR": "/nope"})[1].startswith("--data")
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in mnist.SHA256:
        (bad / name).write_bytes((mnist.SHIPPED_DIR / name).read_bytes())
    (bad / "t10k-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b" + b"0" * 20)
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte.gz: SHA-256 .* does not match"):
        mnist.verify_sha256(bad)


def test_train_lenet_wrong_mnist_dir_is_an_error(tmp_path):
    proc = subprocess.run([sys.executable, str(EXAMPLE / "train_lenet.py"), "--iters", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "MNIST_DIR": str(tmp_path / "missing")})
    assert proc.returncode == 1 and "$MNIST_DIR" in proc.stderr and "missing" in proc.stderr
    assert "Traceback" not in proc.stderr


def _train_lenet_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_lenet_under_test", EXAMPLE / "train_lenet.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_train_lenet_out_and_gpu_errors_are_one_line(tmp_path, capsys, monkeypatch):
    """--out under a file (or unwritable) and --gpu without a GPU/PyCUDA: one error line, exit 1."""
    from pycaffe_lite import common
    from pycaffe_lite.errors import GPUUnavailableError

    tl = _train_lenet_module()
    (tmp_path / "file").write_text("x")
    assert tl.main(["--iters", "1", "--out", str(tmp_path / "file" / "out"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --out ") and "cannot create the folder" in err and "Traceback" not in err

    def no_gpu(*args):
        raise GPUUnavailableError("GPU mode needs PyCUDA (test stand-in)")

    monkeypatch.setattr(common, "set_mode_gpu", no_gpu)
    monkeypatch.setattr(caffe, "set_mode_gpu", no_gpu)
    monkeypatch.setattr(common, "set_device", lambda d: None)
    monkeypatch.setattr(caffe, "set_device", lambda d: None)
    assert tl.main(["--gpu", "0", "--iters", "1", "--out", str(tmp_path / "o"), "--no-progress"]) == 1
    assert capsys.readouterr().err == "error: GPU mode needs PyCUDA (test stand-in)\n"


@pytest.mark.slow
def test_plot_title_fits_the_figure(tmp_path):
    pytest.importorskip("matplotlib")
    tl = _train_lenet_module()
    title = ("LeNet, 10,000 iterations on 60,000 MNIST training images (GPU 0): accuracy 0.9913 on "
             "10,000 test images")
    losses = list(np.linspace(2.3, 0.01, 300))
    left, right, width = tl.plot_curves(tmp_path / "c.png", losses, [(0, 0.1), (300, 0.99)], title)
    assert 0 <= left < right <= width
    assert (tmp_path / "c.png").stat().st_size > 1000


@pytest.mark.slow  # ~12 s: trains LeNet
def test_train_lenet_script_reaches_95_percent(mnist_dir, tmp_path):
    """The main job, small: 400 CPU iterations on 20,000 training images through the LMDB path."""
    out = tmp_path / "run"
    cmd = [sys.executable, str(EXAMPLE / "train_lenet.py"), "--data", str(mnist_dir), "--iters", "400",
           "--test-interval", "200", "--train-limit", "20000", "--test-limit", "1000", "--seed", "1701",
           "--out", str(out), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Data: MNIST from --data" in proc.stdout and "using 20,000 training / 1,000 test" in proc.stdout
    summary = proc.stdout.strip().splitlines()[-1]
    m = re.search(r"LeNet: 400 iterations in [\d.]+ s \([\d.]+ it/s\) on CPU; final test accuracy ([\d.]+) on 1000",
                  summary)
    assert m, summary
    accuracy = float(m.group(1))
    assert accuracy >= 0.95
    png = out / "lenet_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "mnist_train_lmdb" / "data.mdb").is_file()
    # The snapshot classifies the same 1000 test images at the accuracy the test net reported.
    net = caffe.Net(str(DEPLOY), caffe.TEST, weights=str(out / "lenet_main_iter_400.caffemodel"))
    images, labels = mnist.load(*mnist.find_files(mnist_dir, "test"))
    assert abs((forward_all(net, images[:1000]) == labels[:1000]).mean() - accuracy) < 1.5e-3
