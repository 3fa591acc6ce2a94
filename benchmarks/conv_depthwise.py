"""MobileNet v2's depthwise convolutions: our depthwise engine vs the gemm engine vs cuDNN (PyTorch).

    python benchmarks/conv_depthwise.py [--batches 32 1] [--budget 0.05] [--double]

Every depthwise 3x3 (pad 1) shape of MobileNet v2 at 224x224 input, per pass: forward (with bias),
data gradient, weight gradient (+ bias gradient). Each number is the mean over as many calls as fit
in ``--budget`` seconds (at least 3), stream-synchronised around the loop (launch overhead included,
as in a training step without CUDA graphs); the peer is ``torch.nn.functional.conv2d(groups=C)`` and
``aten.convolution_backward`` with ``cudnn.benchmark`` on and TF32 off (PyTorch runs cuDNN or its own
depthwise kernels, whichever it prefers per shape). Prints ms and the ratios gemm/depthwise and
depthwise/cuDNN (< 1: we are faster). About a minute on an H100.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

# (channels, size, stride) of the depthwise convolutions of MobileNet v2 at 224x224
SHAPES = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2), (384, 14, 1),
          (576, 14, 1), (576, 14, 2), (960, 7, 1)]
PASSES = ("forward", "data", "weight")


def _ms(fn, sync, budget: float) -> float:
    fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    reps = max(3, min(200, int(budget / max(time.perf_counter() - start, 1e-6))))
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - start) / reps * 1e3


def ours(engine_name: str, n: int, c: int, size: int, stride: int, dtype, budget: float) -> dict[str, float]:
    from pycaffe_lite.conv import engines as conv_engines
    from pycaffe_lite.conv.problem import ConvProblem
    from pycaffe_lite.gpu import backend

    prob = ConvProblem(n, c, size, size, c, c, (3, 3), (1, 1), (stride, stride), (1, 1), np.dtype(dtype).str)
    rng = np.random.default_rng(0)
    keep = []

    def dev(shape):
        a = rng.standard_normal(shape).astype(dtype)
        keep.append(backend.alloc(a.nbytes))
        backend.memcpy_htod(int(keep[-1]), a)
        return int(keep[-1])

    x, dx, w, dw, b, db = dev((n, c, size, size)), dev((n, c, size, size)), dev(c * 9), dev(c * 9), dev(c), dev(c)
    y, dy = dev((n, c) + prob.out_hw), dev((n, c) + prob.out_hw)
    choice = conv_engines.Choice(engine_name, engine_name, engine_name)  # scratch from the shared workspace
    runs = {"forward": lambda: conv_engines.run(prob, choice, "forward", x, w, b, y),
            "data": lambda: conv_engines.run(prob, choice, "backward_data", w, dy, dx),
            "weight": lambda: conv_engines.run(prob, choice, "backward_weight", x, dy, dw, db)}
    return {p: _ms(runs[p], backend.synchronize, budget) for p in PASSES}


def cudnn(n: int, c: int, size: int, stride: int, dtype, budget: float) -> dict[str, float]:
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    dev, tdt = torch.device("cuda"), torch.float64 if dtype == np.float64 else torch.float32
    x = torch.randn(n, c, size, size, device=dev, dtype=tdt)
    w, b = torch.randn(c, 1, 3, 3, device=dev, dtype=tdt), torch.randn(c, device=dev, dtype=tdt)
    dy = torch.randn_like(torch.nn.functional.conv2d(x, w, b, stride, 1, 1, c))
    geo = ([c], [stride, stride], [1, 1], [1, 1], False, [0, 0], c)
    back = torch.ops.aten.convolution_backward
    runs = {"forward": lambda: torch.nn.functional.conv2d(x, w, b, stride, 1, 1, c),
            "data": lambda: back(dy, x, w, *geo, [True, False, False]),
            "weight": lambda: back(dy, x, w, *geo, [False, True, True])}
    return {p: _ms(runs[p], torch.cuda.synchronize, budget) for p in PASSES}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 1])
    ap.add_argument("--budget", type=float, default=0.05, help="seconds of calls per measurement")
    ap.add_argument("--double", action="store_true", help="float64 instead of float32")
    args = ap.parse_args(argv)
    import pycaffe_lite as caffe
    from pycaffe_lite.gpu import backend

    caffe.set_mode_gpu()
    dtype = np.float64 if args.double else np.float32
    try:
        import torch  # noqa: F401
        peer = True
    except ImportError:
        peer = False
    print(f"device: {backend.device_name()}, {np.dtype(dtype).name}; peer: {'cuDNN (PyTorch)' if peer else 'none'}")
    print(f"{'N':>3} {'C':>4} {'HxW':>7} {'s':>1} {'pass':>7} {'depthwise':>10} {'gemm':>9} {'cuDNN':>9}"
          f" {'gemm/dw':>8} {'dw/cuDNN':>9}")
    totals = dict.fromkeys(("depthwise", "gemm", "cudnn"), 0.0)
    for n in args.batches:
        for c, size, stride in SHAPES:
            dw = ours("depthwise", n, c, size, stride, dtype, args.budget)
            try:
                gemm = ours("gemm", n, c, size, stride, dtype, args.budget)
            except Exception as exc:  # report the others even if the baseline engine fails
                print(f"gemm engine failed: {exc}")
                gemm = dict.fromkeys(PASSES, float("nan"))
            ref = cudnn(n, c, size, stride, dtype, args.budget) if peer else dict.fromkeys(PASSES, float("nan"))
            for p in PASSES:
                totals["depthwise"] += dw[p]
                totals["gemm"] += gemm[p]
                totals["cudnn"] += ref[p]
                print(f"{n:>3} {c:>4} {f'{size}x{size}':>7} {stride:>1} {p:>7} {dw[p]:>10.4f} {gemm[p]:>9.4f} "
                      f"{ref[p]:>9.4f} {gemm[p] / dw[p]:>8.2f} {dw[p] / ref[p]:>9.2f}")
    t = totals
    print(f"total ms: depthwise {t['depthwise']:.3f}, gemm {t['gemm']:.3f}, cuDNN {t['cudnn']:.3f}; "
          f"gemm/dw {t['gemm'] / t['depthwise']:.2f}x, dw/cuDNN {t['depthwise'] / t['cudnn']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
