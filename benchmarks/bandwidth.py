"""Bandwidth-bound layers against the device's copy bandwidth, at ResNet-50 and GoogLeNet shapes.

    python benchmarks/bandwidth.py [--reps 20] [--eager] [--only BatchNorm,Scale]

Measures the device's copy bandwidth (a 1 GiB device-to-device copy: bytes read + written per
second), then for each layer case times forward and backward (float32) and prints GB/s computed
from the pass's traffic and that as a percentage of the copy bandwidth (target: >= 70 %).

Traffic counts each tensor element the pass must read or write once per kernel pass it needs:
a per-channel reduction must finish before anything that depends on it is written, so batch-
statistics BatchNorm reads its input twice forward (moments, normalize: 3n) and dy and x twice
backward (5n). Per-channel vectors and Pooling's windows re-read from cache are not counted.

Timing: each pass is captured in a CUDA graph (``--graph-calls`` calls per graph) and the graph is
replayed ``--reps`` times between CUDA events, so host overhead is excluded; ``--eager`` times
plain calls instead (events around ``--reps`` calls). The capture also checks that the pass is
capturable (no host reads or allocations inside forward/backward).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

F = 4  # bytes per float32 element

RESNET_A = (32, 64, 112, 112)  # conv1 output
RESNET_B = (32, 256, 56, 56)  # res2 output
GOOGLENET = (32, 192, 28, 28)  # inception 3a input
GOOGLENET_3A = [(32, 64, 28, 28), (32, 128, 28, 28), (32, 32, 28, 28), (32, 32, 28, 28)]  # 3a branches


def count(shape) -> int:
    return int(np.prod(shape))


@dataclass
class Case:
    name: str
    text: str  # layer prototxt body
    bottoms: list[tuple[int, ...]]
    fwd_elems: float  # elements moved by forward (x F bytes); 0: no forward work
    bwd_elems: float
    ntop: int = 1
    propagate: list[bool] = field(default_factory=list)


def cases() -> list[Case]:
    out: list[Case] = []
    bn_train = 'type: "BatchNorm" phase: TRAIN'
    bn_global = 'type: "BatchNorm" batch_norm_param { use_global_stats: true }'
    scale = 'type: "Scale" scale_param { bias_term: true }'
    bias = 'type: "Bias"'
    for tag, s in (("resnet 32x64x112x112", RESNET_A), ("resnet 32x256x56x56", RESNET_B),
                   ("googlenet 32x192x28x28", GOOGLENET)):
        n = count(s)
        out += [
            Case(f"BatchNorm batch stats  {tag}", bn_train, [s], 3 * n, 5 * n),
            Case(f"BatchNorm global stats {tag}", bn_global, [s], 2 * n, 2 * n),
            Case(f"Scale + bias           {tag}", scale, [s], 2 * n, 3 * n),
            Case(f"Bias                   {tag}", bias, [s], 2 * n, 3 * n),
            Case(f"Eltwise SUM (2)        {tag}", 'type: "Eltwise" eltwise_param { operation: SUM }', [s, s],
                 3 * n, 4 * n),
            Case(f"Eltwise PROD (2)       {tag}", 'type: "Eltwise" eltwise_param { operation: PROD }', [s, s],
                 3 * n, 6 * n),
            Case(f"Eltwise MAX (2)        {tag}", 'type: "Eltwise" eltwise_param { operation: MAX }', [s, s],
                 4 * n, 6 * n),
            Case(f"Split (2 tops)         {tag}", 'type: "Split"', [s], 0, 3 * n, ntop=2),
        ]
    a, b = RESNET_A, (32, 64, 56, 56)
    out += [
        Case("Pooling MAX 3x3/2 pad 1  resnet pool1 32x64x112x112",
             'type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }', [a],
             count(a) + 2 * count(b), count(a) + 2 * count(b)),
        Case("Pooling AVE 3x3/2 pad 1  resnet-shape 32x64x112x112",
             'type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }', [a],
             count(a) + count(b), count(a) + count(b)),
        Case("Pooling MAX 3x3/2        googlenet pool2 32x192x56x56",
             'type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 }', [(32, 192, 56, 56)],
             count((32, 192, 56, 56)) + 2 * count((32, 192, 28, 28)),
             count((32, 192, 56, 56)) + 2 * count((32, 192, 28, 28))),
        Case("Concat (4 branches)      googlenet 3a 32x256x28x28", 'type: "Concat"', GOOGLENET_3A,
             2 * sum(map(count, GOOGLENET_3A)), 2 * sum(map(count, GOOGLENET_3A))),
        Case("Concat (2)               resnet-shape 2x 32x128x56x56", 'type: "Concat"',
             [(32, 128, 56, 56)] * 2, 4 * count((32, 128, 56, 56)), 4 * count((32, 128, 56, 56))),
    ]
    return out


class Timer:
    """Milliseconds per call of ``fn`` on the backend stream (CUDA events)."""

    def __init__(self, reps: int, graph_calls: int, eager: bool) -> None:
        self.reps, self.graph_calls, self.eager = reps, graph_calls, eager

    def __call__(self, fn) -> float:
        import pycuda.driver as cuda

        from pycaffe_lite.gpu import backend, cuda_graph

        fn()  # warm-up: compiles kernels, sizes the workspace, syncs host data to the device
        backend.synchronize()
        start, stop = cuda.Event(), cuda.Event()
        if self.eager:
            start.record(backend.stream())
            for _ in range(self.reps):
                fn()
            stop.record(backend.stream())
            stop.synchronize()
            return stop.time_since(start) / self.reps
        recording = cuda_graph.Recording()
        with cuda_graph.capture(recording):
            for _ in range(self.graph_calls):
                fn()
        graph = recording.graph
        graph.launch()
        backend.synchronize()
        start.record(backend.stream())
        for _ in range(self.reps):
            graph.launch()
        stop.record(backend.stream())
        stop.synchronize()
        return stop.time_since(start) / (self.reps * self.graph_calls)


def copy_bandwidth(timer: Timer, nbytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy of ``nbytes`` (read + written)."""
    from pycaffe_lite.gpu import backend

    src, dst = backend.alloc(nbytes), backend.alloc(nbytes)
    backend.memset_zero(int(src), nbytes)
    ms = timer(lambda: backend.memcpy_dtod(int(dst), int(src), nbytes))
    return 2 * nbytes / ms / 1e6


def run_case(case: Case, timer: Timer) -> tuple[float | None, float]:
    from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

    rng = np.random.default_rng(0)
    layer = make_layer(case.text, np.float32)
    bottom = blobs([rng.standard_normal(s, dtype=np.float32) for s in case.bottoms], np.float32)
    top = empty_blobs(case.ntop, np.float32)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    for t in top:
        t.mutable_cpu_diff()[...] = rng.standard_normal(t.shape, dtype=np.float32)
    prop = case.propagate or [True] * len(bottom)
    fwd = timer(lambda: layer.forward(bottom, top)) if case.fwd_elems else None
    layer.forward(bottom, top)
    bwd = timer(lambda: layer.backward(top, prop, bottom))
    return fwd, bwd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20, help="timed graph launches (or calls with --eager)")
    ap.add_argument("--graph-calls", type=int, default=5, help="layer calls captured per graph")
    ap.add_argument("--eager", action="store_true", help="time plain calls, not CUDA graph replays")
    ap.add_argument("--only", default="", help="comma-separated name prefixes (e.g. BatchNorm,Scale)")
    args = ap.parse_args(argv)

    import pycaffe_lite as caffe
    from pycaffe_lite.gpu import backend

    caffe.set_mode_gpu()
    timer = Timer(args.reps, args.graph_calls, args.eager)
    copy_gbs = copy_bandwidth(timer)
    print(f"device: {backend.device_name()}; timing: {'eager calls' if args.eager else 'CUDA graph replay'}")
    print(f"copy bandwidth (1 GiB device-to-device, read + write): {copy_gbs:.0f} GB/s\n")
    print(f"{'layer / shape':58s} {'pass':4s} {'ms':>8s} {'GB/s':>7s} {'% copy':>7s}")
    prefixes = [p.strip() for p in args.only.split(",") if p.strip()]
    below = []
    for case in cases():
        if prefixes and not any(case.name.startswith(p) for p in prefixes):
            continue
        try:
            fwd, bwd = run_case(case, timer)
        except Exception as exc:  # report and go on: one broken layer should not hide the others
            print(f"{case.name:58s} FAILED: {type(exc).__name__}: {exc}")
            below.append(case.name)
            continue
        for label, ms, elems in (("fwd", fwd, case.fwd_elems), ("bwd", bwd, case.bwd_elems)):
            if ms is None:
                continue
            gbs = elems * F / ms / 1e6
            pct = 100 * gbs / copy_gbs
            flag = "" if pct >= 70 else "  < 70 %"
            if flag:
                below.append(f"{case.name} {label}")
            print(f"{case.name:58s} {label:4s} {ms:8.3f} {gbs:7.0f} {pct:6.1f}%{flag}")
    print(f"\n{len(below)} pass(es) below 70 % of copy bandwidth" + (":\n  " + "\n  ".join(below) if below else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
