"""``pycaffe-lite time --model M [--iterations K] [--gpu N] [--phase TRAIN|TEST] [--precision P]``: benchmark.

As ``caffe time``: one warm-up forward/backward, then K timed iterations of every layer's forward
and (where the net needs it) backward. Prints the average time per layer and for the whole net,
then how much of the layer time went to Convolution/Deconvolution layers, and in GPU mode the
device memory the process holds (:func:`pycaffe_lite.gpu.backend.memory_held`: everything taken
since the CUDA context was created, our memory pool included; the pool keeps freed blocks, so it is
the peak). GPU work is synchronized before and after each timed call, so the times are device
times, not launch times.

Convolution, Deconvolution and InnerProduct lines also get achieved TFLOP/s and GB/s
(:func:`conv_cost`). FLOPs are 2 x the multiply-adds of the dense (im2col-GEMM) convolution,
padded taps included, bias excluded; backward counts the weight gradient and each propagated input
gradient, each costing as much as the forward. Bandwidth-bound layers (those whose
``Traits.backward_reads`` is declared: BatchNorm, Scale, Eltwise, the element-wise neurons, Concat,
Pooling, Softmax, LRN, Dropout, losses, ...) get GB/s (:func:`layer_bytes`). Bytes are the compulsory
traffic, each blob touched once: forward reads bottoms (and weights, bias, other params) and writes
tops; backward reads top diffs plus the data it needs (bottom data for the weight gradient,
weights for input gradients; ``Layer.backward_reads()`` for the other layers), writes propagated
bottom diffs, and reads and writes the accumulated param diffs (counted twice). That is a lower
bound, not what the kernels move.

Data layers with ``data_stats()`` (``Data``) add their images/s over their forward time and how
long each forward waited for its batch (the readers running behind the net show as waiting).
``--precision fp32|tf32|fp16|bf16`` times the net built in that precision (docs/precision.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Sequence
from typing import NamedTuple

from .. import common
from ..errors import PrototxtError
from ..gpu import backend
from ..net import Net
from . import (
    add_gpu_argument,
    add_net_state_arguments,
    add_precision_argument,
    flag,
    parse_gpu,
    stages,
    use_device,
    use_precision,
)

NAME = "time"
HELP = "benchmark the forward and backward time of a model, per layer"

CONV_TYPES = ("Convolution", "Deconvolution")
GEMM_TYPES = (*CONV_TYPES, "InnerProduct")  # layers with a FLOP count (conv_cost)

SHARING_FORWARD = ("Split",)  # forward shares the bottom's data with the tops: no traffic

log = logging.getLogger("pycaffe_lite")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flag(parser, "model", required=True, metavar="NET.prototxt", help="the net definition")
    flag(parser, "iterations", type=int, default=50, help="timed iterations (default 50)")
    flag(parser, "phase", choices=("TRAIN", "TEST"), default="TRAIN", type=str.upper,
         help="net phase (default TRAIN)")
    add_gpu_argument(parser)
    add_net_state_arguments(parser)
    add_precision_argument(parser)


class ConvCost(NamedTuple):
    """Work of one forward and one backward call of a (de)convolution layer."""

    fwd_flops: float
    bwd_flops: float
    fwd_bytes: float
    bwd_bytes: float


def conv_macs(layer_type: str, weight_shape: Sequence[int], bottom_count: int, top_count: int) -> int:
    """Multiply-adds of one bottom -> top (de)convolution, shapes in Caffe's layout.

    Convolution weights are (num_output, C/G, kh, kw): each top element sums C/G·kh·kw products.
    Deconvolution (the convolution's backward-data) stores (C, num_output/G, kh, kw): each bottom
    element is scattered with num_output/G·kh·kw products. Either way it is the count of the blob
    on the weight's leading-axis side times the weight's remaining extent. InnerProduct takes
    ``(num_output, K)`` (whatever its ``transpose``): each top element sums K products.
    """
    per = 1
    for d in weight_shape[1:]:
        per *= int(d)
    if layer_type in ("Convolution", "InnerProduct"):
        return int(top_count) * per
    if layer_type == "Deconvolution":
        return int(bottom_count) * per
    raise ValueError(f"conv_macs: layer type must be one of {GEMM_TYPES}, got '{layer_type}'")


def conv_cost(layer, bottom: Sequence, top: Sequence,
              propagate_down: Sequence[bool] | None = None) -> ConvCost | None:
    """FLOPs and compulsory bytes of ``layer`` (None unless a Convolution/Deconvolution/InnerProduct).

    ``bottom``/``top`` are the layer's blob vectors (pairs sharing the weights);
    ``propagate_down[i]`` says whether bottom i's diff is computed (default: all), the layer's
    ``param_propagate_down`` whether the weight/bias diffs are. See the module docstring.
    """
    if getattr(layer, "type", None) not in GEMM_TYPES or not layer.blobs or not top:
        return None
    if propagate_down is None:
        propagate_down = [True] * len(bottom)
    params = list(getattr(layer, "param_propagate_down", None) or [True] * len(layer.blobs))
    params += [False] * (len(layer.blobs) - len(params))
    weight = layer.blobs[0]
    bias = layer.blobs[1] if len(layer.blobs) > 1 else None
    need_w = bool(params[0])
    need_b = bias is not None and bool(params[1])
    need_x = [bool(p) for p in propagate_down]
    item = weight.dtype.itemsize

    shape = weight.shape
    if layer.type == "InnerProduct":
        num_output = int(layer.layer_param.inner_product_param.num_output)
        shape = (num_output, weight.count // num_output)
    macs = [conv_macs(layer.type, shape, b.count, t.count) for b, t in zip(bottom, top)]
    fwd_flops = 2.0 * sum(macs)
    bwd_flops = 2.0 * sum(m * (int(need_w) + int(x)) for m, x in zip(macs, need_x))

    fwd_elems = sum(b.count for b in bottom) + weight.count + sum(t.count for t in top)
    fwd_elems += bias.count if bias is not None else 0
    bwd_elems = 0
    if need_w or need_b or any(need_x):
        bwd_elems += sum(t.count for t in top)  # top diffs
    if need_w:
        bwd_elems += sum(b.count for b in bottom) + 2 * weight.count  # bottom data, weight diff r+w
    if any(need_x):
        bwd_elems += weight.count + sum(b.count for b, x in zip(bottom, need_x) if x)
    if need_b and bias is not None:
        bwd_elems += 2 * bias.count
    return ConvCost(fwd_flops, bwd_flops, float(fwd_elems * item), float(bwd_elems * item))


def layer_bytes(layer, bottom: Sequence, top: Sequence,
                propagate_down: Sequence[bool] | None = None) -> tuple[float, float] | None:
    """Compulsory (forward, backward) bytes of a bandwidth-bound layer (one that declares what its
    backward reads: ``Layer.backward_reads()``), None for other layers. Forward: bottoms and params read, tops written
    (nothing for :data:`SHARING_FORWARD` types). Backward: top diffs and the data ``backward_reads()`` names read, the diffs of the bottoms with ``propagate_down[i]`` (default all) written, params
    read when any bottom diff is computed, param diffs (``param_propagate_down``) read and written.
    """
    reads = layer.backward_reads() if hasattr(layer, "backward_reads") else None
    if reads is None:
        return None
    if propagate_down is None:
        propagate_down = [True] * len(bottom)
    item = layer.dtype.itemsize
    n_bottom = sum(b.count for b in bottom)
    n_top = sum(t.count for t in top)
    n_param = sum(b.count for b in layer.blobs)
    fwd = 0 if layer.type in SHARING_FORWARD else n_bottom + n_top + n_param
    bwd = n_top + n_bottom * ("bottom" in reads) + n_top * ("top" in reads)
    bwd += sum(b.count for b, p in zip(bottom, propagate_down) if p)
    bwd += n_param if any(propagate_down) else 0
    params = list(getattr(layer, "param_propagate_down", None) or [])
    bwd += 2 * sum(b.count for b, p in zip(layer.blobs, params) if p)
    return float(fwd * item), float(bwd * item)


def _num(x: float) -> str:
    """Three significant digits, without exponent notation for values >= 100."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def rate_suffix(flops: float, nbytes: float, seconds: float) -> str:
    """`` (x TFLOP/s, y GB/s)`` for work done in ``seconds``; empty when nothing to report."""
    if flops <= 0 or seconds <= 0:
        return ""
    return f" ({_num(flops / seconds / 1e12)} TFLOP/s, {_num(nbytes / seconds / 1e9)} GB/s)"


def bandwidth_suffix(nbytes: float, seconds: float) -> str:
    """`` (y GB/s)`` for ``nbytes`` moved in ``seconds``; empty when nothing to report."""
    if nbytes <= 0 or seconds <= 0:
        return ""
    return f" ({_num(nbytes / seconds / 1e9)} GB/s)"


def data_suffix(before: tuple[int, int, float], after: tuple[int, int, float], seconds: float) -> str:
    """`` (x img/s, waited y ms per batch for data)`` of a data layer between two ``data_stats()``."""
    batches, images, waited = (a - b for a, b in zip(after, before))
    if batches <= 0 or seconds <= 0:
        return ""
    return f" ({_num(images / seconds)} img/s, waited {waited / batches * 1e3:.3g} ms per batch for data)"


def layer_rates(layer, bottom: Sequence, top: Sequence, propagate_down: Sequence[bool],
                fwd_s: float, bwd_s: float) -> tuple[str, str]:
    """The forward and backward line suffixes of one layer: TFLOP/s and GB/s (:func:`conv_cost`),
    GB/s (:func:`layer_bytes`) or nothing."""
    cost = conv_cost(layer, bottom, top, propagate_down)
    if cost is not None:
        return rate_suffix(cost.fwd_flops, cost.fwd_bytes, fwd_s), rate_suffix(cost.bwd_flops, cost.bwd_bytes, bwd_s)
    nbytes = layer_bytes(layer, bottom, top, propagate_down)
    if nbytes is not None:
        return bandwidth_suffix(nbytes[0], fwd_s), bandwidth_suffix(nbytes[1], bwd_s)
    return "", ""


def run(args: argparse.Namespace) -> int:
    if args.iterations < 1:
        raise PrototxtError(f"--iterations must be >= 1, got {args.iterations}")
    if not os.path.isfile(args.model):
        raise PrototxtError(f"{args.model}: model file not found")
    device = parse_gpu(args.gpu)
    use_device(device, args.autotune_cache)
    use_precision(getattr(args, "precision", None))
    phase = common.TRAIN if args.phase == "TRAIN" else common.TEST
    net = Net(args.model, phase, level=args.level, stages=stages(args) or None)
    if device is not None:
        sync = backend.synchronize
    else:
        def sync() -> None:
            pass

    log.info("Performing Forward")
    initial_loss = net.forward_prefilled()
    log.info("Initial loss: %g", initial_loss)
    log.info("Performing Backward")
    net.backward_from_to(len(net.layers) - 1, 0)
    sync()

    n = len(net.layers)
    fwd = [0.0] * n
    bwd = [0.0] * n
    log.info("*** Benchmark begins ***")
    log.info("Testing for %d iterations.", args.iterations)
    data_before = {i: layer.data_stats() for i, layer in enumerate(net.layers) if hasattr(layer, "data_stats")}
    total_start = time.perf_counter()
    for it in range(args.iterations):
        iter_start = time.perf_counter()
        for i, layer in enumerate(net.layers):
            start = time.perf_counter()
            layer.forward(net.bottom_vecs[i], net.top_vecs[i])
            sync()
            fwd[i] += time.perf_counter() - start
        for i in range(n - 1, -1, -1):
            if not net.layer_need_backward[i]:
                continue
            start = time.perf_counter()
            net.layers[i].backward(net.top_vecs[i], net.bottom_need_backward[i], net.bottom_vecs[i])
            sync()
            bwd[i] += time.perf_counter() - start
        log.info("Iteration: %d forward-backward time: %.4g ms.", it + 1, (time.perf_counter() - iter_start) * 1e3)
    total = time.perf_counter() - total_start
    k = args.iterations
    print("Average time per layer:")
    names = list(net._layer_names)  # (one per layer: duplicate names stay)
    width = max([10] + [len(s) for s in names])
    conv_s = 0.0
    for i, layer in enumerate(net.layers):
        f_s, b_s = fwd[i] / k, bwd[i] / k
        f_rate, b_rate = layer_rates(layer, net.bottom_vecs[i], net.top_vecs[i], net.bottom_need_backward[i], f_s, b_s)
        if layer.type in CONV_TYPES:
            conv_s += fwd[i] + bwd[i]
        if i in data_before:
            f_rate += data_suffix(data_before[i], layer.data_stats(), fwd[i])
        print(f"{names[i]:>{width}}\tforward: {f_s * 1e3:.5g} ms.{f_rate}")
        if net.layer_need_backward[i]:
            print(f"{names[i]:>{width}}\tbackward: {b_s * 1e3:.5g} ms.{b_rate}")
    print(f"Average Forward pass: {sum(fwd) / k * 1e3:.5g} ms.")
    print(f"Average Backward pass: {sum(bwd) / k * 1e3:.5g} ms.")
    print(f"Average Forward-Backward: {total / k * 1e3:.5g} ms.")
    print(f"Total Time: {total * 1e3:.5g} ms.")
    layer_s = sum(fwd) + sum(bwd)
    share = 100.0 * conv_s / layer_s if layer_s > 0 else 0.0
    print(f"Convolution/Deconvolution layers: {conv_s / k * 1e3:.5g} ms ({share:.1f}% of layer time); "
          f"other layers: {(layer_s - conv_s) / k * 1e3:.5g} ms.")
    if device is not None:
        mem = backend.memory_held()
        print(f"Peak device memory: {mem['device'] / 2**20:.1f} MiB held by the process "
              f"(memory pool {mem['pool'] / 2**20:.1f} MiB, {mem['pool_active'] / 2**20:.1f} MiB in use).")
    print("*** Benchmark ends ***")
    return 0
