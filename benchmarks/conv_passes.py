"""Device time of each convolution pass with each engine forced: which engine wins where, and why.

    python benchmarks/conv_passes.py [--tf32] [--shapes vgg1_2,vgg3] [--engines winograd,tensorcore-128x128]

For each named shape (:data:`SHAPES`, batch 32) and each engine that supports it: forward, weight
gradient (bias included when the shape has one) and data gradient, each the median of 10 calls'
device time (``ours.device_ms``, as ``conv_engines.py`` measures), with the
TFLOP/s that time gives the direct convolution's 2*N*M*C*kh*kw*Ho*Wo operations. No peer: the
cuDNN side of these shapes is in ``conv_engines.py --zoo``. Needs a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ours import device_ms  # noqa: E402

import pycaffe_lite as caffe  # noqa: E402
from pycaffe_lite.blob import Blob  # noqa: E402
from pycaffe_lite.conv.problem import ConvProblem  # noqa: E402

SHAPES = {  # name: (N, C, H, W, M, kernel, pad, stride, bias)
    "vgg1_2": (32, 64, 224, 224, 64, 3, 1, 1, True),
    "vgg2_2": (32, 128, 112, 112, 128, 3, 1, 1, True),
    "res56": (32, 64, 56, 56, 64, 3, 1, 1, False),
    "vgg3": (32, 256, 56, 56, 256, 3, 1, 1, True),
    "res28": (32, 128, 28, 28, 128, 3, 1, 1, False),
    "1x1_7": (32, 512, 7, 7, 2048, 1, 0, 1, False),
}
ENGINES = "winograd,gemm,tensorcore-128x128,tensorcore-64x128,tensorcore-64x64"


def problem(name: str) -> tuple[ConvProblem, bool]:
    n, c, h, w, m, k, pad, stride, bias = SHAPES[name]
    return ConvProblem(n, c, h, w, m, 1, (k, k), (pad, pad), (stride, stride), (1, 1), "<f4"), bias


def pass_times(prob: ConvProblem, bias: bool, engine: str, reps: int = 10) -> dict[str, float]:
    """ms of the forward, weight-gradient and data-gradient passes of ``engine`` forced."""
    from pycaffe_lite.conv import engines as conv_engines
    from pycaffe_lite.gpu import backend

    dt = prob.np_dtype
    blobs = [Blob(s, dt) for s in ((prob.num, prob.channels, prob.height, prob.width),
                                   (prob.num, prob.num_output, *prob.out_hw),
                                   (prob.num_output, prob.cg, *prob.kernel), (prob.num_output,))]
    rng = np.random.default_rng(0)
    for bl in blobs:
        bl.data[...] = rng.standard_normal(bl.shape)
        bl.diff[...] = rng.standard_normal(bl.shape)
    (x, dx), (y, dy), (w, dw), (b, db) = ((bl.mutable_gpu_data(), bl.mutable_gpu_diff()) for bl in blobs)
    b, db = (b, db) if bias else (None, None)
    backend.state().pool.free_held()
    with conv_engines.graph_timing():  # tuned (here: only set up) as our nets' graphs run it
        choice = conv_engines.choose(prob, bias, (engine,))
    passes = {"fwd": lambda: conv_engines.run(prob, choice, "forward", x, w, b, y),
              "dW": lambda: conv_engines.run(prob, choice, "backward_weight", x, dy, dw, db),
              "dX": lambda: conv_engines.run(prob, choice, "backward_data", w, dy, dx)}
    return {k: device_ms(fn, reps) for k, fn in passes.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--engines", default=ENGINES, help=f"comma-separated (default {ENGINES})")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 (the tensor-core engines need it)")
    args = ap.parse_args(argv)
    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    from pycaffe_lite.conv import engines as conv_engines

    bad = [e for e in args.engines.split(",") if e not in conv_engines.ENGINES]
    if bad:
        ap.error(f"unknown engine(s) {', '.join(bad)}; known: {', '.join(conv_engines.ENGINES)}")
    caffe.set_mode_gpu()
    caffe.set_allow_tf32(args.tf32)
    for name in args.shapes.split(","):
        prob, bias = problem(name)
        flops = 2.0 * prob.num * prob.num_output * prob.cg * prob.khkw * prob.out_plane
        for engine in args.engines.split(","):
            if not conv_engines.ENGINES[engine].supports(prob):
                continue
            ms = pass_times(prob, bias, engine)
            print(f"{name:8s} {engine:20s} " + " | ".join(
                f"{k} {v:7.3f} ms {flops / v / 1e9:6.1f} TFLOP/s" for k, v in ms.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
