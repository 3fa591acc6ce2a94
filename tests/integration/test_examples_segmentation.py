"""examples/segmentation: the net_spec DeepLab-style net (BN, dilated convolutions, Interp) builds,
its label map is the argmax of the upsampled scores at the input size, and the script writes a
palette PNG of the picture's size."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe

_spec = importlib.util.spec_from_file_location(
    "segmentation_segment", Path(__file__).resolve().parents[2] / "examples" / "segmentation" / "segment.py")
segment = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(segment)


def test_net_shapes_and_labels(tmp_path):
    path = tmp_path / "deploy.prototxt"
    assert segment.main(["--prototxt", str(path), "--classes", "5", "--size", "64"]) == 0
    text = path.read_text()
    assert 'type: "Interp"' in text and 'type: "BN"' in text and "frozen: true" in text
    caffe.set_random_seed(2)
    net = caffe.Net(str(path), caffe.TEST)
    assert net.blobs["score"].shape == (1, 5, 9, 9)  # 64 -> 32 (conv) -> 17 (pool, rounded up) -> 9
    rng = np.random.default_rng(0)
    out = net.forward(data=rng.standard_normal((1, 3, 64, 64)).astype(np.float32))
    assert net.blobs["score_interp"].shape == (1, 5, 64, 64)
    # Aligned corners: the four corners of the upsampled scores are the corners of the scores.
    s, u = net.blobs["score"].data[0], net.blobs["score_interp"].data[0]
    for a, b in ((0, 0), (0, -1), (-1, 0), (-1, -1)):
        np.testing.assert_allclose(u[:, a, b], s[:, a, b], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["label"][0, 0], net.blobs["prob"].data[0].argmax(axis=0))
    # Every upsampled score is the aligned-corner bilinear blend of the four scores around it.
    n_in, n_out = s.shape[1], u.shape[1]
    pos = np.arange(n_out) * (n_in - 1) / (n_out - 1)
    lo = np.minimum(pos.astype(int), n_in - 2)
    f = pos - lo
    rows = s[:, lo] * (1 - f)[None, :, None] + s[:, lo + 1] * f[None, :, None]
    ref = rows[:, :, lo] * (1 - f)[None, None, :] + rows[:, :, lo + 1] * f[None, None, :]
    np.testing.assert_allclose(u, ref, rtol=1e-4, atol=1e-5)


def test_script_writes_label_png(tmp_path, capsys):
    out = tmp_path / "labels.png"
    assert segment.main(["--out", str(out), "--classes", "6", "--size", "96"]) == 0
    from PIL import Image

    img = Image.open(out)
    assert img.mode == "P" and img.size == (240, 180)
    labels = np.asarray(img)
    assert labels.max() < 6
    assert "wrote" in capsys.readouterr().out


def test_segnet_style_net(tmp_path):
    path = tmp_path / "segnet.prototxt"
    assert segment.main(["--prototxt", str(path), "--arch", "segnet", "--classes", "4", "--size", "36"]) == 0
    text = path.read_text()
    assert 'type: "Upsample"' in text and "bn_mode: INFERENCE" in text and "upsample_h: 9" in text
    caffe.set_random_seed(3)
    net = caffe.Net(str(path), caffe.TEST)
    x = np.random.default_rng(1).standard_normal((1, 3, 36, 36)).astype(np.float32)
    out = net.forward(data=x)
    assert out["label"].shape == (1, 1, 36, 36)
    # The deepest unpooling puts every pooled value back where the pooling found it (9 x 9 -> 5 x 5).
    pooled, mask = net.blobs["pool3"].data, net.blobs["pool3_mask"].data
    up = net.blobs["upsample3"].data
    assert up.shape[2:] == (9, 9)
    expected = np.zeros_like(up)
    for c, i, j in np.ndindex(pooled.shape[1:]):
        k = int(mask[0, c, i, j])
        expected[0, c, k // 9, k % 9] = pooled[0, c, i, j]
    np.testing.assert_array_equal(up, expected)
    bn = net.layers[list(net.layer_dict).index("conv1_bn")]
    assert bn.segnet and [b.shape for b in bn.blobs] == [(1, 16, 1, 1)] * 2
    np.testing.assert_allclose(bn.blobs[1].data, 0.001)


def test_segnet_script_runs(tmp_path):
    out = tmp_path / "s.png"
    assert segment.main(["--arch", "segnet", "--out", str(out), "--size", "64"]) == 0
    assert out.stat().st_size > 100


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["deeplab", "segnet"])
def test_script_on_gpu(tmp_path, arch):
    try:
        assert segment.main(["--arch", arch, "--out", str(tmp_path / "g.png"), "--size", "64", "--gpu", "0"]) == 0
    finally:
        caffe.set_mode_cpu()
