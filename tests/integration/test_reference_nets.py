"""Reference networks build and run forward and backward: BVLC's own LeNet deploy file (unchanged),
CIFAR-10 quick (deploy and train/test with LMDB data and a mean file); the whole LeNet agrees
between CPU and GPU."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.data.db import LMDBWriter
from pycaffe_lite.schema import caffe_pb2

REPO = Path(__file__).resolve().parents[2]
CIFAR = REPO / "examples" / "cifar10"


def _forward_backward(net: caffe.Net, rng) -> None:
    for name in net.inputs:
        net.blobs[name].data[...] = rng.standard_normal(net.blobs[name].shape)
    out = net.forward()
    last = net.outputs[0]
    assert np.all(np.isfinite(out[last]))
    diffs = net.backward(**{last: rng.standard_normal(net.blobs[last].shape)})
    for name in net.inputs:
        assert np.any(diffs[name] != 0)
    for name, params in net.params.items():
        assert np.any(params[0].diff != 0), name


def _force_backward(path: Path, tmp_path: Path) -> Path:
    text = path.read_text()
    out = tmp_path / path.name
    out.write_text("force_backward: true\n" + text)
    return out


def test_bvlc_lenet_deploy_forward_backward(caffe_fixtures, tmp_path):
    net = caffe.Net(str(_force_backward(caffe_fixtures / "lenet.prototxt", tmp_path)), caffe.TEST,
                    weights=str(caffe_fixtures / "lenet_iter_10000.caffemodel"))
    assert net.blobs["prob"].shape == (64, 10)
    _forward_backward(net, np.random.default_rng(0))
    np.testing.assert_allclose(net.blobs["prob"].data.sum(axis=1), 1.0, rtol=1e-5)


def test_cifar10_quick_deploy_forward_backward(tmp_path):
    net = caffe.Net(str(_force_backward(CIFAR / "cifar10_quick.prototxt", tmp_path)), caffe.TEST)
    assert [b.shape for b in net.params["conv3"]] == [(64, 32, 5, 5), (64,)]
    assert net.params["ip1"][0].shape == (64, 1024)  # 64 x 4 x 4 after three ceil-rounded pools
    assert net.blobs["pool1"].shape == (1, 32, 16, 16)  # Caffe's ceil rounding
    assert net.blobs["pool3"].shape == (1, 64, 4, 4)
    rng = np.random.default_rng(1)
    for params in net.params.values():  # the deploy file has no fillers: weights come from a model
        for p in params:
            p.data[...] = rng.standard_normal(p.shape) * 0.1
    _forward_backward(net, rng)


def _cifar_lmdb(path: Path, n: int, rng) -> None:
    with LMDBWriter(path) as w:
        for i in range(n):
            d = caffe_pb2.Datum(channels=3, height=32, width=32, label=int(rng.integers(10)))
            d.data = rng.integers(0, 256, (3, 32, 32), dtype=np.uint8).tobytes()
            w.put(b"%05d" % i, d.SerializeToString())


@pytest.mark.slow
def test_cifar10_quick_train_test_with_lmdb_and_mean(tmp_path):
    rng = np.random.default_rng(2)
    root = tmp_path / "examples" / "cifar10"
    root.mkdir(parents=True)
    _cifar_lmdb(root / "cifar10_train_lmdb", 120, rng)
    _cifar_lmdb(root / "cifar10_test_lmdb", 120, rng)
    mean = caffe.io.array_to_blobproto(np.full((1, 3, 32, 32), 120.0))
    (root / "mean.binaryproto").write_bytes(mean.SerializeToString())
    shutil.copy(CIFAR / "cifar10_quick_train_test.prototxt", root)
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the file's relative sources, unchanged
    try:
        for phase in (caffe.TRAIN, caffe.TEST):
            net = caffe.Net("examples/cifar10/cifar10_quick_train_test.prototxt", phase)
            loss = net.forward_backward()
            assert np.isfinite(loss) and loss > 0
            assert net.blobs["data"].shape == (100, 3, 32, 32)
            assert abs(float(net.blobs["data"].data.mean())) < 10  # the mean file was subtracted
            assert np.any(net.params["conv1"][0].diff != 0)
            assert ("accuracy" in net.blobs) == (phase == caffe.TEST)
    finally:
        os.chdir(cwd)


@pytest.mark.gpu
def test_lenet_whole_net_cpu_gpu_agree(caffe_fixtures, tmp_path):
    """LeNet with BVLC's weights: forward output and every diff agree between the devices.

    In float64, so that max-pooling windows whose two largest values differ only by float32
    rounding cannot pick different winners on the two devices (that routes gradients elsewhere).
    """
    path = str(_force_backward(caffe_fixtures / "lenet.prototxt", tmp_path))
    weights = str(caffe_fixtures / "lenet_iter_10000.caffemodel")
    rng = np.random.default_rng(3)
    x = rng.random((64, 1, 28, 28))
    top_diff = rng.standard_normal((64, 10))
    results = []
    for gpu in (False, True):
        caffe.set_mode_gpu() if gpu else caffe.set_mode_cpu()
        try:
            net = caffe.Net(path, caffe.TEST, weights=weights, dtype=np.float64)
            for _ in range(3):  # the third call replays CUDA graphs on the GPU
                net.clear_param_diffs()
                out = net.forward(data=x)["prob"].copy()
                data_diff = net.backward(prob=top_diff)["data"].copy()
            results.append((out, data_diff, {k: [b.diff.copy() for b in v] for k, v in net.params.items()}))
        finally:
            caffe.set_mode_cpu()
    (cpu_out, cpu_dx, cpu_p), (gpu_out, gpu_dx, gpu_p) = results
    np.testing.assert_allclose(gpu_out, cpu_out, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(gpu_dx, cpu_dx, rtol=1e-9, atol=1e-12)
    for name in cpu_p:
        for a, b in zip(cpu_p[name], gpu_p[name]):
            np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12 * np.abs(a).max())
