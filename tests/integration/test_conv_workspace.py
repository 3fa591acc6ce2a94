"""CPU convolution memory: a large batch is convolved in chunks of images, so a CaffeNet-like deploy
file written for batch 999 builds where BVLC's would (BVLC im2cols one image at a time); the checks
count the chunk's buffers (and refuse when even they cannot fit); chunked results equal whole-batch
ones; N-D Deconvolution counts its own columns (top channels x kernel x bottom volume)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import memcheck
from pycaffe_lite.conv import cpu as cpu_conv
from pycaffe_lite.memcheck import OutOfMemoryError
from pycaffe_lite.proto import caffe_pb2
from pycaffe_lite.proto.protoio import parse_text

GiB = 1 << 30
MiB = 1 << 20


def caffenet_like(batch: int, size: int, fc: int) -> caffe_pb2.NetParameter:
    """CaffeNet's layer sequence (grouped convolutions, LRN, overlapping pooling), written here."""
    conv = ('layer {{ name: "{n}" type: "Convolution" bottom: "{b}" top: "{n}" convolution_param {{ num_output: {m} '
            'kernel_size: {k} stride: {s} pad: {p} group: {g} weight_filler {{ type: "gaussian" std: 0.01 }} '
            'bias_filler {{ type: "constant" value: 0.1 }} }} }}\n'
            'layer {{ name: "relu_{n}" type: "ReLU" bottom: "{n}" top: "{n}" }}\n')
    pool = ('layer {{ name: "{n}" type: "Pooling" bottom: "{b}" top: "{n}" pooling_param {{ pool: MAX kernel_size: 3 '
            'stride: 2 }} }}\n')
    lrn = 'layer {{ name: "{n}" type: "LRN" bottom: "{b}" top: "{n}" lrn_param {{ local_size: 5 alpha: 0.0001 beta: 0.75 }} }}\n'
    ip = ('layer {{ name: "{n}" type: "InnerProduct" bottom: "{b}" top: "{n}" inner_product_param {{ num_output: {m} '
          'weight_filler {{ type: "gaussian" std: 0.005 }} }} }}\n')
    text = f'name: "caffenet_like"\ninput: "data"\ninput_shape {{ dim: {batch} dim: 3 dim: {size} dim: {size} }}\n'
    text += conv.format(n="conv1", b="data", m=96, k=11, s=4, p=0, g=1)
    text += pool.format(n="pool1", b="conv1") + lrn.format(n="norm1", b="pool1")
    text += conv.format(n="conv2", b="norm1", m=256, k=5, s=1, p=2, g=2)
    text += pool.format(n="pool2", b="conv2") + lrn.format(n="norm2", b="pool2")
    text += conv.format(n="conv3", b="norm2", m=384, k=3, s=1, p=1, g=1)
    text += conv.format(n="conv4", b="conv3", m=384, k=3, s=1, p=1, g=2)
    text += conv.format(n="conv5", b="conv4", m=256, k=3, s=1, p=1, g=2)
    text += pool.format(n="pool5", b="conv5")
    text += ip.format(n="fc6", b="pool5", m=fc) + 'layer { name: "relu6" type: "ReLU" bottom: "fc6" top: "fc6" }\n'
    text += ip.format(n="fc7", b="fc6", m=fc) + ip.format(n="fc8", b="fc7", m=10)
    text += 'layer { name: "prob" type: "Softmax" bottom: "fc8" top: "prob" }\n'
    return parse_text(text, caffe_pb2.NetParameter())


def limit_host(monkeypatch, limit: int) -> None:
    monkeypatch.setattr(memcheck, "host_limit", lambda: limit)
    monkeypatch.setattr(memcheck, "host_limits", lambda: [(limit, "that the test allows")])
    monkeypatch.setattr(memcheck, "host_available", lambda: (limit, "still free under the test's limit"))


@pytest.mark.slow
def test_caffenet_at_batch_999_builds_where_bvlc_fits(monkeypatch):
    """4 GiB: BVLC's weights and lazily allocated blobs fit (its forward needs about 5 GiB, one image's
    columns at a time); whole-batch columns would not (conv1's alone are 4.1 GiB)."""
    caffe.set_mode_cpu()
    limit_host(monkeypatch, 4 * GiB)
    checked = []
    total = memcheck.check_total
    monkeypatch.setattr(memcheck, "check_total", lambda where, items, *a, **k: checked.append(items) or
                        total(where, items, *a, **k))
    net = caffe.Net(caffenet_like(999, 227, 4096), caffe.TEST)
    conv = [layer for layer in net.layers if layer.type == "Convolution"]
    assert len(conv) == 5
    # the Net's check counts the convolutions' CPU buffers with the blobs and params: the shared
    # scratch buffers at their largest, plus the largest temporaries
    workspace = [n for name, n in checked[-1] if name == "CPU convolution scratch"]
    assert workspace == [cpu_conv.held_bytes(layer.host_workspace for layer in conv)]
    assert max(layer.host_workspace_bytes for layer in conv) <= workspace[0] <= 2 * cpu_conv.WORKSPACE_BYTES
    whole_conv1 = 999 * 3 * 11 * 11 * 55 * 55 * 4
    assert whole_conv1 > 4 * GiB
    for layer in conv:  # each counts one chunk: within the budget (all these images are far below it)
        assert 0 < layer.host_workspace_bytes <= cpu_conv.WORKSPACE_BYTES
    # without chunks the same check refuses, naming the convolution's buffers
    monkeypatch.setattr(cpu_conv, "WORKSPACE_BYTES", 1 << 50)
    with pytest.raises(OutOfMemoryError, match=r"layer 'conv1'.*CPU convolution buffers.*more than the 4.0 GiB"):
        caffe.Net(caffenet_like(999, 227, 4096), caffe.TEST)


def test_chunked_forward_and_backward_equal_whole_batch(monkeypatch):
    caffe.set_mode_cpu()
    param = caffenet_like(5, 99, 64)
    param.force_backward = True
    nets, results = [], []
    for budget in (cpu_conv.WORKSPACE_BYTES, 1):  # whole batch; one image a chunk
        monkeypatch.setattr(cpu_conv, "WORKSPACE_BYTES", budget)
        caffe.set_random_seed(5)
        net = caffe.Net(param, caffe.TEST)
        if nets:
            for name in net.params:
                for mine, theirs in zip(net.params[name], nets[0].params[name]):
                    mine.data[...] = theirs.data
        net.blobs["data"].data[...] = np.random.default_rng(0).standard_normal(net.blobs["data"].shape)
        net.forward()
        net.blobs["prob"].diff[...] = np.random.default_rng(1).standard_normal(net.blobs["prob"].shape)
        net.backward()
        results.append({"conv5": net.blobs["conv5"].data.copy(), "prob": net.blobs["prob"].data.copy(),
                        "data diff": net.blobs["data"].diff.copy(),
                        "conv2 dW": net.params["conv2"][0].diff.copy()})
        nets.append(net)
    assert nets[1].layers[1].host_workspace_bytes < nets[0].layers[1].host_workspace_bytes  # chunks
    for key, want in results[0].items():
        assert np.abs(want).max() > 0, key
        np.testing.assert_allclose(results[1][key], want, rtol=2e-4, atol=1e-6 * np.abs(want).max(), err_msg=key)


def test_nd_deconvolution_counts_its_own_columns(monkeypatch):
    """A 3-D U-Net-like up-convolution: 64 -> 8 channels, 8^3 -> 16^3. Its CPU columns are the top's
    8 channels x 2^3 kernel x the bottom's 8^3 positions (Convolution's formula, bottom channels x
    top volume, gave 32x more)."""
    caffe.set_mode_cpu()
    text = ('input: "x" input_shape { dim: 2 dim: 64 dim: 8 dim: 8 dim: 8 }\n'
            'layer { name: "up" type: "Deconvolution" bottom: "x" top: "y" convolution_param { num_output: 8 '
            'kernel_size: 2 stride: 2 weight_filler { type: "gaussian" std: 0.1 } } }\n')
    param = parse_text(text, caffe_pb2.NetParameter())
    net = caffe.Net(param, caffe.TEST)
    up = net.layers[1]
    columns = 2 * 8 * 8 * 8 ** 3 * 4
    assert columns <= up.host_workspace_bytes <= 3 * columns + 2 * 8 * 16 ** 3 * 4
    limit_host(monkeypatch, 2 * 64 * 8 ** 3 * 4 + 2 * 8 * 16 ** 3 * 4 + up.host_workspace_bytes + MiB)
    net = caffe.Net(param, caffe.TEST)  # builds under a limit where 64 x 16^3 columns would not fit
    assert 2 * 64 * 8 * 16 ** 3 * 4 > memcheck.host_limit()
    x = np.random.default_rng(2).standard_normal((2, 64, 8, 8, 8))
    net.blobs["x"].data[...] = x
    net.forward()
    w = net.params["up"][0].data  # (64, 8, 2, 2, 2): stride 2, kernel 2 writes disjoint 2x2x2 blocks
    want = np.einsum("ncdhw,cmijk->nmdihjwk", x, w).reshape(2, 8, 16, 16, 16) + net.params["up"][1].data[
        None, :, None, None, None]
    np.testing.assert_allclose(net.blobs["y"].data, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_model_zoo_alexnet_at_batch_1000_builds_under_4_gib(monkeypatch, tmp_path):
    """The repository's AlexNet deploy file with its input batch set to 1000 (BVLC: about 0.2 GiB to
    build, 5 GiB to run one image's columns at a time) builds under a 4 GiB host limit."""
    zoo = Path(__file__).resolve().parents[2] / "examples" / "model_zoo" / "bvlc_alexnet_published_deploy.prototxt"
    text = zoo.read_text()
    assert "input_dim: 10\n" in text
    path = tmp_path / "alexnet_1000.prototxt"
    path.write_text(text.replace("input_dim: 10\n", "input_dim: 1000\n", 1))
    caffe.set_mode_cpu()
    limit_host(monkeypatch, 4 * GiB)
    net = caffe.Net(str(path), caffe.TEST)
    assert net.blobs["data"].shape == (1000, 3, 227, 227)
    assert max(getattr(layer, "host_workspace_bytes", 0) for layer in net.layers) <= cpu_conv.WORKSPACE_BYTES
