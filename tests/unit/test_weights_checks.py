"""Weights that do not fit are never silent: empty, truncated and non-caffemodel files are errors
naming the file; layers left without weights are listed in a warning, and test / classify /
Classifier refuse them unless allowed; one unreadable image does not abort a classify batch."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.commands import cli
from pycaffe_lite.errors import WeightsError
from pycaffe_lite.schema import caffe_pb2

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist"
DEPLOY = EXAMPLE / "lenet.prototxt"


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    caffe.set_mode_cpu()
    caffe.set_random_seed(5)
    d = tmp_path_factory.mktemp("w")
    net = caffe.Net(str(DEPLOY), caffe.TEST)
    full = d / "full.caffemodel"
    net.save(full)
    param = net.to_proto()
    partial = caffe_pb2.NetParameter()
    partial.CopyFrom(param)
    keep = [lp for lp in param.layer if lp.name not in ("ip1", "ip2")]
    del partial.layer[:]
    partial.layer.extend(keep)
    (d / "partial.caffemodel").write_bytes(partial.SerializeToString())
    raw = full.read_bytes()
    (d / "truncated.caffemodel").write_bytes(raw[: len(raw) // 2])
    (d / "empty.caffemodel").write_bytes(b"")
    (d / "text.caffemodel").write_text("hello, I am not a model\n")
    return d


@pytest.mark.parametrize("name, message", [
    ("empty", "empty.caffemodel: not a caffemodel \\(an empty file"),
    ("truncated", "truncated.caffemodel: corrupt or not a caffemodel"),
    ("text", "text.caffemodel: (corrupt or )?not a caffemodel"),
])
def test_unusable_files_are_errors(weights, name, message):
    net = caffe.Net(str(DEPLOY), caffe.TEST)
    with pytest.raises(WeightsError, match=message):
        net.copy_from(weights / f"{name}.caffemodel")


def test_missing_layers_warned_and_refused(weights, caplog):
    net = caffe.Net(str(DEPLOY), caffe.TEST)
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        missing = net.copy_from(weights / "partial.caffemodel")  # BVLC's behaviour, with a warning
    assert missing == ["ip1", "ip2"]
    assert "no weights for layers ip1, ip2" in caplog.text
    with pytest.raises(WeightsError, match="partial.caffemodel: holds no weights for layers ip1, ip2"):
        net.copy_from(weights / "partial.caffemodel", allow_missing=False)
    assert net.copy_from(weights / "full.caffemodel", allow_missing=False) == []
    with pytest.raises(WeightsError, match="ip1, ip2"):
        caffe.Classifier(str(DEPLOY), str(weights / "partial.caffemodel"))
    c = caffe.Classifier(str(DEPLOY), str(weights / "partial.caffemodel"), allow_missing=True)
    assert c.params["conv1"][0].data.shape == (20, 1, 5, 5)


def test_test_and_classify_commands_refuse_missing_weights(weights, tmp_path, capsys):
    pytest.importorskip("PIL.Image")
    from PIL import Image

    img = tmp_path / "d.png"
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(img)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    rc = cli.main(["classify", "--model", str(DEPLOY), "--weights", str(weights / "partial.caffemodel"), str(img)])
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]  # (a logging handler of an earlier test may add noise above)
    assert rc == 1 and line.startswith("pycaffe-lite classify: error: ") and "ip1, ip2" in line
    assert "--allow-missing" in line
    rc = cli.main(["classify", "--model", str(DEPLOY), "--weights", str(weights / "partial.caffemodel"),
                   "--allow-missing", str(img)])
    assert rc == 0
    # an unreadable image is reported, the others are still classified, the exit status says so
    rc = cli.main(["classify", "--model", str(DEPLOY), "--weights", str(weights / "full.caffemodel"),
                   str(bad), str(img)])
    out, err = capsys.readouterr()
    assert rc == 1 and "bad.png: cannot read image" in err and f"{img}: " in out
    rc = cli.main(["test", "--model", str(DEPLOY), "--weights", str(weights / "empty.caffemodel"),
                   "--iterations", "1"])
    err = capsys.readouterr().err
    assert rc == 1 and "empty.caffemodel" in err


def test_finetuning_keeps_bvlc_behaviour(weights, tmp_path, caplog):
    """train --weights with a file covering only part of the net: the others keep their fillers."""
    net_txt = DEPLOY.read_text().replace('name: "ip2"', 'name: "ip2_new"')
    p = tmp_path / "ft.prototxt"
    p.write_text(net_txt)
    net = caffe.Net(str(p), caffe.TEST)
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        assert net.copy_from(weights / "full.caffemodel") == ["ip2_new"]
    assert "ip2_new" in caplog.text
