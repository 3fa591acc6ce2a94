"""Where a zoo net's iteration spends its device time, kernel by kernel, ours or the peer's.

    python benchmarks/kernel_profile.py --net resnet50 [--mode solver|pycaffe|published] [--tf32]
                                        [--side ours|peer] [--batch 32] [--iters 10] [--warmup 5]
                                        [--top 30] [--precision fp32|tf32|fp16|bf16] [--forward-only]

Runs the iteration of ``benchmarks/zoo.py`` (``ours.zoo_step`` / ``peer_torch.zoo_step``, the
same nets, modes, TF32 switch, ``--precision`` and ``--forward-only`` and so the same timed
step: with ``--precision`` the solver mode includes the update, see zoo.py) ``--warmup`` times, then ``--iters`` times under
``torch.profiler`` (CUPTI traces every kernel of the process, PyCUDA's included), and prints per
iteration: the device time of all kernels, their count, the wall time, and the ``--top`` kernels
by device time with their launches, plus sums over name families (:data:`FAMILIES`). Needs
PyTorch on the GPU machine on both sides (it is the profiler, not a dependency of the package).
One side per process: run it twice to compare.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from zoo import MODES, NETS, PRECISIONS, prototxt, step_drive  # noqa: E402

# name families: the first pattern that matches a kernel's (lowercased) name wins
FAMILIES = (
    ("conv: tensor-core implicit GEMM", r"^tcs?_|tc_permute"),
    ("conv: winograd", r"wino"),
    ("conv: implicit GEMM / reduce", r"^ig_"),
    ("conv: depthwise / direct / im2col", r"depthwise|^dw_|direct|im2col|col2im"),
    ("batch norm / scale", r"batch_?norm|bn_|_bn|scale|welford|channel_sum|fold"),
    ("conv: cuDNN (and its layout transposes)",
     r"xmma_(fprop|dgrad|wgrad)|implicit_convolve|conv2d|dgrad|wgrad|fprop|cutlass.*conv|nchwtonhwc|nhwctonchw"),
    ("GEMM (cuBLAS)", r"gemm|gemv|cutlass"),
    ("pooling", r"pool"),
    ("copies and fills", r"^memcpy|^memset|copy|fill"),
    ("elementwise / relu / add", r"relu|eltwise|elementwise|add|axpy|vectorized"),
)


def family(name: str) -> str:
    low = name.lower()
    for label, pattern in FAMILIES:
        if re.search(pattern, low):
            return label
    return "other"


GAP_BINS = (10.0, 50.0, 500.0)  # us: the idle gaps are summed below 10, 10-50, 50-500 and from 500 on


def busy_and_gaps(intervals: list[tuple[float, float]]) -> tuple[float, float, list[float]]:
    """Of device activity intervals ``(start, end)`` (us, any streams, overlapping or not): the span
    from the first start to the last end, the time at least one ran (their union) and the idle
    gaps between, in order."""
    if not intervals:
        return 0.0, 0.0, []
    ordered = sorted(intervals)
    busy, gaps = 0.0, []
    lo, hi = ordered[0]
    for start, end in ordered[1:]:
        if start > hi:
            busy += hi - lo
            gaps.append(start - hi)
            lo, hi = start, end
        else:
            hi = max(hi, end)
    busy += hi - lo
    return hi - ordered[0][0], busy, gaps  # (the last merged run ends last: a longer one would have merged it)


def idle_line(intervals: list[tuple[float, float]], iters: int) -> str:
    """One line: per iteration, the device's busy (any stream) and idle ms, and the idle by gap size."""
    span, busy, gaps = busy_and_gaps(intervals)
    bins = [0.0] * (len(GAP_BINS) + 1)
    for g in gaps:
        bins[sum(g >= b for b in GAP_BINS)] += g
    labels = [f"<{GAP_BINS[0]:.0f}"] + [f"{a:.0f}-{b:.0f}" for a, b in zip(GAP_BINS, GAP_BINS[1:])] + [f">={GAP_BINS[-1]:.0f}"]
    per = 1e3 * max(iters, 1)
    return (f"device busy {busy / per:.2f} ms/iter (any stream), idle {(span - busy) / per:.2f} ms/iter; idle by gap (us): "
            + ", ".join(f"{lab} {v / per:.2f}" for lab, v in zip(labels, bins)))


def device_intervals(prof) -> list[tuple[float, float]]:
    """The (start, end) us of every device event (kernels, copies, sets) of a ``torch.profiler`` run."""
    from torch.autograd import DeviceType

    return [(ev.time_range.start, ev.time_range.end) for ev in prof.events() if ev.device_type == DeviceType.CUDA]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", default="resnet50", choices=sorted(NETS))
    ap.add_argument("--mode", choices=MODES, default="solver")
    ap.add_argument("--side", choices=("ours", "peer"), default="ours")
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--precision", choices=PRECISIONS, type=str.lower, default=None,
                    help="as zoo.py --precision (AMP-style on both sides; the solver mode then updates)")
    ap.add_argument("--forward-only", action="store_true", help="as zoo.py: profile a forward at --batch")
    args = ap.parse_args(argv)
    if args.tf32 and args.precision not in (None, "tf32"):
        ap.error(f"--tf32 and --precision {args.precision} contradict each other")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = NETS[args.net]
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if args.side == "ours":
        import ours

        from pycaffe_lite.gpu import backend

        step, check = ours.zoo_step(prototxt(spec, args.mode), args.batch, True, args.tf32, step_drive(args),
                                    args.precision)
        sync = backend.synchronize
    else:
        import peer_torch

        peer_torch.ALLOW_TF32 = args.tf32
        step, check, _ = peer_torch.zoo_step(spec.arch, spec.kwargs, spec.size, args.batch, "cuda",
                                             step_drive(args), args.precision)
        sync = torch.cuda.synchronize
    for _ in range(args.warmup):
        step()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(args.iters):
            step()
        sync()
        wall = (time.perf_counter() - start) * 1e3 / args.iters
    check()
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for ev in prof.events():
        if ev.device_type != DeviceType.CUDA:  # runtime API calls and profiler markers: host side
            continue
        totals[ev.name] += ev.time_range.elapsed_us() / 1e3 / args.iters
        counts[ev.name] += 1
    device = sum(totals.values())
    label = f" {args.precision}" if args.precision else (" TF32" if args.tf32 else "")
    print(f"{args.net} {args.mode} {args.side}{label} {step_drive(args)} batch {args.batch}: "
          f"wall {wall:.2f} ms/iter, kernels {device:.2f} ms/iter, "
          f"{sum(counts.values()) / args.iters:.0f} launches/iter")
    print("  " + idle_line(device_intervals(prof), args.iters))
    fams: dict[str, float] = defaultdict(float)
    for name, ms in totals.items():
        fams[family(name)] += ms
    for label, ms in sorted(fams.items(), key=lambda kv: -kv[1]):
        print(f"  {ms:8.3f} ms  {100 * ms / device:5.1f} %  {label}")
    print("  top kernels (ms/iter, launches/iter):")
    for name, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {ms:8.3f} {counts[name] / args.iters:5.0f}  {name[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
