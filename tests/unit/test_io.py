"""caffe.io: proto/datum conversions, Transformer, load_image, resize_image, oversample."""

import numpy as np
import pytest

from pycaffe_lite import io as cio
from pycaffe_lite.schema import caffe_pb2

PIL = pytest.importorskip("PIL.Image")


# -- proto conversions ------------------------------------------------------------------------
def test_blobproto_roundtrip_nd():
    arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    diff = -arr
    proto = cio.array_to_blobproto(arr, diff)
    assert list(proto.shape.dim) == [2, 3, 4]
    np.testing.assert_allclose(cio.blobproto_to_array(proto), arr, rtol=1e-6)
    np.testing.assert_allclose(cio.blobproto_to_array(proto, return_diff=True), diff, rtol=1e-6)


def test_blobproto_legacy_4d_and_double():
    proto = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=3)
    proto.data.extend(range(6))
    out = cio.blobproto_to_array(proto)
    assert out.shape == (1, 2, 1, 3)
    assert out[0, 1, 0, 2] == 5
    dproto = caffe_pb2.BlobProto()
    dproto.shape.dim.extend([2])
    dproto.double_data.extend([0.1, 0.2])
    out = cio.blobproto_to_array(dproto)
    assert out.dtype == np.float64 and out.tolist() == [0.1, 0.2]


def test_blobproto_size_mismatch():
    proto = caffe_pb2.BlobProto()
    proto.shape.dim.extend([3])
    proto.data.extend([1, 2])
    with pytest.raises(ValueError, match="2 values"):
        cio.blobproto_to_array(proto)
    with pytest.raises(ValueError, match="diff shape"):
        cio.array_to_blobproto(np.zeros(3), np.zeros(2))


def test_blobprotovector_roundtrip():
    arrays = [np.random.default_rng(0).standard_normal((1, 2, 3, 4)), np.arange(5.0)]
    s = cio.arraylist_to_blobprotovector_str(arrays)
    assert isinstance(s, bytes)
    back = cio.blobprotovector_str_to_arraylist(s)
    assert len(back) == 2
    for a, b in zip(arrays, back):
        np.testing.assert_allclose(b, a, rtol=1e-6)
    assert cio.arraylist_to_blobprotovecor_str(arrays) == s


def test_datum_uint8_and_float():
    arr = np.random.default_rng(1).integers(0, 256, (3, 4, 5), dtype=np.uint8)
    datum = cio.array_to_datum(arr, label=7)
    assert (datum.channels, datum.height, datum.width, datum.label) == (3, 4, 5, 7)
    assert datum.data == arr.tobytes() and len(datum.float_data) == 0
    np.testing.assert_array_equal(cio.datum_to_array(datum), arr)
    farr = np.linspace(-1, 1, 12).reshape(1, 3, 4)
    fdatum = cio.array_to_datum(farr)
    assert len(fdatum.data) == 0 and not fdatum.HasField("label")
    np.testing.assert_allclose(cio.datum_to_array(fdatum), farr, rtol=1e-6)
    with pytest.raises(ValueError, match="3-d"):
        cio.array_to_datum(np.zeros((2, 2)))


def test_datum_encoded_decodes_as_bgr(tmp_path):
    rgb = np.zeros((2, 3, 3), np.uint8)
    rgb[..., 0] = 200  # red
    rgb[..., 2] = 10
    path = tmp_path / "x.png"
    PIL.fromarray(rgb).save(path)
    datum = caffe_pb2.Datum(encoded=True, data=path.read_bytes(), label=1)
    out = cio.datum_to_array(datum)
    assert out.shape == (3, 2, 3)
    assert np.all(out[2] == 200) and np.all(out[0] == 10)  # channel 0 is blue


# -- Transformer ------------------------------------------------------------------------------
def _transformer():
    t = cio.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255.0)
    t.set_mean("data", np.array([10.0, 20.0, 30.0]))
    t.set_input_scale("data", 0.5)
    return t


def test_transformer_preprocess_order():
    img = np.random.default_rng(2).random((4, 5, 3)).astype(np.float32)
    out = _transformer().preprocess("data", img)
    assert out.shape == (3, 4, 5) and out.dtype == np.float32
    expected = (img.transpose(2, 0, 1)[[2, 1, 0]] * 255.0 - np.array([10.0, 20, 30])[:, None, None]) * 0.5
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_transformer_deprocess_inverts():
    t = _transformer()
    img = np.random.default_rng(3).random((4, 5, 3)).astype(np.float32)
    back = t.deprocess("data", t.preprocess("data", img)[None])
    np.testing.assert_allclose(back, img, rtol=1e-5, atol=1e-6)


def test_transformer_resizes_and_elementwise_mean():
    t = cio.Transformer({"data": (1, 1, 2, 2)})
    t.set_transpose("data", (2, 0, 1))
    mean = np.array([[1.0, 2.0], [3.0, 4.0]])
    t.set_mean("data", mean)  # (H, W) mean broadcast over the single channel
    img = np.full((4, 4, 1), 5.0, np.float32)
    out = t.preprocess("data", img)
    np.testing.assert_allclose(out, 5.0 - mean[None], rtol=1e-6)


def test_transformer_errors():
    t = cio.Transformer({"data": (1, 3, 4, 5)})
    with pytest.raises(KeyError, match="not one of the net inputs"):
        t.set_raw_scale("other", 1.0)
    with pytest.raises(ValueError, match="3 axes"):
        t.set_transpose("data", (1, 0))
    with pytest.raises(ValueError, match="3 entries"):
        t.set_channel_swap("data", (1, 0))
    with pytest.raises(ValueError, match="channels"):
        t.set_mean("data", np.zeros(2))
    with pytest.raises(ValueError, match="incompatible"):
        t.set_mean("data", np.zeros((3, 2, 2)))
    with pytest.raises(ValueError, match="invalid"):
        t.set_mean("data", np.zeros((1, 3, 4, 5)))


# -- images -----------------------------------------------------------------------------------
def test_load_image_color_gray_alpha(tmp_path):
    rgb = np.random.default_rng(4).integers(0, 256, (5, 6, 3), dtype=np.uint8)
    PIL.fromarray(rgb).save(tmp_path / "c.png")
    img = cio.load_image(str(tmp_path / "c.png"))
    assert img.shape == (5, 6, 3) and img.dtype == np.float32
    np.testing.assert_allclose(img, rgb / 255.0, rtol=1e-6)
    # a color file stays color even with color=False (as in BVLC)
    assert cio.load_image(str(tmp_path / "c.png"), color=False).shape == (5, 6, 3)

    gray = np.random.default_rng(5).integers(0, 256, (5, 6), dtype=np.uint8)
    PIL.fromarray(gray).save(tmp_path / "g.png")
    g1 = cio.load_image(str(tmp_path / "g.png"), color=False)
    assert g1.shape == (5, 6, 1)
    np.testing.assert_allclose(g1[..., 0], gray / 255.0, rtol=1e-6)
    g3 = cio.load_image(str(tmp_path / "g.png"))
    assert g3.shape == (5, 6, 3) and np.all(g3[..., 0] == g3[..., 2])

    rgba = np.dstack([rgb, np.full((5, 6), 9, np.uint8)])
    PIL.fromarray(rgba).save(tmp_path / "a.png")
    a = cio.load_image(str(tmp_path / "a.png"))
    np.testing.assert_allclose(a, rgb / 255.0, rtol=1e-6)

    g16 = (np.arange(30).reshape(5, 6) * 2000).astype(np.uint16)
    PIL.fromarray(g16).save(tmp_path / "g16.png")
    np.testing.assert_allclose(cio.load_image(str(tmp_path / "g16.png"), False)[..., 0], g16 / 65535.0, rtol=1e-6)


def test_load_image_missing_file(tmp_path):
    with pytest.raises(OSError, match="nope.png"):
        cio.load_image(str(tmp_path / "nope.png"))


def _bvlc_reference(im, h, w):
    """BVLC's resize_image written out per pixel: K in (1, 3) -> min/max to [0, 1], bilinear with
    half-pixel centres and 0 outside the image (skimage, mode='constant'), back to the range;
    other K -> corner-aligned bilinear (scipy.ndimage.zoom, order=1)."""
    H, W, K = im.shape
    out = np.zeros((h, w, K))
    if K in (1, 3):
        lo, hi = im.min(), im.max()
        u = (im - lo) / (hi - lo)

        def px(y, x):
            return u[y, x] if 0 <= y < H and 0 <= x < W else np.zeros(K)

        for i in range(h):
            y = (i + 0.5) * H / h - 0.5
            y0 = int(np.floor(y))
            for j in range(w):
                x = (j + 0.5) * W / w - 0.5
                x0 = int(np.floor(x))
                fy, fx = y - y0, x - x0
                v = (px(y0, x0) * (1 - fy) * (1 - fx) + px(y0, x0 + 1) * (1 - fy) * fx
                     + px(y0 + 1, x0) * fy * (1 - fx) + px(y0 + 1, x0 + 1) * fy * fx)
                out[i, j] = v * (hi - lo) + lo
        return out
    for i in range(h):
        y = i * (H - 1) / (h - 1) if h > 1 else 0.0
        y0 = min(int(np.floor(y)), H - 1)
        y1 = min(y0 + 1, H - 1)
        for j in range(w):
            x = j * (W - 1) / (w - 1) if w > 1 else 0.0
            x0 = min(int(np.floor(x)), W - 1)
            x1 = min(x0 + 1, W - 1)
            fy, fx = y - y0, x - x0
            out[i, j] = (im[y0, x0] * (1 - fy) * (1 - fx) + im[y0, x1] * (1 - fy) * fx
                         + im[y1, x0] * fy * (1 - fx) + im[y1, x1] * fy * fx)
    return out


@pytest.mark.parametrize("shape,new", [((4, 6, 3), (8, 3)), ((5, 5, 1), (5, 7)), ((3, 4, 2), (2, 9)),
                                       ((2, 3, 3), (5, 7)), ((6, 4, 5), (3, 8))])
def test_resize_matches_bvlc_reference(shape, new):
    im = np.random.default_rng(6).random(shape) * 200 - 50
    out = cio.resize_image(im, new)
    assert out.shape == new + (shape[2],) and out.dtype == np.float32
    np.testing.assert_allclose(out, _bvlc_reference(im, *new), rtol=1e-5, atol=1e-4)


def test_resize_properties():
    im = np.random.default_rng(7).random((4, 4, 3))
    np.testing.assert_allclose(cio.resize_image(im, (4, 4)), im, rtol=1e-6)
    const = np.full((3, 5, 3), 0.25)
    np.testing.assert_allclose(cio.resize_image(const, (7, 2)), 0.25)
    # 2x upsampling: interior samples are 3/4-1/4 mixes; at the borders BVLC's skimage path mixes in
    # the image's minimum (here 0) for the quarter pixel that falls outside the image
    ramp = np.arange(4, dtype=float).reshape(1, 4, 1)
    up = cio.resize_image(ramp, (1, 8))[0, :, 0]
    np.testing.assert_allclose(up, [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 2.25], rtol=1e-6)
    shifted = cio.resize_image(ramp + 10, (1, 8))[0, :, 0]  # the minimum is 10 now, not 0
    np.testing.assert_allclose(shifted, [10, 10.25, 10.75, 11.25, 11.75, 12.25, 12.75, 12.25], rtol=1e-6)
    # four channels: scipy's zoom, corners kept: 0..3 over 7 samples in steps of 0.5
    four = np.repeat(ramp, 4, axis=2)
    np.testing.assert_allclose(cio.resize_image(four, (1, 7))[0, :, 2], [0, 0.5, 1, 1.5, 2, 2.5, 3])
    near = cio.resize_image(ramp, (1, 8), interp_order=0)[0, :, 0]
    np.testing.assert_array_equal(near, [0, 0, 1, 1, 2, 2, 3, 3])
    with pytest.raises(ValueError, match="interp_order"):
        cio.resize_image(im, (2, 2), interp_order=3)
    with pytest.raises(ValueError, match="H, W, K"):
        cio.resize_image(np.zeros((4, 4)), (2, 2))


def test_oversample_crops_and_mirrors():
    rng = np.random.default_rng(8)
    images = [rng.random((6, 7, 2)).astype(np.float32) for _ in range(2)]
    crops = cio.oversample(images, (4, 4))
    assert crops.shape == (20, 4, 4, 2)
    for n, im in enumerate(images):
        c = crops[10 * n : 10 * n + 10]
        np.testing.assert_array_equal(c[0], im[:4, :4])
        np.testing.assert_array_equal(c[1], im[:4, 3:7])
        np.testing.assert_array_equal(c[2], im[2:6, :4])
        np.testing.assert_array_equal(c[3], im[2:6, 3:7])
        np.testing.assert_array_equal(c[4], im[1:5, 1:5])  # center: int(3 - 2), int(3.5 - 2)
        for k in range(5):
            np.testing.assert_array_equal(c[5 + k], c[k][:, ::-1])
    with pytest.raises(ValueError, match="larger"):
        cio.oversample(images, (7, 7))
