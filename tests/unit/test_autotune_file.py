"""The convolution autotune file: round trip, stale and foreign entries, atomic merged writes, the
environment variable and CLI flag; on the GPU, a loaded file replaces tuning."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.commands import use_device
from pycaffe_lite.commands.cli import build_parser
from pycaffe_lite.config import Config
from pycaffe_lite.conv import autotune_file
from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.conv.engines import Choice
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
A100 = ("NVIDIA A100-SXM4-80GB", (8, 0))


def _prob(num=32, kernel=3, stride=1, channels=64) -> ConvProblem:
    pad = kernel // 2
    return ConvProblem(num, channels, 56, 56, 64, 1, (kernel, kernel), (pad, pad), (stride, stride), (1, 1), "<f4")


def _key(prob: ConvProblem, device=H100, tf32=False, bias=True, timing="wall") -> tuple:
    names = tuple(n for n in conv_engines.ENGINE_CANDIDATES["DEFAULT"]
                  if conv_engines.ENGINES[n].supports(prob))
    return prob, bias, names, tf32, device, timing


def _choice(fwd="winograd", data="implicit-64x128", weight="gemm") -> Choice:
    return Choice(fwd, data, weight, (("forward", fwd, 0.25), ("backward_data", data, 0.5),
                                      ("backward_weight", weight, 0.75)))


@pytest.fixture
def cache(monkeypatch):
    """An empty autotune cache and no autotune file for the test (the module's state is restored)."""
    monkeypatch.setattr(conv_engines, "_choices", {})
    monkeypatch.setattr(conv_engines, "_unreserved", set())
    monkeypatch.setattr(conv_engines, "_cache_files", {})
    monkeypatch.setattr(conv_engines, "_cache_file", None)
    monkeypatch.setattr(conv_engines, "config", Config())  # no $PYCAFFE_LITE_AUTOTUNE_CACHE
    return conv_engines._choices


def test_round_trip(cache, tmp_path):
    path = tmp_path / "tune.json"
    want = {_key(_prob()): _choice(), _key(_prob(), device=A100, tf32=True): _choice("gemm", "gemm", "gemm"),
            _key(_prob(), timing="graph"): _choice("gemm", "winograd", "gemm"),
            _key(_prob(num=1, kernel=1), bias=False): _choice("gemm", "gemm", "implicit-32x32")}
    cache.update(want)
    cache[_key(_prob(kernel=5))] = Choice("gemm", "gemm", "gemm")  # forced (never tuned): not saved
    assert caffe.save_autotune(path) == 4
    doc = json.loads(path.read_text())
    assert (doc["format"], doc["format_version"], doc["code"]) == (autotune_file.FORMAT, 2, autotune_file.code_version())
    assert {e["timing"] for e in doc["entries"]} == {"wall", "graph"}
    assert doc["entries"][0]["device"] == {"name": H100[0], "capability": [9, 0]}
    assert doc["entries"][0]["problem"]["kernel"] == [3, 3]
    conv_engines.clear_cache()
    assert caffe.load_autotune(str(path)) == 4
    assert cache == want
    assert conv_engines._unreserved == set(want)  # their scratch is reserved at first use


def _write_doc(path, entries, **fields) -> None:
    doc = {"format": autotune_file.FORMAT, "format_version": 2, "code": autotune_file.code_version(),
           "entries": entries}
    doc.update(fields)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("fields", [{"format_version": 1}, {"code": "0.0.1+0123456789abcdef"}])
def test_stale_file_is_ignored_with_a_warning(cache, tmp_path, caplog, fields):
    path = tmp_path / "tune.json"
    entry = autotune_file._entry(_key(_prob()), ("gemm", "gemm", "gemm"), (("forward", "gemm", 1.0),))
    _write_doc(path, [entry], **fields)
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        assert caffe.load_autotune(path) == 0
    assert "ignoring the autotune file" in caplog.text and not cache
    cache[_key(_prob(num=1))] = _choice()  # writing replaces the stale file
    assert caffe.save_autotune(path) == 1
    assert json.loads(path.read_text())["code"] == autotune_file.code_version()


def test_foreign_and_malformed_entries_are_ignored(cache, tmp_path, caplog):
    path = tmp_path / "tune.json"
    good = autotune_file._entry(_key(_prob()), ("winograd", "gemm", "gemm"), ())
    unknown = autotune_file._entry(_key(_prob(num=2)), ("fancy", "gemm", "gemm"), ())
    no_longer = autotune_file._entry(_key(_prob(num=3)), ("winograd", "gemm", "gemm"), ())
    no_longer["problem"]["stride"] = [2, 2]  # winograd does not run stride 2 (nor is it a candidate)
    wrong_pass = autotune_file._entry(_key(_prob(num=1)), ("direct", "direct", "gemm"), ())  # direct: forward only
    other_device = autotune_file._entry(_key(_prob(), device=A100), ("gemm", "gemm", "gemm"), ())
    broken = dict(good, problem={"num": 1})
    bad_value = dict(good, problem=dict(good["problem"], num="many"))
    bad_dtype = dict(good, problem=dict(good["problem"], dtype="<q9"))
    _write_doc(path, [good, unknown, no_longer, wrong_pass, other_device, broken, bad_value, bad_dtype, "junk"])
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        assert caffe.load_autotune(path) == 2
    assert "4 malformed" in caplog.text and "3 autotune entries for engines that no longer exist" in caplog.text
    assert cache[_key(_prob())].forward == "winograd"
    assert cache[_key(_prob(), device=A100)].forward == "gemm"  # kept: it applies on that device only


def test_save_merges_with_the_file(cache, tmp_path):
    path = tmp_path / "tune.json"
    cache[_key(_prob())] = _choice()
    cache[_key(_prob(num=1))] = _choice()
    caffe.save_autotune(path)
    conv_engines.clear_cache()
    cache[_key(_prob())] = _choice("gemm", "gemm", "gemm")  # retuned: replaces its entry
    cache[_key(_prob(num=8))] = _choice()  # new
    assert caffe.save_autotune(path) == 3
    conv_engines.clear_cache()
    caffe.load_autotune(path)
    assert cache == {_key(_prob()): _choice("gemm", "gemm", "gemm"), _key(_prob(num=1)): _choice(),
                     _key(_prob(num=8)): _choice()}


def test_write_is_atomic(cache, tmp_path, monkeypatch):
    path = tmp_path / "tune.json"
    cache[_key(_prob())] = _choice()
    caffe.save_autotune(path)
    before = path.read_bytes()
    cache[_key(_prob(num=1))] = _choice()

    def broken_dump(obj, f, **kwargs):
        f.write('{"format": "pycaffe-lite conv au')
        raise OSError("disk full")

    monkeypatch.setattr(autotune_file.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        caffe.save_autotune(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["tune.json"]  # no temporary file left


def test_other_files_are_never_overwritten(cache, tmp_path, caplog):
    path = tmp_path / "notes.json"
    path.write_text('{"my": "data"}')
    cache[_key(_prob())] = _choice()
    with pytest.raises(autotune_file.AutotuneFileError, match="not a pycaffe-lite autotune file"):
        caffe.save_autotune(path)
    with pytest.raises(autotune_file.AutotuneFileError):
        caffe.load_autotune(path)
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        assert not conv_engines._autoload(str(path))  # the automatic file: a warning, then left alone
    assert "neither used nor written" in caplog.text
    assert path.read_text() == '{"my": "data"}'


def test_automatic_file_from_environment_and_cli(cache, tmp_path, monkeypatch):
    path = tmp_path / "tune.json"
    assert conv_engines.cache_file() is None
    monkeypatch.setattr(conv_engines, "config", Config(autotune_cache=str(path)))  # as $PYCAFFE_LITE_AUTOTUNE_CACHE
    assert conv_engines.cache_file() == str(path)
    assert conv_engines._autoload(str(path))  # no file yet: nothing loaded, saved to later
    cache[_key(_prob())] = _choice()
    caffe.save_autotune(path)
    conv_engines.clear_cache()
    conv_engines._cache_files.clear()
    assert conv_engines._autoload(str(path)) and len(cache) == 1
    for command in (["train", "--solver", "s"], ["test", "--model", "m", "--weights", "w"], ["time", "--model", "m"]):
        args = build_parser().parse_args([*command, "--gpu", "0", "--autotune-cache", "cli.json"])
        assert args.autotune_cache == "cli.json"
    use_device(None, str(tmp_path / "cli.json"))  # --autotune-cache wins over the environment
    assert conv_engines.cache_file() == str(tmp_path / "cli.json")


def _conv(body="num_output: 8 kernel_size: 3 pad: 1"):
    layer = make_layer(f'name: "conv" type: "Convolution" convolution_param {{ {body} }}', np.float32)
    bottom, top = blobs([np.ones((4, 4, 10, 10))], np.float32), empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


def _no_tuning(*args):
    raise AssertionError("tuned although the autotune file has the shape")


@pytest.mark.gpu
def test_gpu_loaded_choice_skips_tuning(cache, gpu_mode, tmp_path, monkeypatch):
    path = tmp_path / "tune.json"
    layer, _, _ = _conv()
    tuned = layer.engine_choice()
    assert tuned.timings and caffe.save_autotune(path) == 1
    conv_engines.clear_cache()
    assert caffe.load_autotune(path) == 1
    monkeypatch.setattr(conv_engines, "_tune", _no_tuning)
    other, bottom, top = _conv()
    assert other.engine_choice() == tuned
    other.backward(top, [True], bottom)  # the loaded engines run
    assert np.isfinite(bottom[0].diff).all()


@pytest.mark.gpu
def test_gpu_environment_file_is_loaded_and_saved(cache, gpu_mode, tmp_path, monkeypatch):
    path = tmp_path / "tune.json"
    monkeypatch.setattr(conv_engines, "config", Config(autotune_cache=str(path)))  # as $PYCAFFE_LITE_AUTOTUNE_CACHE
    tuned = _conv()[0].engine_choice()  # tuned, then saved
    assert len(json.loads(path.read_text())["entries"]) == 1
    conv_engines.clear_cache()
    conv_engines._cache_files.clear()  # as a new process
    monkeypatch.setattr(conv_engines, "_tune", _no_tuning)
    assert _conv()[0].engine_choice() == tuned
