"""``pycaffe-lite classify --model NET.prototxt --weights W.caffemodel IMAGE...``: predict classes.

Two kinds of nets (``--mode``; ``auto`` picks by the net's input: one channel -> digits):

* digits (``examples/mnist/lenet.prototxt``): each image grayscale, resized to the input, scaled by
  ``--scale`` and inverted when its border is bright; prints the digit and the probabilities.
* imagenet: BVLC's ``python/classify.py``: images resized to ``--images_dim`` (256,256), 10 crops
  averaged (``--center_only``: one), ``--channel_swap`` (2,1,0), ``--raw_scale`` (255), ``--mean_file``
  (.binaryproto / .npy) or ``--mean_values`` ("104,117,123"), ``--input_scale``; prints the
  ``--top_k`` classes named from ``--labels`` (one line per class, e.g. synset_words.txt);
  ``--output X.npy`` saves the scores (N, classes) as BVLC's script does.

An unreadable image, or one whose scores are NaN/infinite (bad weights), is reported on stderr
without stopping the others; the exit status is then 1 (3 when scores were not finite).
"""

from __future__ import annotations

import argparse
import math
import sys

from ..errors import CaffeError
from ..net import load_net_param
from ..proto.upgrade import upgrade_net
from . import add_gpu_argument, flag, parse_gpu, use_device
from .digits import classify_digits
from .imagenet import classify_images, load_labels

NAME = "classify"
HELP = "classify images with a deploy net and trained weights (MNIST digits, or ImageNet-style as BVLC's classify.py)"
EXIT_NONFINITE = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files (PNG, JPEG, ...)")
    flag(parser, "model", required=True, metavar="NET.prototxt",
         help="deploy prototxt (e.g. examples/mnist/lenet.prototxt)")
    flag(parser, "weights", required=True, metavar="W.caffemodel", help="trained weights")
    flag(parser, "mode", choices=("auto", "digits", "imagenet"), default="auto",
         help="digits (grayscale MNIST-style) or imagenet (BVLC's classify.py); auto: digits for a 1-channel input")
    flag(parser, "scale", type=float, default=0.00390625,
         help="digits: multiply pixel values (0..255) by this (default 0.00390625 = 1/256)")
    flag(parser, "invert", choices=("auto", "yes", "no"), default="auto",
         help="digits: invert images (MNIST digits are light on dark); auto: when the border is bright")
    flag(parser, "images_dim", default="256,256", help="imagenet: resize images to H,W before cropping")
    flag(parser, "center_only", action="store_true", help="imagenet: the center crop only (default: 10 crops)")
    flag(parser, "mean_file", default=None, help="imagenet: mean image (.binaryproto or .npy)")
    flag(parser, "mean_values", default=None, help="imagenet: per-channel mean, e.g. 104,117,123")
    flag(parser, "raw_scale", type=float, default=255.0, help="imagenet: scale of the raw pixels (default 255)")
    flag(parser, "input_scale", type=float, default=None, help="imagenet: multiply the mean-subtracted input by this")
    flag(parser, "channel_swap", default="2,1,0",
         help="imagenet: channel order (default 2,1,0: RGB to BGR, as Caffe's models expect); 'none' keeps RGB")
    flag(parser, "labels", default=None, metavar="FILE", help="imagenet: class names, one line per class")
    flag(parser, "top_k", type=int, default=5, help="imagenet: how many classes to print per image (default 5)")
    flag(parser, "output", default=None, metavar="X.npy", help="imagenet: save the scores (N, classes) here")
    parser.add_argument("--allow-missing", "-allow_missing", dest="allow_missing", action="store_true",
                        help="run even when the weights leave some learnable layers at their initial values")
    add_gpu_argument(parser)


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise CaffeError(f"--{what} '{text}': expected comma-separated integers") from None


def _input_channels(model: str) -> int:
    param = load_net_param(model)
    upgrade_net(param, source=model)
    for lp in param.layer:
        if lp.type == "Input" and lp.input_param.shape:
            dims = lp.input_param.shape[0].dim
            return int(dims[1]) if len(dims) > 1 else 1
    if param.input_shape:
        dims = param.input_shape[0].dim
        return int(dims[1]) if len(dims) > 1 else 1
    if len(param.input_dim) >= 2:
        return int(param.input_dim[1])
    return 1


def run(args: argparse.Namespace) -> int:
    use_device(parse_gpu(args.gpu), args.autotune_cache)
    mode = args.mode
    if mode == "auto":
        mode = "digits" if _input_channels(args.model) == 1 else "imagenet"
    if mode == "imagenet":
        return _run_imagenet(args)

    invert: bool | str = {"yes": True, "no": False}.get(args.invert, "auto")
    errors: list[tuple[str, str]] = []
    results = classify_digits(args.model, args.weights, args.images, scale=args.scale, invert=invert,
                              allow_missing=args.allow_missing, errors=errors)
    nonfinite = False
    for r in results:
        if not all(math.isfinite(float(p)) for p in r.probs):
            nonfinite = True
            errors.append((r.source, f"{r.source}: the net's output is not finite (NaN or infinite): the weights "
                                     f"({args.weights}) or the image hold NaN/Inf values"))
            continue
        probs = " ".join(f"{i}:{p:.4f}" for i, p in enumerate(r.probs))
        print(f"{r.source}: {r.label} (p={r.probs[r.label]:.4f})  [{probs}]")
    for _, message in errors:  # unreadable images are skipped, the others still classified
        print(f"pycaffe-lite classify: error: {message}", file=sys.stderr)
    return EXIT_NONFINITE if nonfinite else 1 if errors else 0


def _run_imagenet(args: argparse.Namespace) -> int:
    import numpy as np

    if args.mean_file and args.mean_values:
        raise CaffeError("--mean_file and --mean_values: give one of them")
    swap = None if str(args.channel_swap).lower() in ("none", "") else _ints(args.channel_swap, "channel_swap")
    labels = load_labels(args.labels) if args.labels else None
    errors: list[tuple[str, str]] = []
    results = classify_images(
        args.model, args.weights, args.images, images_dim=_ints(args.images_dim, "images_dim"),
        mean=args.mean_file or args.mean_values, raw_scale=args.raw_scale, input_scale=args.input_scale,
        channel_swap=swap, center_only=args.center_only, top_k=args.top_k, allow_missing=args.allow_missing,
        errors=errors)
    for r in results:
        if labels is not None and len(labels) != r.scores.size:
            raise CaffeError(f"{args.labels}: {len(labels)} labels for a net with {r.scores.size} classes")
        print(f"{r.source}:")
        for cls, score in r.top:
            name = labels[cls] if labels is not None else f"class {cls}"
            print(f"  {score:.4f}  {name}" + ("" if labels is None else f"  ({cls})"))
    if args.output and results:
        np.save(args.output, np.stack([r.scores for r in results]))
        print(f"Saved {len(results)} predictions to {args.output}", file=sys.stderr)
    for _, message in errors:
        print(f"pycaffe-lite classify: error: {message}", file=sys.stderr)
    nonfinite = any("not finite" in m for _, m in errors)
    return EXIT_NONFINITE if nonfinite else 1 if errors else 0
