"""``pycaffe-lite classify --model lenet.prototxt --weights X.caffemodel IMAGE...``: the predicted
digit and class probabilities for PNG/JPEG files (grayscale, resized to the net's input, scaled)."""

from __future__ import annotations

import argparse

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
    add_gpu_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..apps.digits import classify_digits

    use_device(parse_gpu(args.gpu))
    invert: bool | str = {"yes": True, "no": False}.get(args.invert, "auto")
    results = classify_digits(args.model, args.weights, args.images, scale=args.scale, invert=invert)
    for r in results:
        probs = " ".join(f"{i}:{p:.4f}" for i, p in enumerate(r.probs))
        print(f"{r.source}: {r.label} (p={r.probs[r.label]:.4f})  [{probs}]")
    return 0
