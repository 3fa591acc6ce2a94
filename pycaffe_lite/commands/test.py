"""``pycaffe-lite test --model M --weights W [--iterations K] [--gpu N] [--precision P]``: score a model.

As ``caffe test``: runs K forward passes of the TEST-phase net, logs every output per batch, and
prints each output averaged over the batches (with its weighted loss contribution) to stdout, and
to the log files (``-log_dir``) but not the console log, so a terminal shows each line once.
An output or loss that is not finite (NaN/Inf weights or inputs) is marked, logged as an error and
makes the exit status 3. ``--precision`` builds the net in fp32, tf32, fp16 or bf16 (the weights
rounded once at load; outputs are read as float32 values, bf16 ones too).
"""

from __future__ import annotations

import argparse
import logging
import math
import os

from .. import common
from ..errors import PrototxtError, WeightsError
from ..glog import FILES_ONLY
from ..net import Net
from ..proto.protoio import check_regular_file
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

NAME = "test"
HELP = "score a model: average its outputs over --iterations batches"

log = logging.getLogger("pycaffe_lite")
EXIT_NONFINITE = 3  # the scores are NaN or infinite


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flag(parser, "model", required=True, metavar="NET.prototxt", help="the net definition")
    flag(parser, "weights", required=True, metavar="W.caffemodel", help="the trained weights")
    flag(parser, "iterations", type=int, default=50, help="number of batches (default 50)")
    parser.add_argument("--allow-missing", "-allow_missing", dest="allow_missing", action="store_true",
                        help="score even when the weights leave some learnable layers at their initial values")
    add_gpu_argument(parser)
    add_net_state_arguments(parser)
    add_precision_argument(parser)


def score(net, iterations: int) -> tuple[float, list[tuple[str, float, float]]]:
    """Run ``iterations`` forward passes; (mean loss, [(output name, mean value, loss weight)])."""
    sums: list[float] = []
    names: list[str] = []
    loss = 0.0
    for i in range(iterations):
        loss += net.forward_prefilled()
        idx = 0
        for name in net.outputs:
            for value in net.blobs[name].math_data().ravel():  # (half outputs as float32 values)
                value = float(value)
                if i == 0:
                    sums.append(value)
                    names.append(name)
                else:
                    sums[idx] += value
                idx += 1
                log.info("Batch %d, %s = %g", i, name, value)
    weights = net.blob_loss_weights
    return loss / iterations, [(n, s / iterations, weights[n]) for n, s in zip(names, sums)]


def run(args: argparse.Namespace) -> int:
    if args.iterations < 1:
        raise PrototxtError(f"--iterations must be >= 1, got {args.iterations}")
    if not os.path.isfile(args.model):
        raise PrototxtError(f"{args.model}: model file not found")

    check_regular_file(args.weights, "weights file", WeightsError)
    use_device(parse_gpu(args.gpu), args.autotune_cache)
    use_precision(getattr(args, "precision", None))
    net = Net(args.model, common.TEST, level=args.level, stages=stages(args) or None)
    net.copy_from(args.weights, allow_missing=args.allow_missing)
    log.info("Running for %d iterations.", args.iterations)
    loss, results = score(net, args.iterations)
    log.info("Loss: %g", loss)
    bad = []
    for name, mean, weight in results:
        extra = f" (* {weight:g} = {weight * mean:g} loss)" if weight else ""
        flag_ = "" if math.isfinite(mean) else "  <- not a finite number"
        # in the log files too, as caffe test logs them (parsers read them there); on the screen once
        log.info("%s = %g%s%s", name, mean, extra, flag_, extra={FILES_ONLY: True})
        print(f"{name} = {mean:g}{extra}{flag_}")
        if not math.isfinite(mean) and name not in bad:
            bad.append(name)
    if not math.isfinite(loss) or bad:
        what = ", ".join(bad) if bad else "the loss"
        log.error("%s: %s %s not finite (NaN or infinite): the weights (%s) or the inputs hold NaN/Inf values, "
                  "so these scores mean nothing", args.model, what, "is" if len(bad) <= 1 else "are", args.weights)
        return EXIT_NONFINITE
    return 0
