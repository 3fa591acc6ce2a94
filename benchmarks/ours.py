"""Our side of the benchmarks: the same workloads as ``peer_torch.py`` through pycaffe-lite."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

import pycaffe_lite as caffe
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer_testing import empty_blobs, make_layer
from pycaffe_lite.proto import caffe_pb2
from pycaffe_lite.protoio import read_text

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "mnist"


def _sync(gpu: bool) -> None:
    if gpu:
        backend.synchronize()


def _set_mode(gpu: bool) -> None:
    if gpu:
        caffe.set_mode_gpu()
    else:
        caffe.set_mode_cpu()


def lenet_train(train_x, train_y, test_x, test_y, iters: int, gpu: bool = True, seed: int = 1,
                workdir: str | None = None) -> dict:
    """Caffe's LeNet recipe from examples/mnist through LMDB + Data layers; returns it/s, accuracy."""
    from pycaffe_lite import get_solver, mnist

    _set_mode(gpu)
    work = Path(workdir or tempfile.mkdtemp(prefix="bench-lenet-"))
    train_db, test_db = work / "train_lmdb", work / "test_lmdb"
    if not train_db.exists():
        mnist.write_lmdb(train_x, train_y, train_db)
        mnist.write_lmdb(test_x, test_y, test_db)
    net = read_text(EXAMPLES / "lenet_train_test.prototxt", caffe_pb2.NetParameter())
    for layer in net.layer:
        if layer.type == "Data":
            is_train = any(r.phase == caffe_pb2.TRAIN for r in layer.include)
            layer.data_param.source = str(train_db if is_train else test_db)
    solver_param = read_text(EXAMPLES / "lenet_solver.prototxt", caffe_pb2.SolverParameter())
    solver_param.ClearField("net")
    solver_param.net_param.CopyFrom(net)
    solver_param.max_iter = iters
    solver_param.test_interval = iters + 1  # test once at the end, outside the timed loop
    solver_param.test_initialization = False
    solver_param.snapshot = 0
    solver_param.snapshot_after_train = False
    solver_param.display = 0
    solver_param.random_seed = seed
    solver_param.solver_mode = caffe_pb2.SolverParameter.GPU if gpu else caffe_pb2.SolverParameter.CPU
    solver = get_solver(solver_param)
    if hasattr(solver, "show_progress"):
        solver.show_progress = False
    solver.step(10)  # warm-up: kernels compiled, buffers allocated
    _sync(gpu)
    start = time.perf_counter()
    solver.step(iters - 10)
    _sync(gpu)
    wall = time.perf_counter() - start
    solver.param.test_iter[0] = int(np.ceil(len(test_y) / solver.test_nets[0].blobs["data"].shape[0]))
    accuracy = solver.test(0)["accuracy"][0]  # shares the trained weights first, as Caffe's Test
    return {"it_s": (iters - 10) / wall, "wall_s": wall, "accuracy": float(accuracy)}


def conv_fwd_bwd(n, c, h, w, k, ksize, pad, stride=1, reps=50, gpu=True, engine: str = "") -> dict:
    """Forward and backward (data, weight and bias gradients) of one Convolution layer, in ms."""
    _set_mode(gpu)
    eng = f"engine: {engine}" if engine else ""
    layer = make_layer(
        f'type: "Convolution" convolution_param {{ num_output: {k} kernel_size: {ksize} pad: {pad} '
        f'stride: {stride} weight_filler {{ type: "gaussian" std: 0.01 }} {eng} }}', np.float32)
    bottom = empty_blobs(1, np.float32)
    bottom[0].reshape(n, c, h, w)
    bottom[0].data[...] = np.random.default_rng(0).standard_normal((n, c, h, w))
    top = empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    top[0].diff[...] = 1.0
    fwd = lambda: layer.compute_forward(bottom, top)  # noqa: E731
    bwd = lambda: layer.backward(top, [True], bottom)  # noqa: E731
    out = {"fwd_ms": _time(fwd, reps, gpu), "bwd_ms": _time(bwd, reps, gpu)}
    if gpu:
        ch = layer.engine_choice()
        out["engines"] = f"fwd {ch.forward}, bwd data {ch.backward_data}, bwd weight {ch.backward_weight}"
    return out


def maxpool_fwd(n, c, h, w, k=3, stride=2, reps=50, gpu=True) -> dict:
    _set_mode(gpu)
    layer = make_layer(f'type: "Pooling" pooling_param {{ pool: MAX kernel_size: {k} stride: {stride} }}', np.float32)
    bottom = empty_blobs(1, np.float32)
    bottom[0].reshape(n, c, h, w)
    bottom[0].data[...] = np.random.default_rng(0).standard_normal((n, c, h, w))
    top = empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    ms = _time(lambda: layer.compute_forward(bottom, top), reps, gpu)
    nbytes = (bottom[0].count + top[0].count) * 4
    return {"ms": ms, "gb_s": nbytes / (ms * 1e-3) / 1e9}


def lenet_forward(batch: int, reps: int = 200, gpu: bool = True, sync_each: bool = False) -> dict:
    """Deploy LeNet (examples/mnist/lenet.prototxt) forward at ``batch`` images."""
    _set_mode(gpu)
    net = caffe.Net(str(EXAMPLES / "lenet.prototxt"), caffe.TEST)
    net.blobs["data"].reshape(batch, 1, 28, 28)
    net.blobs["data"].data[...] = np.random.default_rng(0).random((batch, 1, 28, 28))
    last = len(net.layers) - 1

    def run():
        net.forward_from_to(0, last)
        if sync_each:
            _sync(gpu)

    ms = _time(run, reps, gpu)
    return {"ms": ms, "images_s": batch / (ms * 1e-3)}


def _time(fn, reps: int, gpu: bool) -> float:
    for _ in range(max(3, reps // 10)):
        fn()
    _sync(gpu)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync(gpu)
    return (time.perf_counter() - start) * 1e3 / reps
