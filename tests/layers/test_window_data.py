"""WindowData (R-CNN's window file layer): window-file parsing, the fg/bg split and batch layout,
warped pixels against OpenCV on hand-computed geometry (plain warp, context padding clipped at
the border, square mode, mirroring), mean and scale, cached images, and errors naming the file."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import DataError, MissingDependencyError, NetError
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer

cv2 = pytest.importorskip("cv2")


@pytest.fixture
def images(tmp_path):
    rng = np.random.default_rng(0)
    paths = []
    for i, (h, w) in enumerate([(20, 24), (16, 16)]):
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        path = tmp_path / f"img{i}.png"
        cv2.imwrite(str(path), img)
        paths.append((path, img))
    return paths


def window_file(tmp_path, entries, name="windows.txt"):
    lines = []
    for i, (path, (h, w), windows) in enumerate(entries):
        lines += [f"# {i}", str(path), f"3 {h} {w}", str(len(windows))]
        lines += [" ".join(str(v) for v in win) for win in windows]
    f = tmp_path / name
    f.write_text("\n".join(lines) + "\n")
    return f


def layer_text(source, batch=4, crop=8, fg_fraction=0.5, extra="", transform=""):
    return (f'name: "win" type: "WindowData" transform_param {{ crop_size: {crop} {transform} }} '
            f'window_data_param {{ source: "{source}" batch_size: {batch} fg_fraction: {fg_fraction} {extra} }}')


def run(text, seed=3):
    caffe.set_random_seed(seed)
    layer = make_layer(text, np.float32)
    top = empty_blobs(2, np.float32)
    layer.setup([], top)
    layer.forward([], top)
    return layer, top


def chw(img):
    return img.transpose(2, 0, 1).astype(np.float64)


def test_split_and_warp(tmp_path, images):
    (p0, img0), (p1, _) = images
    src = window_file(tmp_path, [
        (p0, (20, 24), [(2, 0.9, 3, 2, 10, 13), (1, 0.4, 0, 0, 5, 5)]),  # fg (class 2), unused (0.4)
        (p1, (16, 16), [(5, 0.1, 1, 1, 8, 12)]),                          # bg: class forced to 0
    ])
    layer, top = run(layer_text(src, batch=4, fg_fraction=0.5, extra="fg_threshold: 0.5 bg_threshold: 0.3"))
    assert len(layer.fg) == 1 and len(layer.bg) == 1
    assert top[0].shape == (4, 3, 8, 8) and top[1].shape == (4,)
    np.testing.assert_array_equal(top[1].cpu_data(), [0, 0, 2, 2])  # background first, then foreground
    img1 = cv2.imread(str(p1), cv2.IMREAD_COLOR)
    bg = cv2.resize(img1[1:13, 1:9], (8, 8), interpolation=cv2.INTER_LINEAR)
    fg = cv2.resize(img0[2:14, 3:11], (8, 8), interpolation=cv2.INTER_LINEAR)
    for i, want in enumerate([bg, bg, fg, fg]):
        np.testing.assert_array_equal(top[0].cpu_data()[i], chw(want))


def test_context_pad_clipped_at_the_border(tmp_path, images):
    """crop 8, context_pad 2: window (0,0)-(7,7) grows to (-4,-4)-(12,12) (17 px, scale 8/17);
    the clipped 13 px warp to round(13*8/17) = 6 px after a pad of round(4*8/17) = 2 px."""
    (p0, img0), _ = images
    src = window_file(tmp_path, [(p0, (20, 24), [(1, 0.9, 0, 0, 7, 7), (0, 0.0, 0, 0, 3, 3)])])
    _, top = run(layer_text(src, batch=2, fg_fraction=0.5, extra="context_pad: 2"))
    item = top[0].cpu_data()[1]
    want = cv2.resize(img0[0:13, 0:13], (6, 6), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(item[:, 2:8, 2:8], chw(want))
    assert not item[:, :2, :].any() and not item[:, :, :2].any()


def test_square_mode(tmp_path, images):
    """crop_mode square, no context: a 4 wide x 8 high window at (6,4) becomes 8x8 around its
    centre (8, 8): x from round(8-4) = 4 to round(8+4) = 12 (9 px), y 4..12; warped to 8x8."""
    (p0, img0), _ = images
    src = window_file(tmp_path, [(p0, (20, 24), [(1, 0.9, 6, 4, 9, 11), (0, 0.0, 0, 0, 3, 3)])])
    _, top = run(layer_text(src, batch=2, extra='crop_mode: "square"'))
    want = cv2.resize(img0[4:13, 4:13], (8, 8), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(top[0].cpu_data()[1], chw(want))


def test_mirror_mean_and_scale(tmp_path, images):
    (p0, img0), _ = images
    src = window_file(tmp_path, [(p0, (20, 24), [(3, 0.9, 3, 2, 10, 13), (0, 0.0, 3, 2, 10, 13)])])
    text = layer_text(src, batch=16, fg_fraction=0.5, extra="scale: 0.5",
                      transform="mirror: true mean_value: 10 mean_value: 20 mean_value: 30")
    _, top = run(text)
    base = chw(cv2.resize(img0[2:14, 3:11], (8, 8), interpolation=cv2.INTER_LINEAR))
    mean = np.array([10.0, 20.0, 30.0])[:, None, None]
    plain, flipped = (base - mean) * 0.5, (base[:, :, ::-1] - mean) * 0.5
    seen = set()
    for item in top[0].cpu_data():
        if np.array_equal(item, plain):
            seen.add("plain")
        else:
            np.testing.assert_array_equal(item, flipped)
            seen.add("flipped")
    assert seen == {"plain", "flipped"}


def test_cache_images_and_mean_file(tmp_path, images):
    (p0, img0), _ = images
    mean = np.random.default_rng(1).uniform(0, 50, (1, 3, 10, 10))
    proto = caffe.io.array_to_blobproto(mean)
    (tmp_path / "mean.binaryproto").write_bytes(proto.SerializeToString())
    src = window_file(tmp_path, [(p0, (20, 24), [(1, 0.9, 3, 2, 10, 13), (0, 0.0, 3, 2, 10, 13)])])
    text = layer_text(src, batch=2, extra="cache_images: true",
                      transform=f'mean_file: "{tmp_path / "mean.binaryproto"}"')
    caffe.set_random_seed(3)
    layer = make_layer(text, np.float32)
    top = empty_blobs(2, np.float32)
    layer.setup([], top)
    p0.unlink()  # cached at set-up: the file is no longer read
    layer.forward([], top)
    base = chw(cv2.resize(img0[2:14, 3:11], (8, 8), interpolation=cv2.INTER_LINEAR))
    np.testing.assert_allclose(top[0].cpu_data()[0], base - mean[0, :, 1:9, 1:9], rtol=1e-5, atol=1e-4)  # offset (10-8)/2


def test_errors(tmp_path, images):
    (p0, _), _ = images
    with pytest.raises(DataError, match="cannot open window file"):
        run(layer_text(tmp_path / "missing.txt"))
    bad = tmp_path / "bad.txt"
    bad.write_text(f"# 0\n{p0}\n3 20 24\n1\n1 0.9 0 0\n")
    with pytest.raises(DataError, match="bad.txt ends early"):
        run(layer_text(bad))
    bad.write_text(f"# 0\n{p0}\n3 20 24\n1\n1 high 0 0 3 3\n")
    with pytest.raises(DataError, match="expected an overlap, got 'high'"):
        run(layer_text(bad))
    src = window_file(tmp_path, [(p0, (20, 24), [(0, 0.9, 0, 0, 3, 3)])])
    with pytest.raises(DataError, match="foreground classes must be positive"):
        run(layer_text(src))
    src = window_file(tmp_path, [(p0, (20, 24), [(1, 0.9, 0, 0, 3, 3)])])
    with pytest.raises(DataError, match="0 background"):
        run(layer_text(src))
    with pytest.raises(NetError, match="crop_size must be positive"):
        run(layer_text(src, crop=0))
    gray = window_file(tmp_path, [(p0, (20, 24), [(1, 0.9, 0, 0, 3, 3)])], name="gray.txt")
    gray.write_text(gray.read_text().replace("3 20 24", "1 20 24"))
    with pytest.raises(DataError, match="3 channels"):
        run(layer_text(gray))
    src = window_file(tmp_path, [(p0, (20, 24), [(1, 0.9, 0, 0, 30, 3), (0, 0.0, 0, 0, 30, 3)])], name="w.txt")
    with pytest.raises(DataError, match="does not fit"):
        run(layer_text(src))


def test_missing_opencv_names_the_extra(tmp_path, images, monkeypatch):
    (p0, _), _ = images
    src = window_file(tmp_path, [(p0, (20, 24), [(1, 0.9, 0, 0, 3, 3)])])
    monkeypatch.setitem(sys.modules, "cv2", None)
    with pytest.raises(MissingDependencyError, match=r"opencv-python-headless.*pycaffe-lite\[data\]"):
        run(layer_text(src))
