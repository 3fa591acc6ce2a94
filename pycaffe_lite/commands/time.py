"""``pycaffe-lite time --model M [--iterations K] [--gpu N] [--phase TRAIN|TEST]``: benchmark.

As ``caffe time``: one warm-up forward/backward, then K timed iterations of every layer's forward
and (where the net needs it) backward. Prints the average time per layer and for the whole net;
Convolution layers also get their achieved GFLOP/s (2·multiply-adds of the direct convolution;
backward counts the weight and, where computed, the input gradient). GPU work is synchronized
before and after each timed call, so the times are device times, not launch times.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from ..errors import PrototxtError
from . import add_gpu_argument, add_net_state_arguments, flag, parse_gpu, stages, use_device

NAME = "time"
HELP = "benchmark the forward and backward time of a model, per layer"

log = logging.getLogger("pycaffe_lite")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flag(parser, "model", required=True, metavar="NET.prototxt", help="the net definition")
    flag(parser, "iterations", type=int, default=50, help="timed iterations (default 50)")
    flag(parser, "phase", choices=("TRAIN", "TEST"), default="TRAIN", type=str.upper,
         help="net phase (default TRAIN)")
    add_gpu_argument(parser)
    add_net_state_arguments(parser)


def conv_flops(layer, top) -> float:
    """Forward FLOPs of a Convolution layer: 2 · top.count · (weight.count / num_output)."""
    if layer.type != "Convolution" or not layer.blobs or not top:
        return 0.0
    weight = layer.blobs[0]
    return 2.0 * top[0].count * weight.count / weight.shape[0]


def run(args: argparse.Namespace) -> int:
    from .. import common
    from ..net import Net

    if args.iterations < 1:
        raise PrototxtError(f"--iterations must be >= 1, got {args.iterations}")
    if not os.path.isfile(args.model):
        raise PrototxtError(f"{args.model}: model file not found")
    device = parse_gpu(args.gpu)
    use_device(device)
    phase = common.TRAIN if args.phase == "TRAIN" else common.TEST
    net = Net(args.model, phase, level=args.level, stages=stages(args) or None)
    if device is not None:
        from ..gpu import backend

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
    names = list(net.layer_dict)
    width = max([10] + [len(s) for s in names])
    for i, layer in enumerate(net.layers):
        f_ms = fwd[i] / k * 1e3
        line = f"{names[i]:>{width}}\tforward: {f_ms:.5g} ms."
        flops = conv_flops(layer, net.top_vecs[i])
        if flops and fwd[i] > 0:
            line += f" ({flops / (fwd[i] / k) / 1e9:.4g} GFLOP/s)"
        print(line)
        if net.layer_need_backward[i]:
            b_ms = bwd[i] / k * 1e3
            line = f"{names[i]:>{width}}\tbackward: {b_ms:.5g} ms."
            # weight gradient always; input gradient when the bottom needs it
            passes = int(any(layer.param_propagate_down)) + int(any(net.bottom_need_backward[i]))
            if flops and passes and bwd[i] > 0:
                line += f" ({flops * passes / (bwd[i] / k) / 1e9:.4g} GFLOP/s)"
            print(line)
    print(f"Average Forward pass: {sum(fwd) / k * 1e3:.5g} ms.")
    print(f"Average Backward pass: {sum(bwd) / k * 1e3:.5g} ms.")
    print(f"Average Forward-Backward: {total / k * 1e3:.5g} ms.")
    print(f"Total Time: {total * 1e3:.5g} ms.")
    print("*** Benchmark ends ***")
    return 0
