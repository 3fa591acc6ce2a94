"""``pycaffe-lite export_onnx --model deploy.prototxt --weights w.caffemodel --output net.onnx``:
write the net as ONNX, then run it in ONNX Runtime and compare every blob with pycaffe-lite's own
forward (per-blob table on stdout; a mismatch exits with status 1 naming the first diverging
layer; a reference that is not finite, inf or NaN in pycaffe-lite's own forward, exits with status
3, "inconclusive"). Without ``--weights`` the layers' fillers give the weights, and the statistics
of BatchNorm / BN layers are measured on a random input so that the reference stays finite and in
a trained net's ranges (:func:`pycaffe_lite.onnx.fill.fill_statistics`). Needs the ``onnx`` extra.
A half net (a file with NVCaffe's fp16/bf16 type fields) exports the values of its half weights
(float32 in the graph; ``--fp16`` stores them as float16) and is checked within its format's
roundoff (:data:`pycaffe_lite.onnx.check.TOL_HALF`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .. import common
from ..errors import CaffeError
from ..net import Net
from ..optional import require
from . import add_net_state_arguments, flag, stages

NAME = "export_onnx"
HELP = "export a net to ONNX and check it blob by blob in ONNX Runtime"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flag(parser, "model", required=True, metavar="NET.prototxt", help="the net (a deploy prototxt)")
    flag(parser, "weights", metavar="W.caffemodel",
         help="trained weights (.caffemodel or .h5); without, the net's fillers give the values")
    flag(parser, "output", required=True, metavar="NET.onnx", help="the ONNX file to write")
    flag(parser, "opset", type=int, default=None, help="ONNX opset (default 17; 13 and newer)")
    flag(parser, "dynamic-batch", action="store_true",
         help="make the first axis of every input symbolic ('N') instead of the prototxt's batch")
    flag(parser, "input-shape", action="append", default=[], metavar="[NAME=]D0,D1,...",
         help="export at this input shape (repeat per input; NAME defaults to the first input)")
    flag(parser, "fold-bn", action="store_true",
         help="fold BatchNorm (+ Scale) into the convolution before it, or into one BatchNormalization")
    flag(parser, "fp16", action="store_true", help="store the weights as float16 (cast to float32 in the graph)")
    flag(parser, "no-check", action="store_true", help="skip the ONNX Runtime check")
    flag(parser, "check-input", action="append", default=[], metavar="FILE",
         help="also check on this input (.npy array, or an image: resized, BGR 0..255); repeatable")
    flag(parser, "seed", type=int, default=0, help="seed of the random check input (default 0)")
    flag(parser, "tolerance", type=float, default=None,
         help="allowed max abs difference relative to each blob's range (default 1e-5; 2e-3 with --fp16 --fold-bn; "
              "nets storing fp16 / bf16 values: 2**-9 / 2**-6, 4 units of the format's roundoff)")
    flag(parser, "no-layer-recheck", action="store_true",
         help="judge every blob end to end only (by default a blob that differs end to end is compared again "
              "with its layer's ONNX nodes run on pycaffe-lite's values of the layer's bottoms)")
    flag(parser, "phase", choices=("TEST", "TRAIN"), default="TEST", help="net phase (default TEST)")
    add_net_state_arguments(parser)


def _shapes(values: list[str], net) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for v in values:
        name, _, dims = v.rpartition("=")
        name = name or (net.inputs[0] if net.inputs else "")
        try:
            shapes[name] = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            raise CaffeError(f"--input-shape {v}: expected [NAME=]D0,D1,... (integers)") from None
    return shapes


def check_output(path: str) -> None:
    """CaffeError before any work when ``--output`` cannot be written: a folder, a missing folder,
    or a folder without write permission (the file itself is written whole or not at all)."""
    out = Path(path)
    if out.is_dir():
        raise CaffeError(f"--output {out}: it is a folder (give a file name, such as {out / 'net.onnx'})")
    if not out.parent.is_dir():
        what = "does not exist (create it first)" if not out.parent.exists() else "is not a folder"
        raise CaffeError(f"--output {out}: the folder {out.parent} {what}")
    if not os.access(out.parent, os.W_OK):
        raise CaffeError(f"--output {out}: the folder {out.parent} is not writable (choose another path)")


def run(args: argparse.Namespace) -> int:
    check_output(args.output)
    require("onnx", feature="export_onnx", extra="onnx")
    from ..onnx import DEFAULT_OPSET, export_net

    common.set_mode_cpu()
    phase = common.TEST if args.phase == "TEST" else common.TRAIN
    net = Net(args.model, phase=phase, level=args.level, stages=stages(args) or None)
    fill_notes: list[str] = []
    if args.weights:
        net.copy_from(args.weights)
    else:
        from ..onnx.fill import fill_statistics, unit_statistics

        # measured on a random input (one forward); --no-check runs no forward at all: mean 0, variance 1
        fill_notes = unit_statistics(net) if args.no_check else fill_statistics(net, seed=args.seed + 1)
    report = export_net(
        net, args.output, opset=args.opset or DEFAULT_OPSET, dynamic_batch=args.dynamic_batch,
        input_shapes=_shapes(args.input_shape, net), fp16=args.fp16, random_check=not args.no_check,
        check_inputs=[] if args.no_check else args.check_input, seed=args.seed, tol=args.tolerance,
        raise_on_mismatch=False, fold_bn=args.fold_bn, layer_recheck=not args.no_layer_recheck,
    )
    ex = report.exported
    print(f"wrote {args.output}: {len(ex.model.graph.node)} nodes, opset {args.opset or DEFAULT_OPSET}, "
          f"inputs {', '.join(f'{k} {list(v)}' for k, v in ex.inputs.items())}, outputs {', '.join(ex.outputs)}")
    for note in fill_notes + ex.notes:
        print(f"note: {note}")
    labels = ["random input"] + list(args.check_input)
    for label, result in zip(labels, report.checks):
        print(f"\ncheck on {label}:")
        print(result.table())
    from ..onnx import InconclusiveCheck, verify

    for result in report.checks:
        try:
            verify(result)  # a CaffeError: the CLI prints it and exits 1
        except InconclusiveCheck as exc:
            print(f"pycaffe-lite {NAME}: {exc}", file=sys.stderr)
            return 3
    return 0
