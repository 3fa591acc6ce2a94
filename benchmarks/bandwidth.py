"""Bandwidth-bound layers against the device's copy bandwidth, at ResNet-50 and GoogLeNet shapes
and, for the forks' layers, at SSD300, DeepLab/PSPNet, SegNet, MobileNet, ShuffleNet, SENet and CTPN shapes.

    python benchmarks/bandwidth.py [--reps 20] [--eager] [--only BatchNorm,Scale]

Measures the device's copy bandwidth (a 1 GiB device-to-device copy: bytes read + written per
second), then for each layer case times forward and backward (float32) and prints GB/s computed
from the pass's traffic and that as a percentage of the copy bandwidth (target: >= 70 %). Small
passes cannot reach a 1 GiB copy's rate (launch latency and ramp-up weigh more), so each pass also
gets the rate of a device-to-device copy moving the same traffic (half of it read, half written:
:func:`same_traffic_copy_bytes`), timed the same way, and the pass's GB/s as a percentage of it
("% same"; the flag "< 70 %" stays on the 1 GiB column).

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
from collections.abc import Callable
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
    inputs: Callable[[np.random.Generator, list[tuple[int, ...]]], list[np.ndarray]] | None = None  # default: normal


def segnet_mask(rng: np.random.Generator, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """Values and a valid 2x2/2 max-pooling mask (flat index into the (2H, 2W) plane) for Upsample."""
    n, c, h, w = shapes[0]
    dy = rng.integers(0, 2, size=(n, c, h, w))
    dx = rng.integers(0, 2, size=(n, c, h, w))
    rows = 2 * np.arange(h)[:, None] + dy
    cols = 2 * np.arange(w)[None, :] + dx
    return [rng.standard_normal((n, c, h, w), dtype=np.float32), (rows * (2 * w) + cols).astype(np.float32)]


def fork_cases() -> list[Case]:
    """The forks' bandwidth-bound layers (docs/fork_layers.md) at the nets that use them.

    Element counts follow the module's rule. Normalize (SSD, across_spatial false): the per-pixel
    channel norm must finish before the top is written, so forward reads x twice (3n) and backward
    reads x and dy for the per-pixel dot product, then again for dx (5n). Permute, Transpose,
    Reverse, ShuffleChannel: one read and one write each way (2n). Interp (bilinear): bottom + top
    either way. Upsample (SegNet, values + mask of n, top of 4n): forward reads values and mask and
    writes the whole top (zeros included: 6n); backward reads the mask and gathers one top diff of
    each 2x2 window, a scattered read that fetches the whole top diff in 32-byte sectors (n + 4n),
    and writes dx (n). Axpy ``top = a * x + y`` (a per channel): forward 3n; backward reads dy and x
    (for da) and writes dx and dy's copy (4n). BN (PSPNet) as BatchNorm: batch stats 3n / 5n,
    frozen 2n / 2n.
    """
    out: list[Case] = []
    for tag, s in (("ssd300 conv4_3 mbox_loc 32x16x38x38", (32, 16, 38, 38)),
                   ("ssd300 conv4_3 mbox_conf 32x84x38x38", (32, 84, 38, 38)),
                   ("ssd300 fc7 mbox_conf 32x126x19x19", (32, 126, 19, 19))):
        n = count(s)
        out.append(Case(f"Permute 0,2,3,1        {tag}", 'type: "Permute" permute_param { order: 0 order: 2 order: 3 order: 1 }',
                        [s], 2 * n, 2 * n))
    s = (32, 512, 38, 38)
    out.append(Case("Normalize per pixel    ssd300 conv4_3 32x512x38x38",
                    'type: "Normalize" norm_param { across_spatial: false channel_shared: false '
                    'scale_filler { type: "constant" value: 20 } }', [s], 3 * count(s), 5 * count(s)))
    for tag, s, top, param in (
            ("deeplab fc8 x8 10x21x65x65->513", (10, 21, 65, 65), (10, 21, 513, 513), "zoom_factor: 8"),
            ("pspnet conv6 8x150x60x60->473", (8, 150, 60, 60), (8, 150, 473, 473), "height: 473 width: 473"),
            ("pspnet pool6 8x512x6x6->60", (8, 512, 6, 6), (8, 512, 60, 60), "height: 60 width: 60")):
        io = count(s) + count(top)
        out.append(Case(f"Interp                 {tag}", f'type: "Interp" interp_param {{ {param} }}', [s], io, io))
    for tag, s in (("segnet up4 8x256x45x60", (8, 256, 45, 60)), ("segnet up2 8x128x90x120", (8, 128, 90, 120))):
        n = count(s)
        out.append(Case(f"Upsample (mask) x2     {tag}", 'type: "Upsample" upsample_param { scale: 2 }', [s, s],
                        6 * n, 6 * n, propagate=[True, False], inputs=segnet_mask))
    for tag, s in (("mobilenet conv1 32x32x112x112", (32, 32, 112, 112)),
                   ("mobilenet dw13 32x1024x7x7", (32, 1024, 7, 7))):
        out.append(Case(f"ReLU6                  {tag}", 'type: "ReLU6"', [s], 2 * count(s), 3 * count(s)))
    for tag, s in (("shufflenet stage2 32x240x28x28 g3", (32, 240, 28, 28)),
                   ("shufflenet stage3 32x480x14x14 g3", (32, 480, 14, 14))):
        out.append(Case(f"ShuffleChannel         {tag}", 'type: "ShuffleChannel" shuffle_channel_param { group: 3 }',
                        [s], 2 * count(s), 2 * count(s)))
    for tag, s in (("senet res2 32x256x56x56", (32, 256, 56, 56)), ("senet res4 32x1024x14x14", (32, 1024, 14, 14))):
        n = count(s)
        out.append(Case(f"Axpy                   {tag}", 'type: "Axpy"', [(s[0], s[1], 1, 1), s, s], 3 * n, 4 * n))
    for tag, s in (("resnet 32x64x112x112", RESNET_A), ("resnet 32x256x56x56", RESNET_B)):
        n = count(s)
        out += [Case(f"BN batch stats         {tag}", 'type: "BN" phase: TRAIN', [s], 3 * n, 5 * n),
                Case(f"BN frozen              {tag}", 'type: "BN" bn_param { frozen: true }', [s], 2 * n, 2 * n)]
    s = (64, 304, 512)  # CTPN: the BiLSTM's (T = conv5 width, N * H rows, 512) input, batch 8 of 38 rows
    out.append(Case("Reverse axis 0         ctpn lstm 64x304x512", 'type: "Reverse" reverse_param { axis: 0 }',
                    [s], 2 * count(s), 2 * count(s)))
    s = (8, 512, 38, 64)
    out.append(Case("Transpose 3,0,2,1      ctpn conv5 8x512x38x64",
                    'type: "Transpose" transpose_param { dim: 3 dim: 0 dim: 2 dim: 1 }', [s], 2 * count(s), 2 * count(s)))
    return out


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
    return out + fork_cases()


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


def same_traffic_copy_bytes(elems: float) -> int:
    """Bytes of a copy whose traffic (read + written) equals ``elems`` float32 elements'."""
    return max(F, int(elems * F / 2) // F * F)


class CopyRates:
    """GB/s (read + written) of device-to-device copies of a given size, measured once per size."""

    def __init__(self, timer: Timer) -> None:
        self.timer = timer
        self.rates: dict[int, float] = {}

    def __call__(self, nbytes: int) -> float:
        if nbytes not in self.rates:
            self.rates[nbytes] = copy_bandwidth(self.timer, nbytes)
        return self.rates[nbytes]


def run_case(case: Case, timer: Timer) -> tuple[float | None, float]:
    from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

    rng = np.random.default_rng(0)
    layer = make_layer(case.text, np.float32)
    arrays = (case.inputs(rng, case.bottoms) if case.inputs else
              [rng.standard_normal(s, dtype=np.float32) for s in case.bottoms])
    bottom = blobs(arrays, np.float32)
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
    same_copy = CopyRates(timer)
    print(f"{'layer / shape':64s} {'pass':4s} {'ms':>8s} {'GB/s':>7s} {'% copy':>7s} {'same-size copy GB/s':>19s} "
          f"{'% same':>7s}")
    prefixes = [p.strip() for p in args.only.split(",") if p.strip()]
    below, below_same = [], []
    for case in cases():
        if prefixes and not any(case.name.startswith(p) for p in prefixes):
            continue
        try:
            fwd, bwd = run_case(case, timer)
        except Exception as exc:  # report and go on: one broken layer should not hide the others
            print(f"{case.name:64s} FAILED: {type(exc).__name__}: {exc}")
            below.append(case.name)
            continue
        for label, ms, elems in (("fwd", fwd, case.fwd_elems), ("bwd", bwd, case.bwd_elems)):
            if ms is None:
                continue
            gbs = elems * F / ms / 1e6
            pct = 100 * gbs / copy_gbs
            same = same_copy(same_traffic_copy_bytes(elems))
            flag = "" if pct >= 70 else "  < 70 %"
            if flag:
                below.append(f"{case.name} {label}")
            if gbs < 0.7 * same:
                below_same.append(f"{case.name} {label}")
            print(f"{case.name:64s} {label:4s} {ms:8.3f} {gbs:7.0f} {pct:6.1f}% {same:19.0f} "
                  f"{100 * gbs / same:6.1f}%{flag}")
    print(f"\n{len(below)} pass(es) below 70 % of copy bandwidth" + (":\n  " + "\n  ".join(below) if below else ""))
    print(f"{len(below_same)} pass(es) below 70 % of a same-size copy"
          + (":\n  " + "\n  ".join(below_same) if below_same else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
