"""Training with half storage on the host (docs/precision.md): NVCaffe-style fp16/bf16 prototxts
train LeNet on MNIST images; fp32 master weights; fixed and adaptive loss scaling (a forced
overflow skips the step and halves the scale); master weights through snapshot and resume."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.solvers import sgd_solvers
from pycaffe_lite.solvers.update import Update
from pycaffe_lite.testing.nets import half_lenet


def _solver(type_name: str, batch: int = 32, extra_net: str = "", extra: str = "", lr: float = 0.01):
    caffe.set_mode_cpu()
    caffe.set_random_seed(34)
    net = half_lenet(type_name, batch, extra_net)
    text = (f"net_param {{ {net} }} base_lr: {lr} momentum: 0.9 weight_decay: 0.0005 lr_policy: \"fixed\" "
            f"random_seed: 34 {extra}")
    return sgd_solvers.SGDSolver(parse_text(text, caffe_pb2.SolverParameter()), progress=False)


def _feed(solver, mnist_digits) -> None:
    x, y = mnist_digits
    solver.net.set_input_arrays(x, y)


@pytest.mark.slow
@pytest.mark.parametrize("type_name", ["FLOAT16", "BFLOAT16"])
def test_lenet_trains_in_half_like_fp32(type_name, mnist_digits, caplog):
    """LeNet stores its blobs and params in the half type (data layer and loss in fp32), trains 40
    iterations on 1,024 MNIST digits with finite losses, and ends within 0.15 of fp32's loss."""
    caplog.set_level(logging.INFO, logger="pycaffe_lite")
    results = {}
    for t in ("FLOAT", type_name):
        solver = _solver(t)
        _feed(solver, mnist_digits)
        net = solver.net
        stored = np.float32 if t == "FLOAT" else (np.float16 if t == "FLOAT16" else np.uint16)
        assert net.blobs["conv1"].data.dtype == stored and net.params["ip1"][0].data.dtype == stored
        assert net.blobs["data"].data.dtype == np.float32 and net.blobs["loss"].data.dtype == np.float32
        losses = []
        for _ in range(40):
            solver.step(1)
            losses.append(float(net.blobs["loss"].data))
        assert np.isfinite(losses).all(), losses
        results[t] = float(np.mean(losses[-5:]))
        assert results[t] < 0.5 * losses[0], (t, losses[0], losses[-5:])
    assert abs(results[type_name] - results["FLOAT"]) < 0.15, results
    assert "runs in float32: no half path" not in caplog.text  # every LeNet layer has a half path


def test_master_weights_keep_updates_below_half_resolution(mnist_digits, tmp_path):
    """With a rate whose steps are far below an fp16 ulp, the fp16 params barely move while the
    fp32 masters accumulate the updates; params are always the masters rounded to nearest even.
    A snapshot holds the masters (float32 data) and a resumed solver has them bit for bit."""
    solver = _solver("FLOAT16", batch=16, lr=1e-7, extra=f'snapshot_prefix: "{tmp_path}/h"')
    _feed(solver, mnist_digits)
    start = [p.math_data().copy() for p in solver.net.learnable_params]
    solver.step(4)
    update = solver.update
    moved_master = moved_param = 0
    for i, p in enumerate(solver.net.learnable_params):
        master = update.masters[i]
        assert master is not None and master.dtype == np.float32 and p.dtype == np.float16
        np.testing.assert_array_equal(p.cpu_data(), master.cpu_data().astype(np.float16))
        moved_master += int((master.cpu_data() != start[i]).sum())
        moved_param += int((p.math_data() != start[i]).sum())
    assert moved_master > 10 * max(moved_param, 1), (moved_master, moved_param)
    # pycaffe's .data (a writable view) to read the params keeps the masters; writing them resets
    masters = [m.cpu_data().copy() for m in update.masters if m is not None]
    _ = [p.data for p in solver.net.learnable_params]
    update.sync_masters()
    for want, m in zip(masters, update.masters):
        assert m is not None
        np.testing.assert_array_equal(m.cpu_data(), want)
    first = solver.net.learnable_params[0]
    first.data = first.math_data() + 1
    update.sync_masters()
    assert update.masters[0] is not None
    np.testing.assert_array_equal(update.masters[0].cpu_data(), first.math_data())
    first.data = masters[0].astype(np.float16)  # (back to the master's rounding; master reset to it)
    update.masters[0].mutable_cpu_data()[...] = masters[0]
    model, state = solver.snapshot()
    saved = caffe_pb2.NetParameter.FromString(Path(model).read_bytes())
    ip1 = next(lp for lp in saved.layer if lp.name == "ip1")
    assert len(ip1.blobs[0].data) == ip1.blobs[0].shape.dim[0] * ip1.blobs[0].shape.dim[1]  # float32 data

    resumed = _solver("FLOAT16", batch=16, lr=1e-7, extra=f'snapshot_prefix: "{tmp_path}/h"')
    resumed.restore(state)
    for a, b, pa, pb in zip(update.masters, resumed.update.masters, solver.net.learnable_params,
                            resumed.net.learnable_params):
        assert a is not None and b is not None
        np.testing.assert_array_equal(b.cpu_data(), a.cpu_data())
        np.testing.assert_array_equal(pb.cpu_data(), pa.cpu_data())
    for a, b in zip(solver.history, resumed.history):
        np.testing.assert_array_equal(b.cpu_data(), a.cpu_data())
    _feed(resumed, mnist_digits)
    resumed.step(1)
    assert np.isfinite(float(resumed.net.blobs["loss"].data))


def test_fixed_loss_scale_divides_out_exactly(mnist_digits):
    """A power-of-two global_grad_scale seeds scaled gradients and divides them out before the
    update: in fp32 the trained weights are bit-identical to training without it."""
    plain = _solver("FLOAT", batch=16)
    scaled = _solver("FLOAT", batch=16, extra_net="global_grad_scale: 1024")
    assert plain.loss_scale == 1 and scaled.loss_scale == 1024
    for s in (plain, scaled):
        _feed(s, mnist_digits)
        s.step(3)
    assert scaled.net.layers[-1].loss_seed_scale == 1024
    for a, b in zip(plain.net.learnable_params, scaled.net.learnable_params):
        np.testing.assert_array_equal(b.data, a.data)
    assert float(scaled.net.blobs["loss"].data) == float(plain.net.blobs["loss"].data)  # the loss is unscaled


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the forced overflow's inf - inf)
def test_adaptive_loss_scale_overflow_skips_and_halves(mnist_digits, caplog, monkeypatch):
    """fp16 with an adaptive scale of 2^24: the seeded gradients overflow fp16, so the step is
    skipped (weights and history unchanged) and the scale halves, logged; once finite, the
    scale doubles after GROWTH_INTERVAL clean iterations."""
    caplog.set_level(logging.INFO, logger="pycaffe_lite")
    monkeypatch.setattr(Update, "GROWTH_INTERVAL", 3)
    solver = _solver("FLOAT16", batch=16, extra_net=f"global_grad_scale: {2.0 ** 24} global_grad_scale_adaptive: true")
    _feed(solver, mnist_digits)
    before = [p.cpu_data().copy() for p in solver.net.learnable_params]
    solver.step(1)
    assert solver.loss_scale == 2.0 ** 23
    assert "non-finite gradient, step skipped; loss scale 1.67772e+07 -> 8.38861e+06" in caplog.text
    assert not all(np.isfinite(p.math_diff()).all() for p in solver.net.learnable_params)  # it did overflow
    for b, p in zip(before, solver.net.learnable_params):
        np.testing.assert_array_equal(p.cpu_data(), b)
    assert all(not h.cpu_data().any() for h in solver.history)
    # the scale comes down by halvings until the gradients fit, then stays
    for _ in range(24):
        old = solver.loss_scale
        solver.step(1)
        if solver.loss_scale == old:
            break
    assert solver.loss_scale == old < 2.0 ** 23
    caplog.clear()
    solver.update.loss_scale = scale = 2.0 ** 4  # surely finite from here
    solver.update._seed_scale()
    solver.update._finite_run = 0
    solver.step(3)
    assert solver.loss_scale == 2 * scale and "3 finite iterations; loss scale 16 -> 32" in caplog.text
    assert any((p.cpu_data() != b).any() for b, p in zip(before, solver.net.learnable_params))


@pytest.mark.parametrize("type_name", ["FLOAT16", "BFLOAT16"])
def test_half_net_hdf5_weights_round_trip(type_name, tmp_path):
    """A half net's params saved to HDF5 (fp16 as float16 datasets, bf16 as float32) load back
    bit for bit."""
    h5py = pytest.importorskip("h5py")
    solver = _solver(type_name, batch=4)
    net = solver.net
    path = tmp_path / "w.h5"
    net.save_hdf5(path)
    with h5py.File(path, "r") as f:
        assert f["data"]["ip1"]["0"].dtype == (np.float16 if type_name == "FLOAT16" else np.float32)
    other = _solver(type_name, batch=4)
    for p in other.net.learnable_params:
        p.data = 0
    other.net.copy_from(path)
    for a, b in zip(net.learnable_params, other.net.learnable_params):
        np.testing.assert_array_equal(b.cpu_data(), a.cpu_data())


MIXED = """
name: "mixed" default_forward_type: FLOAT16 default_backward_type: FLOAT16
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "lrn" type: "LRN" bottom: "conv" top: "lrn" }
layer { name: "relu" type: "ReLU" bottom: "lrn" top: "lrn" }
layer { name: "ip" type: "InnerProduct" bottom: "lrn" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
"""


def test_undeclared_layer_runs_in_float32_and_neighbours_convert(caplog, monkeypatch):
    """LRN (no half path) in an fp16 net: one log line at build, an fp32 top; blobs keep their
    producer's type (an in-place fp16 ReLU on it leaves it fp32); the memory check counts fp16
    params and blobs at two bytes; the net's results match the float32 net's within fp16's
    rounding."""
    from pycaffe_lite import memcheck
    caplog.set_level(logging.INFO, logger="pycaffe_lite")
    totals = {}

    def record(where, items, *args, **kwargs):
        totals[where] = dict(items)

    monkeypatch.setattr(memcheck, "check_total", record)
    caffe.set_mode_cpu()
    caffe.set_random_seed(5)
    param = parse_text(MIXED, caffe_pb2.NetParameter())
    param.force_backward = True
    half = caffe.Net(param, caffe.TRAIN)
    assert caplog.text.count("layer 'lrn' (LRN) runs in float32: no half path") == 1
    dtypes = {name: b.dtype for name, b in half.blobs.items()}
    assert dtypes == {"data": np.float32, "conv": np.float16, "lrn": np.float32, "ip": np.float16}
    assert half.params["conv"][0].dtype == np.float16 and half.params["ip"][0].dtype == np.float16
    items = totals["net 'mixed'"]
    assert items["conv param 0"] == 4 * 3 * 3 * 3 * 2 and items["conv"] == 2 * 4 * 6 * 6 * 2
    assert items["lrn"] == 2 * 4 * 6 * 6 * 4
    param.ClearField("default_forward_type")
    param.ClearField("default_backward_type")
    single = caffe.Net(param, caffe.TRAIN)
    for name in ("conv", "ip"):
        for a, b in zip(single.params[name], half.params[name]):
            a.data[...] = b.math_data()
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3, 8, 8)).astype(np.float16).astype(np.float32)
    single.forward(data=x)
    half.forward(data=x)
    want, got = single.blobs["ip"].data, half.blobs["ip"].math_data()
    np.testing.assert_allclose(got, want, atol=8 * 2.0 ** -11 * np.abs(want).max())
    half.blobs["ip"].diff = 1
    single.blobs["ip"].diff[...] = 1
    half.backward()
    single.backward()
    want, got = single.blobs["data"].diff, half.blobs["data"].math_diff()
    np.testing.assert_allclose(got, want, atol=16 * 2.0 ** -11 * np.abs(want).max())
