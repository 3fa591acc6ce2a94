"""The peer side of the benchmarks: PyTorch eager (cuDNN on the GPU), imported only when present.

Each function mirrors one workload of ``run_all.py`` and returns plain numbers, so the table can
put both frameworks side by side from one process on one device.
"""

from __future__ import annotations

import math
import time

import numpy as np
from timing import SPIN_CYCLES, device_median_ms, median_ms

ALLOW_TF32 = False  # run_all --tf32 sets it; both sides then allow TF32 GEMMs/convolutions


def available() -> str | None:
    """None when PyTorch can run the peer side, else the reason."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return f"PyTorch not installed ({exc})"
    return None


def _torch():
    """torch, with TF32 set as run_all asked (PyTorch allows TF32 convolutions by default)."""
    import torch

    torch.backends.cudnn.allow_tf32 = ALLOW_TF32
    torch.backends.cuda.matmul.allow_tf32 = ALLOW_TF32
    return torch


def lenet(torch, device):
    """Caffe's LeNet: conv20 k5, maxpool 2, conv50 k5, maxpool 2, ip500, relu, ip10."""
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5), nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10),
    ).to(device)
    for m in model:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in = m.weight[0].numel()
            bound = math.sqrt(3.0 / fan_in)  # Caffe's xavier (FAN_IN)
            nn.init.uniform_(m.weight, -bound, bound)
            nn.init.zeros_(m.bias)
    return model


def _sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def lenet_train(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                iters: int, device: str = "cuda", batch: int = 64, seed: int = 1) -> dict:
    """Caffe's recipe (SGD momentum 0.9, weight decay 5e-4, lr 0.01 'inv' gamma 1e-4 power 0.75)."""
    torch = _torch()
    torch.manual_seed(seed)
    dev = torch.device(device)
    torch.backends.cudnn.benchmark = True
    model = lenet(torch, dev)
    xs = torch.from_numpy(train_x.astype(np.float32) * 0.00390625).to(dev).reshape(-1, 1, 28, 28)
    ys = torch.from_numpy(train_y.astype(np.int64)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: (1 + 1e-4 * it) ** -0.75)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = xs.shape[0]
    _sync(torch, dev)
    start = time.perf_counter()
    for it in range(iters):
        lo = (it * batch) % n
        idx = slice(lo, lo + batch) if lo + batch <= n else torch.arange(lo, lo + batch, device=dev) % n
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xs[idx]), ys[idx])
        loss.backward()
        opt.step()
        sched.step()
    _sync(torch, dev)
    wall = time.perf_counter() - start
    with torch.no_grad():
        tx = torch.from_numpy(test_x.astype(np.float32) * 0.00390625).to(dev).reshape(-1, 1, 28, 28)
        pred = torch.cat([model(tx[i:i + 1000]).argmax(1) for i in range(0, tx.shape[0], 1000)])
        acc = float((pred.cpu().numpy() == test_y).mean())
    return {"it_s": iters / wall, "wall_s": wall, "accuracy": acc}


def conv_fwd_bwd(n: int, c: int, h: int, w: int, k: int, ksize: int, pad: int, stride: int = 1,
                 reps: int = 50, device: str = "cuda") -> dict:
    """Forward and backward (data + weight + bias grads) times of one convolution, in ms."""
    torch = _torch()
    dev = torch.device(device)
    torch.backends.cudnn.benchmark = True
    conv = torch.nn.Conv2d(c, k, ksize, stride=stride, padding=pad).to(dev)
    x = torch.randn(n, c, h, w, device=dev, requires_grad=True)
    y = conv(x)
    gy = torch.randn_like(y)

    def fwd():
        with torch.no_grad():
            conv(x)

    def fwdbwd():
        out = conv(x)
        out.backward(gy)

    t_fwd = _time_cuda(torch, fwd, reps)
    t_both = _time_cuda(torch, fwdbwd, reps)
    return {"fwd_ms": t_fwd, "bwd_ms": max(t_both - t_fwd, 0.0)}


def cuda_median_ms(torch, step, reps: int) -> float:
    """Median device ms of ``step`` (:func:`timing.device_median_ms`: CUDA events around it, queued
    behind a spin kernel so launch costs stay hidden; 3 warm-up runs)."""

    def record():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed(start, end) -> float:
        end.synchronize()
        return start.elapsed_time(end)

    return device_median_ms(step, lambda: torch.cuda._sleep(SPIN_CYCLES), record, elapsed, reps, 3)


def conv_layer_ms(n: int, c: int, h: int, w: int, k: int, kernel: tuple[int, int], pad: tuple[int, int],
                  stride: tuple[int, int], dilation: tuple[int, int], group: int, bias: bool, backward: bool,
                  reps: int = 10, device_time: bool = True) -> dict:
    """One convolution through cuDNN: median ms of the forward (``F.conv2d`` under no_grad) and, with
    ``backward``, of the backward (``aten.convolution_backward``, what autograd calls: data, weight
    and, with ``bias``, bias gradients). ``device_time``: :func:`timing.device_median_ms` (CUDA
    events behind a spin kernel); else :func:`timing.median_ms` (wall time between synchronizations)."""
    torch = _torch()
    torch.backends.cudnn.benchmark = True
    torch.cuda.empty_cache()  # earlier shapes' operands (as ours.conv_engine_ms)
    dev = torch.device("cuda")
    F = torch.nn.functional
    x = torch.randn(n, c, h, w, device=dev)
    wt = torch.randn(k, c // group, *kernel, device=dev) * 0.01
    b = torch.zeros(k, device=dev) if bias else None
    with torch.no_grad():
        gy = torch.randn_like(F.conv2d(x, wt, b, stride, pad, dilation, group))

    def fwd():
        with torch.no_grad():
            F.conv2d(x, wt, b, stride, pad, dilation, group)

    def bwd():
        torch.ops.aten.convolution_backward(gy, x, wt, [k] if bias else None, stride, pad, dilation, False,
                                            [0, 0], group, [True, True, bias])

    def timed(step) -> float:
        if device_time:
            return cuda_median_ms(torch, step, reps)
        return median_ms(step, torch.cuda.synchronize, reps, 3)

    return {"fwd_ms": timed(fwd), "bwd_ms": timed(bwd) if backward else 0.0}


def maxpool_fwd(n: int, c: int, h: int, w: int, k: int = 3, stride: int = 2, reps: int = 50,
                device: str = "cuda") -> dict:
    """Max-pooling forward time and effective bandwidth (bytes read + written / time)."""
    torch = _torch()
    dev = torch.device(device)
    x = torch.randn(n, c, h, w, device=dev)
    pool = torch.nn.MaxPool2d(k, stride, ceil_mode=True)
    y = pool(x)

    def run():
        pool(x)

    ms = _time_cuda(torch, run, reps)
    nbytes = (x.numel() + y.numel()) * 4
    return {"ms": ms, "gb_s": nbytes / (ms * 1e-3) / 1e9}


def lenet_forward(batch: int, reps: int = 200, device: str = "cuda", sync_each: bool = False) -> dict:
    """Inference time of LeNet (deploy net with softmax) at ``batch`` images."""
    torch = _torch()
    dev = torch.device(device)
    torch.backends.cudnn.benchmark = True
    model = torch.nn.Sequential(lenet(torch, dev), torch.nn.Softmax(dim=1)).eval()
    x = torch.randn(batch, 1, 28, 28, device=dev)

    def run():
        with torch.no_grad():
            model(x)
        if sync_each:
            torch.cuda.synchronize()

    ms = _time_cuda(torch, run, reps)
    return {"ms": ms, "images_s": batch / (ms * 1e-3)}


def _time_cuda(torch, fn, reps: int) -> float:
    """Mean milliseconds per call, after warm-up, timed by wall clock around synchronizations."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(max(3, reps // 10)):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - start) * 1e3 / reps


# -- model zoo (benchmarks/zoo.py) ----------------------------------------------------------------
def torchvision_available() -> str | None:
    """None when torch and torchvision can run the zoo's peer side, else the reason."""
    reason = available()
    if reason:
        return reason
    try:
        import torchvision  # noqa: F401
    except ImportError as exc:
        return f"torchvision not installed ({exc})"
    return None


#: Mixed precision per ``--precision`` name: (autocast dtype name or None, TF32 allowed or None:
#: as ALLOW_TF32 says). fp16 also scales the loss with ``torch.amp.GradScaler`` where it updates.
PRECISIONS = {"fp32": (None, False), "tf32": (None, True), "fp16": ("float16", None), "bf16": ("bfloat16", None)}
#: The SGD of the ``update`` drive (ours.SGD is the same): rate, momentum, weight decay.
SGD_ARGS = {"lr": 1e-3, "momentum": 0.9, "weight_decay": 1e-4}


def _autocast(torch, dev, precision: str | None):
    """``torch.autocast`` for ``precision`` (fp16 / bf16) on ``dev``'s type, else a no-op context."""
    import contextlib

    dtype = PRECISIONS[precision][0] if precision else None
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=dev.type, dtype=getattr(torch, dtype))


def zoo_net(arch: str, kwargs: dict, size: int, batch: int, iters: int, warmup: int, latency_iters: int,
            device: str = "cuda", drive: str = "solver", precision: str | None = None) -> dict:
    """torchvision ``arch(weights=None, **kwargs)``: median ms of an iteration at ``batch``
    (:func:`zoo_step`), the caching allocator's peak reserved and allocated bytes and the device
    memory taken since the context was created (cuMemGetInfo), then the median batch-1 forward
    latency (eval mode, inference_mode, with a softmax as our deploy nets) eager and, on CUDA, as a
    CUDA-graph replay (``latency_graph_ms``: the eval-mode forward captured once after warm-up into
    a ``torch.cuda.CUDAGraph`` with a static input, then replayed). ``precision`` (fp32, tf32,
    fp16, bf16; None: as before, NCHW and ALLOW_TF32): ``channels_last`` model and inputs, TF32 as
    the name says, and fp16/bf16 under ``torch.autocast`` (the graph replay captured under it too)."""
    torch = _torch()
    import torchvision

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    step, check, model = zoo_step(arch, kwargs, size, batch, device, drive, precision)
    out = {"train_ms": median_ms(step, sync, iters, warmup), **check()}
    model.eval()
    x1 = torch.randn(1, 3, size, size, device=dev)
    if precision:
        x1 = x1.contiguous(memory_format=torch.channels_last)

    def forward():
        with torch.inference_mode(), _autocast(torch, dev, precision):
            torch.softmax(model(x1), dim=1)

    out["latency_ms"] = median_ms(forward, sync, latency_iters, max(3, warmup))
    if cuda:
        out["latency_graph_ms"] = median_ms(_graph_forward(torch, model, x1, precision), sync, latency_iters,
                                            max(3, warmup))
    out["device"] = torch.cuda.get_device_name(dev) if cuda else "CPU"
    out["version"] = f"PyTorch {torch.__version__}, torchvision {torchvision.__version__}"
    out["precision"] = precision or ("tf32" if ALLOW_TF32 else "fp32")
    return out


def _step_function(torch, model, x, y, box: dict, dev, drive: str, precision: str | None):
    """The timed step of :func:`zoo_step`'s ``drive`` (it leaves the loss, or the output's sum, in
    ``box["loss"]``)."""
    loss_fn = torch.nn.CrossEntropyLoss()
    batch = x.shape[0]

    def autocast():
        return _autocast(torch, dev, precision)

    def train_step():
        model.zero_grad(set_to_none=True)
        x.grad = None
        with autocast():
            loss = loss_fn(model(x), y)
        loss.backward()
        box["loss"] = loss.detach()

    if drive == "update":
        opt = torch.optim.SGD(model.parameters(), **SGD_ARGS)
        scaler = torch.amp.GradScaler(dev.type, enabled=precision == "fp16")

        def train_step():  # noqa: F811
            opt.zero_grad(set_to_none=True)
            x.grad = None
            with autocast():
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            box["loss"] = loss.detach()

    if drive == "pycaffe":
        gy = torch.randn(batch, 1000, device=dev)

        def train_step():  # noqa: F811
            model.zero_grad(set_to_none=True)
            x.grad = None
            with autocast():
                prob = torch.softmax(model(x), dim=1)
            prob.backward(gy.to(prob.dtype))
            box["loss"] = prob.detach().float().sum()

    if drive == "forward":

        def train_step():  # noqa: F811
            with torch.inference_mode(), autocast():
                box["loss"] = torch.softmax(model(x), dim=1).float().sum()

    return train_step


def zoo_step(arch: str, kwargs: dict, size: int, batch: int, device: str = "cuda", drive: str = "solver",
             precision: str | None = None):
    """(step, check, model) for torchvision ``arch`` at ``batch``: ``step()`` runs one iteration,
    ``check()`` raises if its results are not finite and returns the loss, parameter count and
    (CUDA) memory figures. ``drive="solver"``: a training iteration (zero_grad(set_to_none),
    forward, cross-entropy, backward to every weight and the input; train mode);
    ``drive="update"``: the same plus ``torch.optim.SGD`` (:data:`SGD_ARGS`) stepping, through
    ``torch.amp.GradScaler`` for fp16 (``scaler.scale(loss).backward(); scaler.step(opt);
    scaler.update()``: AMP's recipe); ``drive="pycaffe"``: eval mode, forward to the softmax and
    backward of a fixed output gradient to every weight and the input (``requires_grad`` input), as
    our TEST net with ``force_backward`` driven by ``net.forward(); net.backward()``;
    ``drive="forward"``: eval mode, ``inference_mode`` forward to the softmax (eager).
    ``precision``: see :func:`zoo_net`."""
    if drive not in ("solver", "pycaffe", "forward", "update"):
        raise ValueError(f"zoo_step: drive must be solver, update, pycaffe or forward, got {drive!r}")
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"zoo_step: precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    torch = _torch()
    import torchvision

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    torch.backends.cudnn.benchmark = True
    if precision is not None and PRECISIONS[precision][1] is not None:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = PRECISIONS[precision][1]
    free_at_init = 0
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device=dev)  # context first: the device baseline counts from here
        free_at_init = torch.cuda.mem_get_info()[0]
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(weights=None, **kwargs).to(dev)
    model.train(drive in ("solver", "update"))
    x = torch.randn(batch, 3, size, size, device=dev)
    if precision is not None:  # AMP's layout
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(drive != "forward")
    y = torch.randint(0, 1000, (batch,), device=dev)
    box: dict = {}

    train_step = _step_function(torch, model, x, y, box, dev, drive, precision)

    def check() -> dict:
        loss = float(box["loss"])
        # (fp16 with GradScaler: the input's gradient is the scaled one, inf in a step the scaler skips)
        scaled = drive == "update" and precision == "fp16"
        grad_ok = drive == "forward" or (x.grad is not None and (scaled or bool(torch.isfinite(x.grad).all())))
        if not math.isfinite(loss) or not grad_ok:
            raise RuntimeError(f"torchvision {arch}: training step is broken (loss {loss})")
        out: dict = {"loss": loss, "params": sum(p.numel() for p in model.parameters())}
        if cuda:
            out["memory"] = {
                "reserved": int(torch.cuda.max_memory_reserved()),
                "allocated": int(torch.cuda.max_memory_allocated()),
                "device": int(free_at_init - torch.cuda.mem_get_info()[0]),
            }
        return out

    return train_step, check, model


def _graph_forward(torch, model, x_static, precision: str | None = None):
    """``model``'s eval-mode forward + softmax on the static input ``x_static`` captured into a
    CUDA graph (after warm-up forwards on a side stream, as PyTorch's capture recipe asks, so that
    cuDNN's benchmark search and lazy allocations happen before the capture); returns the replay.
    fp16 / bf16: warm-up and capture under ``torch.autocast`` (its weight casts are captured too;
    ``cache_enabled=False`` keeps autocast's cast cache out of the capture, as PyTorch's notes ask)."""
    dev = x_static.device

    def autocast():
        import contextlib

        dtype = PRECISIONS[precision][0] if precision else None
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=dev.type, dtype=getattr(torch, dtype), cache_enabled=False)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad(), autocast():
        for _ in range(3):
            torch.softmax(model(x_static), dim=1)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph), autocast():
        static_out = torch.softmax(model(x_static), dim=1)
    graph.replay()
    torch.cuda.synchronize()
    if not bool(torch.isfinite(static_out).all()):
        raise RuntimeError("CUDA-graph replay gives non-finite outputs")
    return graph.replay
