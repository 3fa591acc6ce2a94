"""Our side of the benchmarks: the same workloads as ``peer_torch.py`` through pycaffe-lite."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from timing import SPIN_CYCLES, device_median_ms, median_ms

import pycaffe_lite as caffe
from pycaffe_lite.blob import Blob
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.gpu import backend
from pycaffe_lite.net import load_net_param
from pycaffe_lite.proto.protoio import read_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer

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
    from pycaffe_lite import get_solver
    from pycaffe_lite.data import mnist

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


def device_ms(step, reps: int = 10) -> float:
    """Median device time of ``step`` in ms (:func:`timing.device_median_ms`: CUDA events around each
    call, queued behind a spin kernel so its kernels run back to back); 3 warm-up calls."""
    cuda = backend.state().cuda
    spin = backend.elementwise("bench_spin", "const long long cycles",
                               "const long long t0 = clock64(); while (clock64() - t0 < cycles) { }", np.float32)

    def record():
        event = cuda.Event()
        event.record(backend.stream())
        return event

    def elapsed(start, end) -> float:
        end.synchronize()
        return end.time_since(start)

    return device_median_ms(step, lambda: spin(1, SPIN_CYCLES), record, elapsed, reps, 3)


def conv_engine_ms(prob: ConvProblem, bias: bool, candidates: tuple[str, ...], backward: bool, reps: int = 10,
                   device_time: bool = True) -> dict:
    """One convolution through our engines, as the Convolution layer runs it: the engine per pass
    that ``conv_engines.choose`` picks among ``candidates`` (autotuned, or the one engine forced),
    the median ms of the forward and, with ``backward``, of the backward (weight and, with ``bias``,
    bias gradients, then the data gradient). ``device_time``: :func:`timing.device_median_ms` (CUDA
    events behind a spin kernel); else :func:`timing.median_ms` (wall time between synchronizations)."""
    from pycaffe_lite.conv import engines as conv_engines
    from pycaffe_lite.gpu import math_functions as gm

    caffe.set_mode_gpu()
    backend.state().pool.free_held()  # earlier shapes' operands: the pool would keep one set per size
    if device_time:  # tuned as our nets tune (their graphs replay the passes), measured the same way
        with conv_engines.graph_timing():
            choice = conv_engines.choose(prob, bias, candidates)
    else:
        choice = conv_engines.choose(prob, bias, candidates)
    dt = prob.np_dtype
    blobs = [Blob(shape, dt) for shape in ((prob.num, prob.channels, prob.height, prob.width),
                                           (prob.num, prob.num_output, *prob.out_hw),
                                           (prob.num_output, prob.cg, *prob.kernel), (prob.num_output,))]
    (x, dx), (y, dy), (w, dw), (b, db) = ((bl.mutable_gpu_data(), bl.mutable_gpu_diff()) for bl in blobs)
    for bl, ptr, dptr in zip(blobs, (x, dy, w, b), (dx, y, dw, db)):
        gm.set(bl.count, 0.5, ptr, dt)
        gm.set(bl.count, 0.0, dptr, dt)  # (the weight pass accumulates into dw, db)
    b, db = (b, db) if bias else (None, None)

    def fwd():
        conv_engines.run(prob, choice, "forward", x, w, b, y)

    def bwd():
        conv_engines.run(prob, choice, "backward_weight", x, dy, dw, db)
        conv_engines.run(prob, choice, "backward_data", w, dy, dx)

    def timed(step) -> float:
        return device_ms(step, reps) if device_time else median_ms(step, backend.synchronize, reps, 3)

    out = {"fwd_ms": timed(fwd), "bwd_ms": timed(bwd) if backward else 0.0}
    out["engines"] = f"fwd {choice.forward}, bwd data {choice.backward_data}, bwd weight {choice.backward_weight}"
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


# -- model zoo (benchmarks/zoo.py) ----------------------------------------------------------------
def zoo_param(deploy: str | os.PathLike, batch: int, train: bool) -> caffe_pb2.NetParameter:
    """A model-zoo deploy net at ``batch`` images. ``train``: a training variant: a ``label``
    Input top (batch,), the final Softmax replaced by SoftmaxWithLoss on its logits (appended
    when the net ends elsewhere), BatchNorm on batch statistics (``use_global_stats`` cleared, as
    the peer's train mode), ``force_backward`` so the data gradient is computed too."""
    param = load_net_param(deploy)  # legacy net-level input fields become an Input layer
    first = param.layer[0]
    if first.type != "Input" or len(first.input_param.shape) != 1:
        raise ValueError(f"{deploy}: expected a leading Input layer with one shape, got {first.type}")
    first.input_param.shape[0].dim[0] = batch
    if not train:
        return param
    first.top.append("label")
    first.input_param.shape.add().dim.append(batch)
    last = param.layer[-1]
    if last.type == "Softmax":
        logits = last.bottom[0]
        del param.layer[-1]
    else:
        logits = last.top[0]
    loss = param.layer.add(name="loss", type="SoftmaxWithLoss", top=["loss"])
    loss.bottom.extend([logits, "label"])
    for lp in param.layer:
        if lp.type == "BatchNorm":
            lp.batch_norm_param.ClearField("use_global_stats")
    param.force_backward = True
    return param


def randomize_params(net, seed: int = 0) -> None:
    """He-normal weights (fan-in = count / leading dim), zero biases and Scale betas, Scale gamma
    1, BatchNorm statistics mean 0, variance 1, factor 1: every zoo net then stays finite. Values
    are stored rounded into half params (``Blob.set_math_data``: bfloat16 ones hold bit patterns)."""
    rng = np.random.default_rng(seed)
    for name, blobs in net.params.items():
        ltype = net.layer_dict[name].type
        for j, blob in enumerate(blobs):
            if ltype == "BatchNorm":
                blob.set_math_data(np.float32(0.0 if j == 0 else 1.0))
            elif len(blob.shape) >= 2:
                fan_in = blob.count // blob.shape[0]
                blob.set_math_data(rng.standard_normal(blob.shape, dtype=np.float32) * np.sqrt(2.0 / fan_in))
            else:
                blob.set_math_data(np.float32(1.0 if (ltype == "Scale" and j == 0) else 0.0))


def zoo_net(deploy: str | os.PathLike, batch: int, iters: int, warmup: int, latency_iters: int,
            gpu: bool = True, tf32: bool = False, drive: str = "solver", precision: str | None = None) -> dict:
    """One zoo net: median ms of an iteration at ``batch`` (:func:`zoo_step`) and the peak device
    memory of that net (GPU: :func:`backend.memory_held`, measured before the latency net exists),
    then the median batch-1 forward latency of the deploy net (TEST phase), both nets built in
    ``precision`` (``caffe.set_precision``; None: the file's own types, TF32 as ``tf32`` says)."""
    sync = backend.synchronize if gpu else (lambda: None)
    step, check = zoo_step(deploy, batch, gpu, tf32, drive, precision)
    out = {"train_ms": median_ms(step, sync, iters, warmup), **check()}
    test = caffe.Net(zoo_param(deploy, 1, train=False), caffe.TEST)
    randomize_params(test)
    data = test.blobs["data"]
    data.data[...] = np.random.default_rng(2).standard_normal(data.shape, dtype=np.float32)
    out["latency_ms"] = median_ms(test.forward_prefilled, sync, latency_iters, max(3, warmup))
    if not np.isfinite(test.blobs[test.outputs[0]].math_data()).all():
        raise RuntimeError(f"{deploy}: batch-1 forward gives non-finite outputs")
    out["device"] = backend.device_name() if gpu else "CPU"
    out["precision"] = caffe.get_precision() or ("tf32" if tf32 else "fp32")
    return out


DRIVES = ("solver", "pycaffe", "forward", "update")


def zoo_step(deploy: str | os.PathLike, batch: int, gpu: bool = True, tf32: bool = False,
             drive: str = "solver", precision: str | None = None) -> tuple[Callable[[], None], Callable[[], dict]]:
    """(step, check) for one zoo net at ``batch``: ``step()`` runs one iteration, ``check()``
    (after some steps) raises if the results are not finite and returns the loss, parameter count
    and (GPU) memory figures. ``drive="solver"``: a training iteration (clear param diffs, forward,
    loss, backward to every weight and the data; TRAIN phase; the Solver's iteration path);
    ``drive="update"``: the same with the update, a whole ``SGDSolver.step(1)`` (SGD, momentum
    0.9, weight decay 1e-4, rate 1e-3 fixed; half nets: float32 master weights, fp16 with its
    adaptive loss scale); ``drive="pycaffe"``: the deploy net in TEST phase with ``force_backward``,
    driven as pycaffe scripts drive it: ``net.forward(); net.backward()`` with a fixed gradient on
    the output blob (param diffs accumulate, as in pycaffe); ``drive="forward"``: the deploy net in
    TEST phase, ``net.forward()`` only. ``precision``: ``caffe.set_precision`` before the nets are
    built (fp32, tf32, fp16, bf16; None leaves the files' types and TF32 as ``tf32`` says)."""
    _set_mode(gpu)
    if gpu:
        backend.state()  # context first: memory_held() counts from here
        caffe.set_allow_tf32(tf32)
    if precision is not None:
        caffe.set_precision(precision)
    if drive == "solver":
        return _zoo_train(deploy, batch, gpu)
    if drive == "update":
        return _zoo_update(deploy, batch, gpu)
    if drive == "pycaffe":
        return _zoo_pycaffe(deploy, batch, gpu)
    if drive == "forward":
        return _zoo_forward(deploy, batch, gpu)
    raise ValueError(f"zoo_step: drive must be one of {', '.join(DRIVES)}, got {drive!r}")


#: The SGD both sides' ``update`` drive runs (peer_torch.SGD_ARGS is the same).
SGD = {"base_lr": 1e-3, "momentum": 0.9, "weight_decay": 1e-4}


def _zoo_update(deploy, batch: int, gpu: bool):
    """A whole solver iteration (forward, backward, update) of the training variant, as
    ``SGDSolver.step(1)`` runs it (replayed as one CUDA graph where the executor can)."""
    sp = caffe_pb2.SolverParameter()
    sp.net_param.CopyFrom(zoo_param(deploy, batch, train=True))
    sp.base_lr, sp.momentum, sp.weight_decay = SGD["base_lr"], SGD["momentum"], SGD["weight_decay"]
    sp.lr_policy, sp.max_iter, sp.display, sp.snapshot = "fixed", 1 << 30, 0, 0
    sp.snapshot_after_train = False
    sp.random_seed = 1
    sp.solver_mode = caffe_pb2.SolverParameter.GPU if gpu else caffe_pb2.SolverParameter.CPU
    solver = caffe.get_solver(sp, progress=False)
    net = solver.net
    randomize_params(net)
    rng = np.random.default_rng(1)
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape, dtype=np.float32)
    net.blobs["label"].data[...] = rng.integers(0, 1000, batch)

    def step():
        solver.step(1)

    def check() -> dict:
        loss = float(net.blobs["loss"].data)
        grad = net.blobs["data"].math_diff()
        if not np.isfinite(loss) or not np.isfinite(grad).all():
            raise RuntimeError(f"{deploy}: solver step is broken (loss {loss}, data gradient finite "
                               f"{bool(np.isfinite(grad).all())})")
        out = {"loss": loss, "params": sum(b.count for b, lr in zip(net.learnable_params, net.params_lr) if lr),
               "loss_scale": float(solver.update.loss_scale)}
        if gpu:
            out["memory"] = backend.memory_held()
            out["graph_replays"] = net.executor.replays
        return out

    return step, check


def _zoo_forward(deploy, batch: int, gpu: bool):
    """The deploy net at ``batch`` in TEST phase, forward only (``net.forward()``)."""
    net = caffe.Net(zoo_param(deploy, batch, train=False), caffe.TEST)
    randomize_params(net)
    net.blobs["data"].data[...] = np.random.default_rng(1).standard_normal(net.blobs["data"].shape, dtype=np.float32)
    top = net.blobs[net.outputs[0]]

    def step():
        net.forward()

    def check() -> dict:
        if not np.isfinite(top.math_data()).all():
            raise RuntimeError(f"{deploy}: forward gives non-finite outputs")
        out: dict = {"params": sum(b.count for b in net.learnable_params)}
        if gpu:
            out["memory"] = backend.memory_held()
            out["graph_replays"] = net.executor.replays
        return out

    return step, check


def _zoo_train(deploy, batch: int, gpu: bool):
    net = caffe.Net(zoo_param(deploy, batch, train=True), caffe.TRAIN)
    randomize_params(net)
    rng = np.random.default_rng(1)
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape, dtype=np.float32)
    net.blobs["label"].data[...] = rng.integers(0, 1000, batch)

    def train_step():
        net.clear_param_diffs()
        net.forward_backward()

    executor = net.executor
    if gpu and executor.can_replay_iteration():  # the solver's iteration path, without an update

        def train_step():  # noqa: F811
            executor.train_iteration(lambda: None, "zoo")
            assert executor.loss_log is not None
            executor.loss_log.read()

    def check() -> dict:
        loss = float(net.blobs["loss"].data)
        grad = net.blobs["data"].math_diff()
        if not np.isfinite(loss) or not np.isfinite(grad).all() or not grad.any():
            raise RuntimeError(f"{deploy}: training step is broken (loss {loss}, data gradient finite "
                               f"{bool(np.isfinite(grad).all())}, nonzero {bool(grad.any())})")
        out = {"loss": loss, "params": sum(b.count for b, lr in zip(net.learnable_params, net.params_lr) if lr)}
        if gpu:
            out["memory"] = backend.memory_held()
            out["graph_replays"] = net.executor.replays
        return out

    return train_step, check


def _zoo_pycaffe(deploy, batch: int, gpu: bool):
    param = zoo_param(deploy, batch, train=False)
    param.force_backward = True
    net = caffe.Net(param, caffe.TEST)
    randomize_params(net)
    rng = np.random.default_rng(1)
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape, dtype=np.float32)
    top = net.blobs[net.outputs[0]]
    top.diff = rng.standard_normal(top.shape, dtype=np.float32)  # (stored rounded in a half net)

    def step():
        net.forward()
        net.backward()

    def check() -> dict:
        grad = net.blobs["data"].math_diff()
        finite = bool(np.isfinite(top.math_data()).all())
        if not finite or not np.isfinite(grad).all() or not grad.any():
            raise RuntimeError(f"{deploy}: pycaffe forward/backward is broken (output finite "
                               f"{finite}, data gradient finite "
                               f"{bool(np.isfinite(grad).all())}, nonzero {bool(grad.any())})")
        out: dict = {"params": sum(b.count for b, lr in zip(net.learnable_params, net.params_lr) if lr)}
        if gpu:
            out["memory"] = backend.memory_held()
            out["graph_replays"] = net.executor.replays
        return out

    return step, check
