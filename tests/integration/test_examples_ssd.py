"""examples/ssd: the generated SSD300-VGG16 and SSDLite-MobileNet deploy nets build and run, and the
detection script draws a PNG."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "ssd"))
import ssd_nets  # noqa: E402


@pytest.mark.parametrize("fn,num_priors", [(ssd_nets.ssd300_vgg16, 8732), (ssd_nets.ssdlite_mobilenet, None)])
def test_deploy_net_builds_and_detects(fn, num_priors, tmp_path):
    param = fn(num_classes=5, width=1 / 16)
    path = tmp_path / "deploy.prototxt"
    path.write_text(str(param))  # the text form parses back (the fork's prototxt style)
    net = caffe.Net(str(path), caffe.TEST)
    types = {layer.type for layer in net.layers}
    assert {"Permute", "PriorBox", "DetectionOutput", "Flatten", "Concat", "Softmax"} <= types
    if num_priors:
        assert "Normalize" in types
        assert net.blobs["mbox_priorbox"].shape == (1, 2, num_priors * 4)
    priors = net.blobs["mbox_priorbox"].shape[2] // 4
    net.blobs["data"].data[...] = np.random.default_rng(0).standard_normal(net.blobs["data"].shape)
    out = net.forward()["detection_out"]
    assert net.blobs["mbox_loc"].shape == (1, priors * 4)
    assert net.blobs["mbox_conf"].shape == (1, priors * 5)
    assert out.shape[:2] == (1, 1) and out.shape[3] == 7 and 1 <= out.shape[2] <= 200
    assert set(np.unique(out[0, 0, :, 1])) <= {1.0, 2.0, 3.0, 4.0}
    assert (out[0, 0, :, 2] > 0.01).all()


def test_prior_sizes_follow_the_ssd300_schedule():
    assert ssd_nets.scales(6, 20, 90, 300, 0.1) == ([30, 60, 111, 162, 213, 264], [60, 111, 162, 213, 264, 315])


@pytest.mark.slow
def test_detect_script_draws_png(tmp_path):
    # by path: other examples have a detect.py of their own
    spec = importlib.util.spec_from_file_location("ssd_detect", ROOT / "examples" / "ssd" / "detect.py")
    assert spec is not None and spec.loader is not None
    detect = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(detect)

    out = tmp_path / "det.png"
    assert detect.main(["--net", "ssdlite", "--width", "0.0625", "--num-classes", "4", "--threshold", "0",
                        "--out", str(out)]) == 0
    from PIL import Image

    img = Image.open(out)
    assert img.size == (480, 360)
