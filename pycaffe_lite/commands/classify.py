"""``pycaffe-lite classify --model lenet.prototxt --weights X.caffemodel IMAGE...``: the predicted
digit and class probabilities for PNG/JPEG files (grayscale, resized to the net's input, scaled).
An unreadable image is reported on stderr (exit status 1) without stopping the others."""

from __future__ import annotations

import argparse
import sys

from . import add_gpu_argument, flag, parse_gpu, use_device

NAME = "classify"
HELP = "classify digit images (PNG/JPEG) with a deploy net and trained weights"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files (PNG, JPEG, ...)")
    flag(parser, "model", required=True, metavar="NET.prototxt",
         help="deploy prototxt (e.g. examples/mnist/lenet.prototxt)")
    flag(parser, "weights", required=True, metavar="W.caffemodel", help="trained weights")
    flag(parser, "scale", type=float, default=0.00390625,
         help="multiply pixel values (0..255) by this (default 0.00390625 = 1/256)")
    flag(parser, "invert", choices=("auto", "yes", "no"), default="auto",
         help="invert images (MNIST digits are light on dark); auto: when the border is bright")
    parser.add_argument("--allow-missing", "-allow_missing", dest="allow_missing", action="store_true",
                        help="run even when the weights leave some learnable layers at their initial values")
    add_gpu_argument(parser)


def run(args: argparse.Namespace) -> int:
    from .digits import classify_digits

    use_device(parse_gpu(args.gpu), args.autotune_cache)
    invert: bool | str = {"yes": True, "no": False}.get(args.invert, "auto")
    errors: list[tuple[str, str]] = []
    results = classify_digits(args.model, args.weights, args.images, scale=args.scale, invert=invert,
                              allow_missing=args.allow_missing, errors=errors)
    for r in results:
        probs = " ".join(f"{i}:{p:.4f}" for i, p in enumerate(r.probs))
        print(f"{r.source}: {r.label} (p={r.probs[r.label]:.4f})  [{probs}]")
    for _, message in errors:  # unreadable images are skipped, the others still classified
        print(f"pycaffe-lite classify: error: {message}", file=sys.stderr)
    return 1 if errors else 0
