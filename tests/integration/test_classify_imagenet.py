"""``classify`` on an ImageNet-style (3-channel) deploy net, as BVLC's python/classify.py: channel
swap, raw scale, mean values or mean file, center crop or 10 crops, labels, top-k, .npy output; and
non-finite weights reported instead of confident answers (digits and imagenet, and ``test``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import io
from pycaffe_lite.commands import cli
from pycaffe_lite.proto.protoio import parse_text, write_text
from pycaffe_lite.schema import caffe_pb2

Image = pytest.importorskip("PIL.Image")

H = W = 8
CLASSES = 4
DEPLOY = f"""name: "tinynet"
layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ dim: 1 dim: 3 dim: {H} dim: {W} }} }} }}
layer {{ name: "fc" type: "InnerProduct" bottom: "data" top: "fc"
        inner_product_param {{ num_output: {CLASSES} weight_filler {{ type: "gaussian" std: 0.01 }}
                               bias_filler {{ type: "gaussian" std: 0.5 }} }} }}
layer {{ name: "prob" type: "Softmax" bottom: "fc" top: "prob" }}
"""


@pytest.fixture
def setup(tmp_path):
    caffe.set_mode_cpu()
    caffe.set_random_seed(3)
    model = tmp_path / "deploy.prototxt"
    model.write_text(DEPLOY)
    net = caffe.Net(str(model), caffe.TEST)
    weights = tmp_path / "w.caffemodel"
    net.save(weights)
    w, b = net.params["fc"][0].data.astype(np.float64), net.params["fc"][1].data.astype(np.float64)
    rng = np.random.default_rng(0)
    images = []
    for i, size in enumerate(((H, W), (H + 4, W + 6))):
        pixels = rng.integers(0, 256, size=(*size, 3), dtype=np.uint8)
        path = tmp_path / f"img{i}.png"
        Image.fromarray(pixels).save(path)
        images.append((path, pixels))
    (tmp_path / "labels.txt").write_text("".join(f"n0{i} thing number {i}\n" for i in range(CLASSES)))
    return tmp_path, model, weights, w, b, images


def scores_of(crop_rgb_uint8, w, b, mean_bgr):
    """The net by hand: RGB -> BGR, 0..255, minus the mean, (K, H, W), softmax(W x + b)."""
    x = crop_rgb_uint8[:, :, ::-1].astype(np.float64) - mean_bgr
    z = w @ x.transpose(2, 0, 1).ravel() + b
    e = np.exp(z - z.max())
    return e / e.sum()


def test_center_crop_mean_values_labels_top_k(setup, capsys):
    tmp, model, weights, w, b, images = setup
    path, pixels = images[0]  # exactly the input size: the "crop" is the image
    out = tmp / "pred.npy"
    rc = cli.main(["classify", "--model", str(model), "--weights", str(weights), str(path), "--images_dim", f"{H},{W}",
                   "--center_only", "--mean_values", "104,117,123", "--labels", str(tmp / "labels.txt"),
                   "--top_k", "2", "--output", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    want = scores_of(pixels, w, b, np.array([104.0, 117.0, 123.0]))
    got = np.load(out)
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-6)
    best = np.argsort(-want)[:2]
    lines = text.splitlines()
    assert lines[0] == f"{path}:" and len(lines) == 3
    for line, cls in zip(lines[1:], best):
        assert line.endswith(f"n0{cls} thing number {cls}  ({cls})")
        assert abs(float(line.split()[0]) - want[cls]) < 1e-4


def test_ten_crops_and_a_mean_file_larger_than_the_crop(setup, capsys):
    tmp, model, weights, w, b, images = setup
    path, pixels = images[1]  # (12, 14): images_dim equal to it, so no resizing happens
    rng = np.random.default_rng(5)
    mean_img = rng.uniform(0, 255, size=(3, H + 2, W + 2)).astype(np.float32)  # BGR (K, H, W), larger
    blob = io.array_to_blobproto(mean_img[None])
    (tmp / "mean.binaryproto").write_bytes(blob.SerializeToString())
    out = tmp / "pred.npy"
    rc = cli.main(["classify", "--model", str(model), "--weights", str(weights), str(path),
                   "--images_dim", f"{H + 4},{W + 6}", "--mean_file", str(tmp / "mean.binaryproto"),
                   "--output", str(out), "--mode", "imagenet"])
    assert rc == 0, capsys.readouterr().err
    mean_crop = mean_img[:, 1:1 + H, 1:1 + W].transpose(1, 2, 0).astype(np.float64)  # center of the mean
    ih, iw = pixels.shape[:2]
    corners = [(0, 0), (0, iw - W), (ih - H, 0), (ih - H, iw - W), ((ih - H) // 2, (iw - W) // 2)]
    crops = [pixels[r:r + H, c:c + W] for r, c in corners]
    crops += [c[:, ::-1] for c in crops]
    want = np.mean([scores_of(c, w, b, mean_crop) for c in crops], axis=0)
    np.testing.assert_allclose(np.load(out)[0], want, rtol=1e-4, atol=1e-6)


def test_bad_options_and_images_are_project_errors(setup, capsys):
    tmp, model, weights, *_ = setup
    base = ["classify", "--model", str(model), "--weights", str(weights)]
    (tmp / "junk.png").write_bytes(b"not an image")
    assert cli.main([*base, str(tmp / "junk.png"), str(tmp / "img0.png")]) == 1
    captured = capsys.readouterr()
    assert "junk.png: cannot read image" in captured.err and "img0.png:" in captured.out
    for extra, words in ((["--mean_values", "1,2"], "2 values for a net input of 3 channels"),
                         (["--channel_swap", "0,1"], "channel swap (0, 1) needs 3 entries"),
                         (["--images_dim", "4,4"], "smaller than the net's input"),
                         (["--labels", str(tmp)], "is a folder, not a labels file")):
        assert cli.main([*base, str(tmp / "img0.png"), *extra]) == 1
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, err


def test_oversized_image_is_a_project_error(setup, capsys, monkeypatch):
    tmp, model, weights, *_ = setup
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)
    rc = cli.main(["classify", "--model", str(model), "--weights", str(weights), str(tmp / "img1.png")])
    err = capsys.readouterr().err
    assert rc == 1 and "img1.png: image too large to load" in err and "Traceback" not in err


def nan_weights(model, weights, tmp):
    net = caffe.Net(str(model), caffe.TEST, weights=str(weights))
    net.params["fc"][0].data[0, 0] = np.nan
    bad = tmp / "nan.caffemodel"
    net.save(bad)
    return bad


def test_nan_weights_are_reported_not_confident(setup, capsys):
    tmp, model, weights, *_ = setup
    bad = nan_weights(model, weights, tmp)
    rc = cli.main(["classify", "--model", str(model), "--weights", str(bad), str(tmp / "img0.png")])
    captured = capsys.readouterr()
    assert rc == 3 and "scores are not finite" in captured.err and "p=nan" not in captured.out
    assert "0." not in captured.out


def test_nan_weights_in_digits_classify_and_test(tmp_path, capsys):
    examples = Path(__file__).resolve().parents[2] / "examples" / "mnist"
    caffe.set_random_seed(1)
    net = caffe.Net(str(examples / "lenet.prototxt"), caffe.TEST)
    net.params["ip2"][1].data[3] = np.nan
    bad = tmp_path / "nan.caffemodel"
    net.save(bad)
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "d.png")
    rc = cli.main(["classify", "--model", str(examples / "lenet.prototxt"), "--weights", str(bad),
                   str(tmp_path / "d.png")])
    captured = capsys.readouterr()
    assert rc == 3 and "output is not finite" in captured.err and "p=nan" not in captured.out
    # test: accuracy and loss over an input net with NaN weights -> marked, exit status 3
    train_test = examples / "lenet_train_test.prototxt"
    param = caffe_pb2.NetParameter()
    parse_text(train_test.read_text(), param)
    data = [lp for lp in param.layer if lp.type == "Data"]
    for lp in data:
        lp.type = "DummyData"
        lp.ClearField("data_param")
        lp.ClearField("transform_param")
        lp.dummy_data_param.shape.add().dim.extend([4, 1, 28, 28])
        lp.dummy_data_param.shape.add().dim.extend([4])
        lp.dummy_data_param.data_filler.add().type = "uniform"
        lp.dummy_data_param.data_filler.add().type = "constant"
    write_text(tmp_path / "tt.prototxt", param)
    rc = cli.main(["test", "--model", str(tmp_path / "tt.prototxt"), "--weights", str(bad), "--iterations", "2"])
    captured = capsys.readouterr()
    assert rc == 3, captured.err
    assert "accuracy = nan  <- not a finite number" in captured.out and "not finite" in captured.err
