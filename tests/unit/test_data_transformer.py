"""DataTransformer vs independent numpy computations: scale, mean_value, mean_file, crop, mirror,
Datum decoding (uint8 data, float_data, encoded PNG)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from pycaffe_lite import TEST, TRAIN
from pycaffe_lite.data.transformer import DataTransformer, decode_datum
from pycaffe_lite.errors import DataError, ShapeError
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2


def tparam(text: str) -> caffe_pb2.TransformationParameter:
    return parse_text(text, caffe_pb2.TransformationParameter())


def uint8_datum(arr: np.ndarray, label: int = 0) -> caffe_pb2.Datum:
    d = caffe_pb2.Datum(channels=arr.shape[0], height=arr.shape[1], width=arr.shape[2], label=label)
    d.data = arr.astype(np.uint8).tobytes()
    return d


@pytest.fixture
def item():
    return np.random.default_rng(1).integers(0, 256, size=(3, 6, 5), dtype=np.uint8)


def test_scale_and_identity(item):
    out = DataTransformer(tparam("scale: 0.00390625"), TEST, np.float32).transform(uint8_datum(item))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, item.astype(np.float32) / 256)
    same = DataTransformer(None, TRAIN, np.float64).transform(item)
    np.testing.assert_array_equal(same, item.astype(np.float64))


@pytest.mark.parametrize("means", [[10.5], [1.0, 2.0, 3.0]])
def test_mean_value(item, means):
    t = DataTransformer(tparam(" ".join(f"mean_value: {m}" for m in means) + " scale: 0.5"), TEST, np.float64)
    expected = np.empty(item.shape)
    for c in range(3):
        expected[c] = (item[c].astype(np.float64) - means[c if len(means) > 1 else 0]) * 0.5
    np.testing.assert_allclose(t.transform(item), expected, rtol=0, atol=1e-12)


def test_mean_value_count_must_match(item):
    t = DataTransformer(tparam("mean_value: 1 mean_value: 2"), TEST)
    with pytest.raises(ShapeError, match=r"1 mean_value or as many as channels \(3\), got 2"):
        t.transform(item)


def test_mean_file_with_center_crop(item, tmp_path):
    mean = np.random.default_rng(2).uniform(0, 255, size=(1, 3, 6, 5))
    proto = caffe_pb2.BlobProto()
    proto.num, proto.channels, proto.height, proto.width = mean.shape  # legacy 4-d header
    proto.data.extend(mean.ravel().tolist())
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(proto.SerializeToString())
    t = DataTransformer(tparam(f'mean_file: "{path}" crop_size: 3 scale: 2'), TEST, np.float64)
    out = t.transform(uint8_datum(item))
    m32 = mean[0].astype(np.float32).astype(np.float64)  # stored as float in the BlobProto
    h0, w0 = (6 - 3) // 2, (5 - 3) // 2
    expected = (item[:, h0 : h0 + 3, w0 : w0 + 3] - m32[:, h0 : h0 + 3, w0 : w0 + 3]) * 2
    np.testing.assert_allclose(out, expected, atol=1e-9)
    assert t.infer_shape(uint8_datum(item)) == (3, 3, 3)


def test_mean_file_errors(item, tmp_path):
    with pytest.raises(DataError, match="cannot specify mean_file and mean_value"):
        DataTransformer(tparam('mean_file: "x" mean_value: 1'), TEST)
    with pytest.raises(DataError, match=r"nope\.binaryproto"):
        DataTransformer(tparam(f'mean_file: "{tmp_path}/nope.binaryproto"'), TEST)
    proto = caffe_pb2.BlobProto()
    proto.shape.dim.extend([1, 2, 2])
    proto.data.extend([0.0] * 4)
    (tmp_path / "m.binaryproto").write_bytes(proto.SerializeToString())
    t = DataTransformer(tparam(f'mean_file: "{tmp_path}/m.binaryproto"'), TEST)
    with pytest.raises(ShapeError, match=r"mean_file .* has shape \(1, 2, 2\), the data items are \(3, 6, 5\)"):
        t.transform(item)


def test_random_crop_at_train(item):
    t = DataTransformer(tparam("crop_size: 4"), TRAIN, np.float64, rng=np.random.default_rng(0))
    offsets = set()
    for _ in range(60):
        out = t.transform(item)
        assert out.shape == (3, 4, 4)
        matches = [(h, w) for h in range(3) for w in range(2) if np.array_equal(out, item[:, h : h + 4, w : w + 4])]
        assert len(matches) == 1
        offsets.add(matches[0])
    assert offsets == {(h, w) for h in range(3) for w in range(2)}  # every window is drawn


def test_crop_too_large(item):
    with pytest.raises(ShapeError, match="crop_size 7 is larger than the 6x5 input"):
        DataTransformer(tparam("crop_size: 7"), TEST).transform(item)


def test_mirror_random_at_train(item):
    t = DataTransformer(tparam("mirror: true crop_size: 4"), TRAIN, np.float64, rng=np.random.default_rng(3))
    flips = 0
    for _ in range(40):
        out = t.transform(item)
        windows = [item[:, h : h + 4, w : w + 4] for h in range(3) for w in range(2)]
        plain = any(np.array_equal(out, win) for win in windows)
        flipped = any(np.array_equal(out, win[:, :, ::-1]) for win in windows)
        assert plain or flipped
        flips += flipped and not plain
    assert 5 < flips < 35


def test_mirror_is_random_at_test_too_as_in_caffe(item):
    """Caffe draws the flip in every phase (only the crop offset depends on the phase)."""
    t = DataTransformer(tparam("mirror: true crop_size: 4"), TEST, np.float64, rng=np.random.default_rng(5))
    centre = item[:, 1:5, 0:4]
    outs = [t.transform(item) for _ in range(30)]
    assert all(np.array_equal(o, centre) or np.array_equal(o, centre[:, :, ::-1]) for o in outs)
    assert 3 < sum(np.array_equal(o, centre[:, :, ::-1]) for o in outs) < 27
    never = DataTransformer(tparam("crop_size: 4"), TRAIN, np.float64, rng=np.random.default_rng(5))
    windows = [item[:, h : h + 4, w : w + 4] for h in range(3) for w in range(2)]
    for _ in range(10):  # without mirror: never flipped
        out = never.transform(item)
        assert any(np.array_equal(out, win) for win in windows)


def test_float_data_datum():
    values = np.random.default_rng(4).normal(size=(2, 3, 3)).astype(np.float32)
    d = caffe_pb2.Datum(channels=2, height=3, width=3)
    d.float_data.extend(values.ravel().tolist())
    out = DataTransformer(tparam("scale: 3 mean_value: 0.5"), TEST, np.float32).transform(d)
    np.testing.assert_allclose(out, (values - np.float32(0.5)) * np.float32(3), rtol=1e-6)


def test_datum_size_errors():
    d = caffe_pb2.Datum(channels=1, height=2, width=2, data=b"abc")
    with pytest.raises(DataError, match=r"holds 3 bytes, shape \(1, 2, 2\) needs 4"):
        decode_datum(d)
    with pytest.raises(DataError, match="every dimension must be positive"):
        decode_datum(caffe_pb2.Datum(channels=0, height=2, width=2, data=b""))


def test_encoded_datum_decoded_with_pillow(item):
    Image = pytest.importorskip("PIL.Image")
    rgb = item.transpose(1, 2, 0)  # (H, W, 3) as R, G, B
    buf = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(buf, format="PNG")
    d = caffe_pb2.Datum(encoded=True, data=buf.getvalue(), label=4)
    np.testing.assert_array_equal(decode_datum(d), item[::-1])  # BGR channel order, as OpenCV
    gray = DataTransformer(tparam("force_gray: true"), TEST).transform(d)
    expected_gray = np.asarray(Image.fromarray(rgb, "RGB").convert("L"), dtype=np.float32)
    np.testing.assert_array_equal(gray[0], expected_gray)
    assert DataTransformer(tparam("crop_size: 2"), TEST).infer_shape(d) == (3, 2, 2)
    with pytest.raises(DataError, match="cannot decode"):
        decode_datum(caffe_pb2.Datum(encoded=True, data=b"not an image"))
