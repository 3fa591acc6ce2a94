"""ImageData layer: list parsing, BGR order, gray, resize, transform, cycling, shuffle, errors, net."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import DataError, NetError
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer

Image = pytest.importorskip("PIL.Image")

N, H, W = 5, 4, 6


@pytest.fixture
def images(tmp_path):
    """N RGB PNGs (H, W) under tmp_path/imgs, listed as 'imgs/i<k>.png <label>' in list.txt."""
    rng = np.random.default_rng(4)
    rgb = rng.integers(0, 256, size=(N, H, W, 3), dtype=np.uint8)
    (tmp_path / "imgs").mkdir()
    lines = []
    for k in range(N):
        Image.fromarray(rgb[k], "RGB").save(tmp_path / "imgs" / f"i{k}.png")
        lines.append(f"imgs/i{k}.png {20 + k}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    labels = 20 + np.arange(N)
    bgr = rgb[..., ::-1].transpose(0, 3, 1, 2)  # (N, 3, H, W)
    return tmp_path, bgr, labels


def image_layer(root, batch=2, params="", transform="", dtype=np.float64, phase=None):
    phase_text = f"phase: {phase}" if phase is not None else ""
    return make_layer(
        f'name: "img" type: "ImageData" top: "data" top: "label" {phase_text} '
        f'image_data_param {{ source: "{root / "list.txt"}" root_folder: "{root}/" batch_size: {batch} {params} }} '
        f"transform_param {{ {transform} }}",
        dtype,
    )


def bilinear_ref(img, oh, ow):
    """Naive OpenCV INTER_LINEAR on (C, H, W), before rounding to uint8."""
    c, h, w = img.shape
    out = np.empty((c, oh, ow))
    for y in range(oh):
        sy = min(max((y + 0.5) * h / oh - 0.5, 0.0), h - 1)
        y0 = int(np.floor(sy))
        y1 = min(y0 + 1, h - 1)
        fy = sy - y0
        for x in range(ow):
            sx = min(max((x + 0.5) * w / ow - 0.5, 0.0), w - 1)
            x0 = int(np.floor(sx))
            x1 = min(x0 + 1, w - 1)
            fx = sx - x0
            for ch in range(c):
                v = img.astype(float)[ch]
                out[ch, y, x] = ((1 - fy) * ((1 - fx) * v[y0, x0] + fx * v[y0, x1])
                                 + fy * ((1 - fx) * v[y1, x0] + fx * v[y1, x1]))
    return out


def test_batches_bgr_labels_and_cycling(images):
    root, bgr, labels = images
    layer = image_layer(root, batch=2)
    top = empty_blobs(2)
    layer.setup([], top)
    assert top[0].shape == (2, 3, H, W) and top[1].shape == (2,)
    for b in range(6):  # 12 items over 5 lines: wraps twice
        layer.forward([], top)
        idx = np.arange(2 * b, 2 * b + 2) % N
        np.testing.assert_array_equal(top[0].cpu_data(), bgr[idx])
        np.testing.assert_array_equal(top[1].cpu_data(), labels[idx])


def test_channel_order_is_bgr(tmp_path):
    Image.new("RGB", (2, 2), (255, 0, 10)).save(tmp_path / "red.png")
    (tmp_path / "list.txt").write_text("red.png 0\n")
    layer = image_layer(tmp_path, batch=1)
    top = empty_blobs(2)
    layer.setup([], top)
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].cpu_data()[0, :, 0, 0], [10, 0, 255])  # B, G, R


def test_gray_and_color_from_gray_file(tmp_path):
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    Image.fromarray(gray, "L").save(tmp_path / "my image.png")  # a space in the path
    (tmp_path / "list.txt").write_text("my image.png 7\n")
    layer = image_layer(tmp_path, batch=1, params="is_color: false")
    top = empty_blobs(2)
    layer.setup([], top)
    layer.forward([], top)
    assert top[0].shape == (1, 1, 3, 4)
    np.testing.assert_array_equal(top[0].cpu_data()[0, 0], gray)
    assert top[1].cpu_data()[0] == 7
    layer = image_layer(tmp_path, batch=1)  # is_color: a gray file gives 3 equal channels
    layer.setup([], top)
    layer.forward([], top)
    assert top[0].shape == (1, 3, 3, 4)
    for ch in range(3):
        np.testing.assert_array_equal(top[0].cpu_data()[0, ch], gray)


@pytest.mark.parametrize("oh,ow", [(8, 9), (2, 3), (4, 6), (3, 10)])
def test_resize_bilinear(images, oh, ow):
    root, bgr, _ = images
    layer = image_layer(root, batch=N, params=f"new_height: {oh} new_width: {ow}")
    top = empty_blobs(2)
    layer.setup([], top)
    assert top[0].shape == (N, 3, oh, ow)
    layer.forward([], top)
    for k in range(N):
        got = top[0].cpu_data()[k]
        np.testing.assert_array_equal(got, np.round(got))  # rounded to uint8 values, as Caffe's cv::Mat
        # nearest integer to the exact bilinear value (ties may go either way)
        assert np.abs(got - bilinear_ref(bgr[k], oh, ow)).max() <= 0.5 + 1e-9


def test_resize_needs_both_sides(images):
    root, _, _ = images
    with pytest.raises(NetError, match="new_height and new_width both set"):
        image_layer(root, params="new_height: 5").setup([], empty_blobs(2))


def test_transform_scale_mean_and_crop(images):
    root, bgr, labels = images
    layer = image_layer(root, batch=3, transform="scale: 0.5 mean_value: 10 mean_value: 20 mean_value: 30",
                        dtype=np.float32)
    top = empty_blobs(2, np.float32)
    layer.setup([], top)
    layer.forward([], top)
    mean = np.array([10, 20, 30], np.float32).reshape(3, 1, 1)
    np.testing.assert_allclose(top[0].cpu_data(), (bgr[:3].astype(np.float32) - mean) * 0.5, rtol=1e-6)
    layer = image_layer(root, batch=2, transform="crop_size: 2", phase="TEST")  # centre crop in TEST
    layer.setup([], top := empty_blobs(2))
    assert top[0].shape == (2, 3, 2, 2)
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].cpu_data(), bgr[:2, :, 1:3, 2:4])
    # deprecated image_data_param.scale is used when transform_param has none
    layer = image_layer(root, batch=1, params="scale: 0.25")
    layer.setup([], top := empty_blobs(2))
    layer.forward([], top)
    np.testing.assert_allclose(top[0].cpu_data()[0], bgr[0] * 0.25)


def served(root, seed, forwards=5, params="shuffle: true"):
    caffe.set_random_seed(seed)
    layer = image_layer(root, batch=3, params=params)
    top = empty_blobs(2)
    layer.setup([], top)
    labels, data = [], []
    for _ in range(forwards):
        layer.forward([], top)
        labels.append(top[1].cpu_data().copy())
        data.append(top[0].cpu_data().copy())
    return np.concatenate(labels), np.concatenate(data)


def test_shuffle_seeded_each_epoch_a_permutation(images):
    root, bgr, labels = images
    a, da = served(root, 3)
    b, _ = served(root, 3)
    np.testing.assert_array_equal(a, b)
    for e in range(3):  # 15 items = 3 epochs of 5
        np.testing.assert_array_equal(np.sort(a[5 * e : 5 * e + 5]), labels)
    np.testing.assert_array_equal(da, bgr[(a - 20).astype(int)])  # images stay with their labels
    orders = {tuple(served(root, s)[0]) for s in range(5)}
    assert len(orders) > 1
    epochs = {tuple(a[5 * e : 5 * e + 5]) for e in range(3)} | {tuple(served(root, 9)[0][:5])}
    assert len(epochs) > 1, "the order never changed between epochs"


def test_rand_skip(images):
    root, _, labels = images
    starts = set()
    for seed in range(12):
        got, _ = served(root, seed, forwards=2, params="rand_skip: 4")
        start = int(got[0]) - 20
        assert 0 <= start < 4
        np.testing.assert_array_equal(got, labels[(start + np.arange(6)) % N])
        starts.add(start)
    assert len(starts) > 1


def test_errors_name_file_and_line(images):
    root, _, _ = images
    (root / "list.txt").write_text("imgs/i0.png 1\n\nimgs/none.png 2\n")
    layer = image_layer(root, batch=2)
    top = empty_blobs(2)
    layer.setup([], top)
    with pytest.raises(DataError, match=r"layer 'img' \(ImageData\): image file .*imgs/none.png not found "
                                        r"\(.*list.txt line 3\)"):
        layer.forward([], top)
    (root / "bad.png").write_bytes(b"not a png")
    (root / "list.txt").write_text("bad.png 0\n")
    with pytest.raises(DataError, match=r"could not load image .*bad.png \(.*list.txt line 1\)"):
        image_layer(root).setup([], empty_blobs(2))
    (root / "list.txt").write_text("imgs/i0.png\n")
    with pytest.raises(DataError, match=r"list.txt line 1: expected '<path> <integer label>'"):
        image_layer(root).setup([], empty_blobs(2))
    (root / "list.txt").write_text("\n")
    with pytest.raises(DataError, match="list.txt is empty"):
        image_layer(root).setup([], empty_blobs(2))
    (root / "list.txt").unlink()
    with pytest.raises(DataError, match="cannot open source file .*list.txt"):
        image_layer(root).setup([], empty_blobs(2))
    Image.new("RGB", (3, 3)).save(root / "small.png")
    (root / "list.txt").write_text("imgs/i0.png 0\nsmall.png 1\n")
    layer = image_layer(root, batch=2)
    layer.setup([], top)
    with pytest.raises(DataError, match=r"small.png \(line 2\) has shape \(3, 3, 3\)"):
        layer.forward([], top)


def test_net_image_data_feeds_inner_product(images, mode):
    root, bgr, labels = images
    net = caffe.Net(
        parse_text(
            f"""name: "imgnet"
            layer {{ name: "img" type: "ImageData" top: "data" top: "label"
                    image_data_param {{ source: "{root / 'list.txt'}" root_folder: "{root}/" batch_size: 2 }}
                    transform_param {{ scale: 0.00390625 }} }}
            layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
                    inner_product_param {{ num_output: 3 weight_filler {{ type: "gaussian" std: 0.1 }}
                                          bias_filler {{ type: "constant" value: 0.5 }} }} }}""",
            caffe_pb2.NetParameter(),
        ),
        caffe.TEST,
    )
    w, b = net.params["ip"][0].data.copy(), net.params["ip"][1].data.copy()
    for step in range(3):
        net.forward()
        idx = np.arange(2 * step, 2 * step + 2) % N
        x = bgr[idx].reshape(2, -1) / 256.0
        np.testing.assert_allclose(net.blobs["data"].data, bgr[idx] / 256.0, rtol=1e-6)
        np.testing.assert_array_equal(net.blobs["label"].data, labels[idx])
        np.testing.assert_allclose(net.blobs["ip"].data, x @ w.T + b, rtol=1e-4, atol=1e-4)
