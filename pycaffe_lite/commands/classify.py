"""``pycaffe-lite classify --model lenet.prototxt --weights X.caffemodel IMAGE...``: the predicted
digit and class probabilities for PNG/JPEG files (grayscale, resized to the net's input, scaled)."""

from __future__ import annotations

import argparse

NAME = "classify"
HELP = "classify digit images (PNG/JPEG) with a deploy net and trained weights"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files (PNG, JPEG, ...)")
    parser.add_argument("--model", required=True, help="deploy prototxt (e.g. examples/mnist/lenet.prototxt)")
    parser.add_argument("--weights", required=True, help="trained .caffemodel")
    parser.add_argument("--scale", type=float, default=0.00390625,
                        help="multiply pixel values (0..255) by this (default 0.00390625 = 1/256)")
    parser.add_argument("--invert", choices=("auto", "yes", "no"), default="auto",
                        help="invert images (MNIST digits are light on dark); auto: when the border is bright")
    parser.add_argument("--gpu", type=int, default=None, metavar="N", help="run on GPU N (default: CPU)")


def run(args: argparse.Namespace) -> int:
    import pycaffe_lite as caffe
    from pycaffe_lite.digits import classify_digits

    if args.gpu is not None:
        caffe.set_device(args.gpu)
        caffe.set_mode_gpu()
    invert = {"auto": "auto", "yes": True, "no": False}[args.invert]
    results = classify_digits(args.model, args.weights, args.images, scale=args.scale, invert=invert)
    for r in results:
        probs = " ".join(f"{i}:{p:.4f}" for i, p in enumerate(r.probs))
        print(f"{r.source}: {r.label} (p={r.probs[r.label]:.4f})  [{probs}]")
    return 0
