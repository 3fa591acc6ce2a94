"""The precision switch (docs/precision.md, "The precision switch"): ``precision.apply_precision``
as a pure NetParameter rewrite, ``caffe.set_precision`` / ``get_precision`` per thread, nets
built under it (Net, Solver, a Recurrent layer's inner net), weights rounded once at load, and
``--precision`` on ``pycaffe-lite`` / ``caffe`` ``train``, ``test`` and ``time`` in CPU mode."""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

import numpy as np
import pytest

import caffe as bvlc_caffe
import pycaffe_lite as caffe
from pycaffe_lite import common, precision
from pycaffe_lite.commands import caffe_cli, cli
from pycaffe_lite.commands import train as train_command
from pycaffe_lite.errors import GPUUnavailableError, NetError
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2

LENET = Path(__file__).resolve().parents[2] / "examples" / "mnist" / "lenet.prototxt"
STORED = {"fp16": np.float16, "bf16": np.uint16}

PLAIN = """
name: "plain"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 3 dim: 6 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


@pytest.fixture(autouse=True)
def no_switch():
    """Every test starts and ends with the switch unset and CPU mode (it is process state)."""
    common.context().precision = None
    caffe.set_mode_cpu()
    yield
    common.context().precision = None
    caffe.set_mode_cpu()


def _net(text: str) -> caffe_pb2.NetParameter:
    return parse_text(text, caffe_pb2.NetParameter())


# -- apply_precision: the rewrite -------------------------------------------------------------------
@pytest.mark.parametrize("name", [None, "fp32", "tf32"])
def test_float32_names_leave_the_file_as_it_is(name):
    net = _net(PLAIN)
    out = precision.apply_precision(net, name)
    assert out == net and out is not net


@pytest.mark.parametrize("name, want", [("fp16", caffe_pb2.FLOAT16), ("bf16", caffe_pb2.BFLOAT16)])
def test_half_names_set_the_net_defaults_on_a_copy(name, want):
    net = _net(PLAIN)
    before = net.SerializeToString()
    out = precision.apply_precision(net, name)
    assert net.SerializeToString() == before  # pure: the input is untouched
    assert (out.default_forward_type, out.default_backward_type) == (want, want)
    assert (out.default_forward_math, out.default_backward_math) == (caffe_pb2.FLOAT, caffe_pb2.FLOAT)
    assert list(out.layer) == list(net.layer)  # the layers are the file's
    # fp16 scales the loss adaptively from 2**16 (GradScaler's start); bf16 has fp32's range: no scaling
    assert out.global_grad_scale_adaptive is (name == "fp16")
    assert out.global_grad_scale == (precision.ADAPTIVE_INITIAL_SCALE if name == "fp16" else 1.0)
    ip = out.layer[1]
    rule = precision.layer_precision(out, ip)
    assert (rule.forward_type, rule.backward_type, rule.forward_math) == (want, want, caffe_pb2.FLOAT)


def test_fp16_keeps_the_files_own_loss_scale():
    out = precision.apply_precision(_net("global_grad_scale: 8 " + PLAIN), "fp16")
    assert out.global_grad_scale == 8 and not out.global_grad_scale_adaptive
    out = precision.apply_precision(_net("global_grad_scale_adaptive: false " + PLAIN), "fp16")
    assert out.global_grad_scale == 1 and not out.HasField("global_grad_scale")


def test_names_are_checked_and_case_folded():
    assert precision.check_precision_name("BF16") == "bf16" and precision.check_precision_name(None) is None
    for bad in ("half", "float16", "", 16):
        with pytest.raises(ValueError) as info:
            precision.apply_precision(_net(PLAIN), bad)  # type: ignore[arg-type]
        assert "fp32, tf32, fp16, bf16" in str(info.value)


FP16_FILE = "default_forward_type: FLOAT16 default_backward_type: FLOAT16 " + PLAIN.replace(
    'type: "Softmax"', 'type: "Softmax" forward_type: FLOAT backward_type: FLOAT')


def test_a_file_with_type_fields_keeps_them_when_the_name_agrees():
    net = _net(FP16_FILE)
    assert precision.apply_precision(net, "fp16") == net  # not even a loss scale is added
    only_layer = _net(PLAIN.replace('type: "ReLU"', 'type: "ReLU" forward_type: BFLOAT16'))
    assert precision.apply_precision(only_layer, "bf16") == only_layer
    assert [f for f, _ in precision.type_fields(only_layer)] == ["layer 'relu' forward_type"]


@pytest.mark.parametrize("text, name, named", [
    (FP16_FILE, "bf16", "default_forward_type: FLOAT16"),
    (FP16_FILE, "fp32", "default_forward_type: FLOAT16"),
    (FP16_FILE, "tf32", "default_backward_type: FLOAT16"),
    ("default_forward_type: FLOAT " + PLAIN, "fp16", "default_forward_type: FLOAT"),  # explicitly float32
    (PLAIN.replace('type: "ReLU"', 'type: "ReLU" forward_math: BFLOAT16'), "fp16", "layer 'relu' forward_math"),
])
def test_a_name_that_contradicts_the_file_is_an_error_naming_it(text, name, named):
    with pytest.raises(NetError) as info:
        precision.apply_precision(_net(text), name, source="nets/x.prototxt")
    message = str(info.value)
    assert message.startswith("nets/x.prototxt: precision " + name) and named in message
    assert "the file's types decide" in message


def test_half_on_a_float64_net_is_an_error():
    with pytest.raises(NetError, match="float64"):
        precision.apply_precision(_net(PLAIN), "bf16", np.float64)
    assert precision.apply_precision(_net(PLAIN), "fp32", np.float64) == _net(PLAIN)


# -- set_precision / get_precision ----------------------------------------------------------------
def test_set_and_get_precision_are_pycaffes_names():
    assert caffe.get_precision() is None and bvlc_caffe.get_precision() is None
    bvlc_caffe.set_precision("BF16")
    assert caffe.get_precision() == "bf16" and common.context().precision == "bf16"
    caffe.set_precision(None)
    assert caffe.get_precision() is None
    with pytest.raises(ValueError, match="fp32, tf32, fp16, bf16"):
        caffe.set_precision("fp8")
    assert caffe.get_precision() is None  # unchanged by the refusal
    assert bvlc_caffe.set_allow_tf32 is caffe.set_allow_tf32


def test_tf32_needs_gpu_mode_and_fp32_turns_tf32_off(monkeypatch):
    with pytest.raises(GPUUnavailableError, match="needs GPU mode"):
        caffe.set_precision("tf32")
    calls = []
    monkeypatch.setattr(common.blas, "set_allow_tf32", calls.append)
    monkeypatch.setattr(common.blas, "tf32_allowed", lambda: bool(calls and calls[-1]))
    common.context().mode = common.Mode.GPU  # (no device is touched: the blas call is recorded)
    caffe.set_precision("tf32")
    assert calls == [True] and caffe.get_precision() == "tf32"
    caffe.set_precision("fp32")
    assert calls == [True, False] and caffe.get_precision() == "fp32"
    caffe.set_precision("fp32")  # TF32 already off: no call
    assert calls == [True, False]
    calls.append(True)  # a later set_allow_tf32(True) shows in get_precision
    assert caffe.get_precision() == "tf32"
    caffe.set_precision("fp16")  # half names leave TF32 as it is
    assert calls[-1] is True and caffe.get_precision() == "fp16"


def test_precision_is_per_thread():
    caffe.set_precision("fp16")
    seen = {}

    def other():
        seen["plain"] = caffe.get_precision()  # a plain thread shares the process's context
        with caffe.thread_context():
            seen["inherited"] = caffe.get_precision()  # a thread's own context starts as a copy
            caffe.set_precision("bf16")
            seen["own"] = caffe.get_precision()
            seen["dtype"] = caffe.Net(str(LENET), caffe.TEST).blobs["conv1"].data.dtype

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == {"plain": "fp16", "inherited": "fp16", "own": "bf16", "dtype": np.uint16}
    assert caffe.get_precision() == "fp16"


# -- nets built under the switch ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_net_is_built_in_half_and_fp32_weights_round_once(name, tmp_path):
    ref = caffe.Net(str(LENET), caffe.TEST)
    rng = np.random.default_rng(3)
    for blobs in ref.params.values():
        for blob in blobs:
            blob.data[...] = rng.standard_normal(blob.shape) * 0.1
    weights = tmp_path / "lenet.caffemodel"
    ref.save(str(weights))
    caffe.set_precision(name)
    net = caffe.Net(str(LENET), caffe.TEST, weights=str(weights))
    stored = STORED[name]
    assert net.blobs["data"].data.dtype == np.float32  # inputs stay float32 (data layers)
    assert net.blobs["conv1"].data.dtype == stored and net.blobs["prob"].data.dtype == stored
    for lname, blobs in ref.params.items():
        for mine, theirs in zip(net.params[lname], blobs):
            assert mine.data.dtype == stored
            want = precision.from_float32(theirs.data, precision.type_of_dtype(stored))
            assert np.array_equal(mine.data, want)  # rounded to nearest even at load, once
    x = rng.random(net.blobs["data"].shape, dtype=np.float32)
    out = net.forward(data=x)["prob"]
    assert out.dtype == stored  # pycaffe returns storage arrays: bf16 as uint16 bit patterns
    probs = net.blobs["prob"].math_data()
    assert probs.dtype == np.float32 and np.allclose(probs.sum(axis=1), 1, atol=0.02)
    expected = ref.forward(data=x)["prob"]
    tol = 2.0 ** -11 if name == "fp16" else 2.0 ** -8
    assert np.abs(probs - expected).max() < 40 * tol, np.abs(probs - expected).max()


def test_pycaffe_reads_of_a_bf16_net(tmp_path):
    """pycaffe on a bf16 net: ``forward()`` and ``blob.data`` give uint16 bit patterns,
    ``math_data()`` float32 values, and ``blob.data = floats`` stores them rounded. The deploy
    net shares blob memory between layers (memory plan): ``math_data()`` of an early blob is a
    user read like ``data`` and gets that blob's own values back, not the buffer's later tenant."""
    ref = caffe.Net(str(LENET), caffe.TEST)
    rng = np.random.default_rng(4)
    for blobs in ref.params.values():
        for blob in blobs:
            blob.data[...] = rng.standard_normal(blob.shape) * 0.1
    weights = tmp_path / "w.caffemodel"
    ref.save(str(weights))
    x = rng.random(ref.blobs["data"].shape, dtype=np.float32)
    ref.forward(data=x)
    expected = {name: ref.blobs[name].data.copy() for name in ("conv1", "pool1", "ip1")}
    caffe.set_precision("bf16")
    net = caffe.Net(str(LENET), caffe.TEST, weights=str(weights))
    out = net.forward(data=x)
    slots, alone = net.executor.shared_data.planned_bytes()
    assert 0 < slots < alone  # the forward ran with blobs sharing buffers
    for name, want in expected.items():  # read first (before any .data): early blobs' buffers were reused
        got = net.blobs[name].math_data()
        assert got.dtype == np.float32
        assert np.abs(got - want).max() < 0.05 * np.abs(want).max(), (name, np.abs(got - want).max())
    assert out["prob"].dtype == np.uint16 and net.blobs["conv1"].data.dtype == np.uint16
    assert np.array_equal(out["prob"], precision.float32_to_bfloat16(net.blobs["prob"].math_data()))
    blob = net.blobs["ip2"]
    blob.data = np.full(blob.shape, 1.0 + 2.0 ** -9, np.float32)  # halfway between two bf16 values: even
    assert (blob.data == 0x3F80).all() and (blob.math_data() == 1.0).all()


def test_net_from_a_file_that_contradicts_names_the_file(tmp_path):
    path = tmp_path / "fp16_net.prototxt"
    path.write_text(FP16_FILE)
    caffe.set_precision("bf16")
    with pytest.raises(NetError) as info:
        caffe.Net(str(path), caffe.TEST)
    assert str(path) in str(info.value) and "BFLOAT16" in str(info.value)
    caffe.set_precision("fp16")
    assert caffe.Net(str(path), caffe.TEST).blobs["ip"].data.dtype == np.float16
    assert caffe.Net(str(path), caffe.TEST).blobs["prob"].data.dtype == np.float32  # its own FLOAT layer


def test_a_recurrent_layers_inner_net_follows_its_layer():
    """A layer without a half path (LSTM) runs in float32 in a half net, and so does the net it
    unrolls: the switch applies to the nets users build, not to nets built inside layers."""
    text = """
    layer { name: "x" type: "Input" top: "x" top: "cont" input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } } }
    layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
            recurrent_param { num_output: 5 weight_filler { type: "uniform" min: -0.1 max: 0.1 } } }
    layer { name: "ip" type: "InnerProduct" bottom: "h" top: "ip" inner_product_param { num_output: 2 axis: 2 } }
    """
    caffe.set_precision("bf16")
    net = caffe.Net(_net(text), caffe.TEST)
    assert net.blobs["h"].data.dtype == np.float32 and net.blobs["ip"].data.dtype == np.uint16
    inner = net.layer_dict["lstm"].unrolled_net
    assert {b.dtype for b in inner.blobs} == {np.dtype(np.float32)}
    net.blobs["cont"].data[...] = 1
    net.blobs["x"].data[...] = np.random.default_rng(0).standard_normal(net.blobs["x"].shape)
    net.forward()
    assert np.isfinite(net.blobs["ip"].math_data()).all()


# -- the command lines --------------------------------------------------------------------------------
TINY_TRAIN = """
name: "tiny"
layer { name: "data" type: "HDF5Data" top: "data" top: "label" hdf5_data_param { source: "%(list)s" batch_size: 16 } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 16 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


@pytest.fixture
def tiny_solver(tmp_path: Path) -> Path:
    """A 3-class problem (8 features, 96 samples) in HDF5, a two-layer net and an SGD solver of 30
    iterations that snapshots at the end into ``tmp_path/tiny_iter_30.caffemodel``."""
    import h5py

    rng = np.random.default_rng(7)
    centers = rng.standard_normal((3, 8)) * 2
    labels = rng.integers(0, 3, 96)
    with h5py.File(tmp_path / "train.h5", "w") as fh:
        fh["data"] = (centers[labels] + rng.standard_normal((96, 8)) * 0.5).astype(np.float32)
        fh["label"] = labels.astype(np.float32)
    (tmp_path / "train.txt").write_text(f"{tmp_path / 'train.h5'}\n")
    (tmp_path / "net.prototxt").write_text(TINY_TRAIN % {"list": tmp_path / "train.txt"})
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{tmp_path / "net.prototxt"}" base_lr: 0.05 momentum: 0.9 lr_policy: "fixed" '
                      f'max_iter: 30 display: 1 snapshot_prefix: "{tmp_path / "tiny"}" random_seed: 5 solver_mode: CPU\n')
    return solver


@pytest.mark.parametrize("front", ["pycaffe-lite", "caffe"])
def test_train_precision_fp16_trains_in_half_on_the_cpu(front, tiny_solver, monkeypatch, caplog):
    """``train --precision fp16`` in CPU mode: the net's blobs and params are fp16 (data and loss
    float32), the loss falls, the solver keeps float32 master weights and writes them to the
    snapshot."""
    caplog.set_level(logging.INFO, logger="pycaffe_lite")
    made = []
    real = train_command.solver_class

    def keep(type_name):
        cls = real(type_name)

        def make(*args, **kwargs):
            made.append(cls(*args, **kwargs))
            return made[-1]

        return make

    monkeypatch.setattr(train_command, "solver_class", keep)
    if front == "caffe":
        rc = caffe_cli.run(["train", "-solver", str(tiny_solver), "-precision", "FP16"])
    else:
        rc = cli.main(["train", "--solver", str(tiny_solver), "--precision", "fp16", "--no-progress"])
    assert rc == 0
    solver = made[0]
    net = solver.net
    assert net.blobs["ip1"].data.dtype == np.float16 and net.params["ip1"][0].data.dtype == np.float16
    assert net.blobs["data"].data.dtype == np.float32 and net.blobs["loss"].data.dtype == np.float32
    assert solver.update.loss_scale > 1 and solver.update.scale_adaptive  # fp16: adaptive loss scaling
    masters = [m for m in solver.update.masters if m is not None]
    assert len(masters) == 4 and all(m.dtype == np.float32 for m in masters)
    losses = [float(x) for x in re.findall(r"Iteration \d+ \([^)]*\), loss = ([\d.e+-]+)", caplog.text)]
    assert len(losses) >= 20 and np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.5 * losses[0], losses
    assert "Precision: fp16" in caplog.text
    snap = tiny_solver.parent / "tiny_iter_30.caffemodel"
    saved = caffe_pb2.NetParameter()
    saved.ParseFromString(snap.read_bytes())
    ip1 = next(lp for lp in saved.layer if lp.name == "ip1")
    assert len(ip1.blobs[0].data) == 16 * 8 and not ip1.blobs[0].raw_data  # the masters, float32
    assert np.array_equal(np.array(ip1.blobs[0].data, np.float32).reshape(16, 8), masters[0].data)


def test_test_and_time_take_precision(tmp_path, capsys):
    ref = caffe.Net(str(LENET), caffe.TEST)
    weights = tmp_path / "w.caffemodel"
    ref.save(str(weights))
    model = tmp_path / "scored.prototxt"  # LeNet's deploy net at batch 4
    model.write_text(LENET.read_text().replace("dim: 64", "dim: 4"))
    assert cli.main(["test", "--model", str(model), "--weights", str(weights), "--iterations", "1",
                     "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    values = [float(line.split("=")[1]) for line in out.splitlines() if line.startswith("prob = ")]
    assert len(values) == 40 and all(0 <= v <= 1 for v in values)  # float32 values, not bf16 bit patterns
    assert abs(sum(values) - 4) < 0.05
    assert caffe_cli.run(["time", "-model", str(model), "-iterations", "1", "-precision", "fp16"]) == 0
    assert "Average Forward pass" in capsys.readouterr().out


def test_precision_errors_on_the_command_lines(tmp_path, capsys):
    model = tmp_path / "fp16.prototxt"
    model.write_text(FP16_FILE)
    assert cli.main(["time", "--model", str(model), "--iterations", "1", "--precision", "bf16"]) == 1
    err = capsys.readouterr().err
    assert str(model) in err and "precision bf16 asks for BFLOAT16" in err
    assert cli.main(["time", "--model", str(model), "--precision", "half"]) == 2  # argparse: usage error
    assert "fp32, tf32, fp16, bf16" in capsys.readouterr().err
    assert caffe_cli.run(["time", "-model", str(model), "-precision", "half"]) == 1
    assert "fp32, tf32, fp16, bf16" in capsys.readouterr().err
    assert cli.main(["time", "--model", str(LENET), "--iterations", "1", "--precision", "tf32"]) == 1
    err = capsys.readouterr().err
    assert "--precision tf32" in err and "give --gpu N" in err


def test_multi_gpu_ranks_get_the_precision():
    """``train --gpu 0,1 --precision bf16``: the launcher forwards the flag to every rank."""
    import argparse

    from pycaffe_lite.parallel import launch

    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    args = parser.parse_args(["--solver", "s.prototxt", "--gpu", "0,1", "--precision", "BF16"])
    assert launch.forwarded_arguments(args, parser) == ["--solver", "s.prototxt", "--precision", "bf16"]


# -- on the GPU -------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_tf32_and_fp32_switch_the_gpus_tf32(gpu_mode, capsys):
    caffe.set_precision("tf32")
    assert common.tf32_allowed() and caffe.get_precision() == "tf32"
    caffe.set_precision("fp32")
    assert not common.tf32_allowed() and caffe.get_precision() == "fp32"
    assert cli.main(["time", "--model", str(LENET), "--iterations", "2", "--gpu", "0", "--precision", "tf32"]) == 0
    assert "Average Forward pass" in capsys.readouterr().out and common.tf32_allowed()
    caffe.set_precision("fp32")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_half_lenet_forward_on_the_gpu(name, gpu_mode, tmp_path):
    """A LeNet built under set_precision in GPU mode from an fp32 caffemodel: half params and blobs,
    outputs within the format's rounding of the CPU float32 forward."""
    caffe.set_mode_cpu()
    ref = caffe.Net(str(LENET), caffe.TEST)
    rng = np.random.default_rng(9)
    for blobs in ref.params.values():
        for blob in blobs:
            blob.data[...] = rng.standard_normal(blob.shape) * 0.1
    weights = tmp_path / "w.caffemodel"
    ref.save(str(weights))
    x = rng.random(ref.blobs["data"].shape, dtype=np.float32)
    expected = ref.forward(data=x)["prob"].copy()
    caffe.set_mode_gpu()
    caffe.set_precision(name)
    net = caffe.Net(str(LENET), caffe.TEST, weights=str(weights))
    assert net.params["conv1"][0].data.dtype == STORED[name]
    net.forward(data=x)
    probs = net.blobs["prob"].math_data()
    tol = 2.0 ** -11 if name == "fp16" else 2.0 ** -8
    assert np.abs(probs - expected).max() < 40 * tol, np.abs(probs - expected).max()
