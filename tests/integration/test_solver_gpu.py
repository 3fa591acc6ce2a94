"""GPU solvers (marked gpu): every fused update kernel against the CPU path, with L1/L2 decay,
iter_size normalization and clipping on; snapshot -> restore identity on the GPU."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.solvers import sgd_solvers

pytestmark = pytest.mark.gpu

RULES = ["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"]
HYPER = {
    "SGD": "momentum: 0.9",
    "Nesterov": "momentum: 0.8",
    "AdaGrad": "delta: 0.001",
    "RMSProp": "rms_decay: 0.9 delta: 0.0001",
    "AdaDelta": "momentum: 0.95 delta: 0.000001",
    "Adam": "momentum: 0.9 momentum2: 0.99 delta: 0.000001",
}
NET = """
  name: "mlp"
  layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 5 dim: 3 } } }
  layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "h"
          param { lr_mult: 1 decay_mult: 2 } param { lr_mult: 2 decay_mult: 0 }
          inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.7 }
                                bias_filler { type: "gaussian" std: 0.3 } } }
  layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }
  layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "out" loss_weight: 0.5
          inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.7 } } }
"""


def make(rule: str, extra: str, dtype=np.float64):
    text = (f'net_param {{ {NET} }} base_lr: 0.05 lr_policy: "step" gamma: 0.5 stepsize: 2 '
            f"{HYPER[rule]} random_seed: 4 {extra}")
    s = sgd_solvers.SOLVERS[rule](parse_text(text, caffe_pb2.SolverParameter()), dtype=dtype, progress=False)
    s.net.blobs["data"].data[...] = np.random.default_rng(1).normal(size=(5, 3))
    return s


def run_on(device: str, rule: str, extra: str, steps: int, dtype=np.float64):
    if device == "gpu":
        caffe.set_mode_gpu()
    else:
        caffe.set_mode_cpu()
    try:
        s = make(rule, extra, dtype)
        s.step(steps)
        weights = [b.data.copy() for b in s.net.learnable_params]
        diffs = [b.diff.copy() for b in s.net.learnable_params]
        history = [h.data.copy() for h in s.history]
        return weights, diffs, history
    finally:
        caffe.set_mode_cpu()


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize(
    "extra",
    [
        "",
        'weight_decay: 0.01 regularization_type: "L2" iter_size: 2',
        'weight_decay: 0.01 regularization_type: "L1" clip_gradients: 0.5',
    ],
)
def test_gpu_update_matches_cpu(rule, extra):
    cpu = run_on("cpu", rule, extra, 4)
    gpu = run_on("gpu", rule, extra, 4)
    for kind, a_list, b_list in zip(("weights", "diffs (update values)", "history"), cpu, gpu):
        assert len(a_list) == len(b_list)
        for a, b in zip(a_list, b_list):
            np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12, err_msg=f"{rule} {extra}: {kind}")


@pytest.mark.parametrize("rule", ["SGD", "Adam"])
def test_gpu_update_float32_close_to_cpu(rule):
    cpu = run_on("cpu", rule, "weight_decay: 0.001", 3, np.float32)
    gpu = run_on("gpu", rule, "weight_decay: 0.001", 3, np.float32)
    for a, b in zip(cpu[0], gpu[0]):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rule", RULES)
def test_gpu_snapshot_restore_identity(rule, tmp_path):
    caffe.set_mode_gpu()
    try:
        extra = f'weight_decay: 0.001 snapshot_prefix: "{tmp_path}/g"'
        straight = make(rule, extra)
        straight.step(4)
        first = make(rule, extra)
        first.step(2)
        _, state = first.snapshot()
        resumed = make(rule, extra)
        resumed.restore(state)
        resumed.step(2)
        for a, b in zip(straight.net.learnable_params, resumed.net.learnable_params):
            np.testing.assert_array_equal(a.data, b.data)
        for a, b in zip(straight.history, resumed.history):
            np.testing.assert_array_equal(a.data, b.data)
    finally:
        caffe.set_mode_cpu()


def test_gpu_train_cli(tmp_path, monkeypatch, capsys):
    from pycaffe_lite.commands import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt" base_lr: 0.01 lr_policy: "fixed" max_iter: 3 display: 1 '
        'snapshot_prefix: "g" test_iter: 1 test_interval: 2 type: "Adam"'
    )
    try:
        assert cli.main(["train", "--solver", "solver.prototxt", "--gpu", "0", "--no-progress"]) == 0
        assert (tmp_path / "g_iter_3.solverstate").exists()
        assert cli.main(["time", "--model", "net.prototxt", "--iterations", "2", "--gpu", "0"]) == 0
        assert cli.main(["test", "--model", "net.prototxt", "--weights", "g_iter_3.caffemodel",
                         "--iterations", "2", "--gpu", "0"]) == 0
    finally:
        caffe.set_mode_cpu()
