"""Half-precision training on the GPU (docs/precision.md, "GPU"): fp16/bf16 nets built in GPU mode
train like their host twins; conversions between layers of different types run as kernels;
fp32 master weights on the device; fixed and adaptive loss scaling on the device, eager and
replayed as CUDA graphs (a forced overflow skips the step and halves the scale)."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.solvers import sgd_solvers
from pycaffe_lite.solvers.update import Update
from pycaffe_lite.testing.nets import half_lenet

pytestmark = pytest.mark.gpu

def _solver(type_name: str, gpu: bool, graphs: bool = True, batch: int = 32, extra_net: str = "",
            lr: float = 0.01) -> caffe.Solver:
    if gpu:
        caffe.set_mode_gpu()
    else:
        caffe.set_mode_cpu()
    caffe.set_random_seed(34)
    net = half_lenet(type_name, batch, extra_net, lrn=True)
    text = (f"net_param {{ {net} }} base_lr: {lr} momentum: 0.9 weight_decay: 0.0005 lr_policy: \"fixed\" "
            f"random_seed: 34")
    solver = sgd_solvers.SGDSolver(parse_text(text, caffe_pb2.SolverParameter()), progress=False)
    solver.net.executor.use_graphs = graphs
    return solver


def _train(solver, mnist_digits, steps: int) -> list[float]:
    solver.net.set_input_arrays(*mnist_digits)
    losses = []
    for _ in range(steps):
        solver.step(1)
        losses.append(float(solver.net.blobs["loss"].data))
    return losses


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("type_name", ["FLOAT16", "BFLOAT16"])
def test_half_lenet_on_gpu_trains_like_the_host(type_name, graphs, mnist_digits, gpu_mode):
    """The same fp16/bf16 LeNet (an LRN with no half path in it) trains 30 iterations on the GPU,
    eager and replayed, and on the host: blobs and params keep their storage types, losses stay
    finite and fall, and the two runs end within 0.1 of each other (same seed and data; the
    devices round sums differently)."""
    stored = np.float16 if type_name == "FLOAT16" else np.uint16
    results = {}
    for gpu in (False, True):
        solver = _solver(type_name, gpu, graphs)
        net = solver.net
        assert net.blobs["conv1"].data.dtype == stored and net.params["ip1"][0].data.dtype == stored
        assert net.blobs["norm"].data.dtype == np.float32 and net.blobs["loss"].data.dtype == np.float32
        losses = _train(solver, mnist_digits, 30)
        assert np.isfinite(losses).all(), losses
        assert np.mean(losses[-5:]) < 0.5 * losses[0], (gpu, losses)
        results[gpu] = float(np.mean(losses[-5:]))
        if gpu:
            assert solver.update.masters[0] is not None
            master, param = solver.update.masters[0].cpu_data(), net.learnable_params[0].math_data()
            want = caffe.Blob(master.shape, stored)
            want.set_math_data(master)
            np.testing.assert_array_equal(net.learnable_params[0].cpu_data(), want.cpu_data())
            assert np.abs(master - param).max() > 0  # the master keeps what the half param rounds away
            if graphs:
                assert net.executor.replays > 0
    assert abs(results[True] - results[False]) < 0.1, results


@pytest.mark.parametrize("graphs", [False, True])
def test_fixed_loss_scale_on_gpu_divides_out(graphs, mnist_digits, gpu_mode):
    """fp32 on the GPU with a power-of-two global_grad_scale trains to the weights of the
    unscaled run (the scale is exact in fp32), and the reported loss is unscaled."""
    plain = _solver("FLOAT", True, graphs, batch=16)
    scaled = _solver("FLOAT", True, graphs, batch=16, extra_net="global_grad_scale: 1024")
    a, b = _train(plain, mnist_digits, 6), _train(scaled, mnist_digits, 6)
    assert scaled.loss_scale == 1024
    np.testing.assert_allclose(b, a, rtol=1e-6)
    for pa, pb in zip(plain.net.learnable_params, scaled.net.learnable_params):
        np.testing.assert_allclose(pb.data, pa.data, rtol=1e-5, atol=1e-7)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("graphs", [False, True])
def test_adaptive_loss_scale_overflow_on_gpu(graphs, mnist_digits, gpu_mode, monkeypatch):
    """fp16 with an adaptive scale of 2^24 on the GPU: the first step's gradients overflow, so it is
    skipped on the device (weights and history unchanged) and the scale halves; halvings continue
    until the gradients fit; then GROWTH_INTERVAL clean steps double it. Replayed iterations do
    the same with no host read per step."""
    monkeypatch.setattr(Update, "GROWTH_INTERVAL", 4)
    solver = _solver("FLOAT16", True, graphs, batch=16,
                     extra_net=f"global_grad_scale: {2.0 ** 24} global_grad_scale_adaptive: true")
    solver.net.set_input_arrays(*mnist_digits)
    before = [p.cpu_data().copy() for p in solver.net.learnable_params]
    solver.step(1)
    assert solver.loss_scale == 2.0 ** 23
    for b, p in zip(before, solver.net.learnable_params):
        np.testing.assert_array_equal(p.cpu_data(), b)
    assert all(not h.cpu_data().any() for h in solver.history)
    scales = []
    for _ in range(30):
        solver.step(1)
        scales.append(solver.loss_scale)
    assert min(scales) < 2.0 ** 23, scales  # more halvings until the gradients fit
    assert any(b == 2 * a for a, b in zip(scales, scales[1:])), scales  # then growth after clean steps
    assert any((p.cpu_data() != b).any() for b, p in zip(before, solver.net.learnable_params))
    assert all(np.isfinite(p.math_data()).all() for p in solver.net.learnable_params)
    if graphs:
        assert solver.net.executor.replays > 0
