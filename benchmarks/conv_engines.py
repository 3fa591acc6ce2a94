"""Convolution engines side by side with cuDNN (PyTorch), per convolution shape and summed per net.

    python benchmarks/conv_engines.py [--tf32] [--reps 10] [--all-engines]
    python benchmarks/conv_engines.py --zoo [--nets resnet50,vgg16,...] [--batches 1,32] [--tf32]
                                      [--all-engines] [--timing device|wall] [--out FILE.json]

Without ``--zoo``: the shapes of ``run_all.CONV_SHAPES`` at their own batch sizes. With ``--zoo``:
every Convolution layer of the model-zoo deploy nets (``zoo.NETS``: ResNet-50, VGG-16, GoogLeNet,
MobileNet v2, SqueezeNet 1.1 by default), identical shapes (geometry and bias) merged with their
multiplicity, at each of ``--batches``; then per-net sums weighted by multiplicity and the summary
of the issue's targets (batch 32 forward+backward over ResNet-50's and VGG-16's convolutions,
batch 1 forward over ResNet-50's and MobileNet v2's).

Ours: the engine per pass that the autotune picks (all engines are candidates, as ``engine:
DEFAULT``), run through ``conv_engines.run``; ``--all-engines`` adds every engine forced alone
where it supports the shape (passes it lacks run on gemm). Peer: cuDNN through PyTorch
(``F.conv2d``; backward ``aten.convolution_backward``), ``cudnn.benchmark`` on. The forward runs at
every batch, the backward (data, weight and bias gradients) at batches above 1. Both sides are
timed the same way, median of ``--reps`` calls: ``--timing device`` (default) queues each call
behind a spin kernel between two CUDA events, so it measures the kernels' device time without the
host's launch overhead (our nets replay CUDA graphs; see ``timing.device_median_ms``); ``--timing
wall`` times each call between synchronizations (host overhead included). ``--tf32`` allows TF32
on both sides. The autotune's own measurements happen before the timed calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ours  # noqa: E402
import peer_torch  # noqa: E402
from run_all import CONV_SHAPES  # noqa: E402
from zoo import NETS, ZOO  # noqa: E402

from pycaffe_lite.conv.problem import ConvProblem  # noqa: E402

ZOO_NETS = "resnet50,vgg16,googlenet,mobilenet_v2,squeezenet1_1"
Shape = tuple[ConvProblem, bool]  # the problem (batch 1 in the zoo's tables) and whether it has a bias
TARGETS = (  # (name, nets, batch, passes, fp32 bound, TF32 bound): ours / cuDNN time
    ("ResNet-50 + VGG-16 convolutions, batch 32, fwd+bwd", ("resnet50", "vgg16"), 32, "fwd+bwd", 1.0, 1.2),
    ("ResNet-50 + MobileNet v2 convolutions, batch 1, fwd", ("resnet50", "mobilenet_v2"), 1, "fwd", 0.7, 0.7),
)


def zoo_conv_shapes(nets: list[str]) -> dict[str, Counter[Shape]]:
    """Per net, the distinct Convolution shapes of its deploy prototxt at batch 1 with their
    counts (the net is built on the CPU, in TEST phase, to read every layer's input shape)."""
    import pycaffe_lite as caffe

    caffe.set_mode_cpu()
    out = {}
    for name in nets:
        net = caffe.Net(ours.zoo_param(ZOO / NETS[name].prototxt, 1, train=False), caffe.TEST)
        out[name] = Counter((layer.problem, layer.bias_term) for layer in net.layers if layer.type == "Convolution")
    return out


def at_batch(prob: ConvProblem, batch: int) -> ConvProblem:
    return dataclasses.replace(prob, num=batch, cache={})  # (the launch-plan cache is per shape)


def label(shape: Shape) -> str:
    p, bias = shape
    extra = "".join([f" g{p.group}" if p.group > 1 else "", f" d{p.dilation[0]}" if p.dilation != (1, 1) else "",
                     " +bias" if bias else ""])
    kernel = f"{p.kernel[0]}x{p.kernel[1]}" + (f"/{p.stride[0]}" if p.stride != (1, 1) else "")
    return f"n{p.num} c{p.channels} {p.height}x{p.width} k{p.num_output} {kernel} p{p.pad[0]}{extra}"


def measure(prob: ConvProblem, bias: bool, engines: list[str], backward: bool, args) -> dict:
    """ms of cuDNN ("cudnn") and of ours: "default" (autotuned) and each of ``engines`` forced."""
    from pycaffe_lite.conv import engines as conv_engines

    device = args.timing == "device"
    out = {"cudnn": peer_torch.conv_layer_ms(prob.num, prob.channels, prob.height, prob.width, prob.num_output,
                                             prob.kernel, prob.pad, prob.stride, prob.dilation, prob.group, bias,
                                             backward, args.reps, device)}
    candidates = {"default": conv_engines.ENGINE_CANDIDATES["DEFAULT"]}
    candidates.update((e, (e,)) for e in engines if conv_engines.ENGINES[e].supports(prob))
    for name, cands in candidates.items():
        out[name] = ours.conv_engine_ms(prob, bias, cands, backward, args.reps, device)
    return out


def total(r: dict) -> float:
    return r["fwd_ms"] + r["bwd_ms"]


def print_row(name: str, count: int, res: dict) -> None:
    """cuDNN's line for a shape, then ours (autotuned, then any forced engines) with ours / cuDNN."""
    peer = res["cudnn"]
    print(f"{name:38s} x{count:<3d} {'cuDNN':>16s} {peer['fwd_ms']:8.3f} {peer['bwd_ms']:8.3f}")
    for engine, r in res.items():
        if engine != "cudnn":
            picked = f"  [{r['engines']}]" if engine == "default" else ""
            print(f"{'':43s}{engine:>16s} {r['fwd_ms']:8.3f} {r['bwd_ms']:8.3f} "
                  f"{total(r) / max(total(peer), 1e-9):6.2f}x{picked}")


def net_sums(shapes: Counter[Shape], times: dict[Shape, dict]) -> dict[str, float]:
    """Multiplicity-weighted sums of one net's per-shape times (ms): ours (autotuned) and cuDNN,
    forward and backward."""
    sums = dict.fromkeys(("ours_fwd", "ours_bwd", "cudnn_fwd", "cudnn_bwd"), 0.0)
    for shape, count in shapes.items():
        for side, key in (("ours", "default"), ("cudnn", "cudnn")):
            sums[f"{side}_fwd"] += count * times[shape][key]["fwd_ms"]
            sums[f"{side}_bwd"] += count * times[shape][key]["bwd_ms"]
    return sums


def summary(sums: dict[tuple[str, int], dict[str, float]], tf32: bool) -> list[str]:
    """The issue's targets from the per-(net, batch) sums: ours, cuDNN, ratio, bound (skipped when
    a net or batch was not run)."""
    lines = []
    for name, nets, batch, passes, bound32, bound_tf32 in TARGETS:
        if not all((n, batch) in sums for n in nets):
            continue
        keys = ("fwd", "bwd") if passes == "fwd+bwd" else ("fwd",)
        mine = sum(sums[n, batch][f"ours_{k}"] for n in nets for k in keys)
        peer = sum(sums[n, batch][f"cudnn_{k}"] for n in nets for k in keys)
        bound = bound_tf32 if tf32 else bound32
        ratio = mine / peer
        lines.append(f"{name + (' (TF32)' if tf32 else ' (fp32)'):64s} ours {mine:9.2f} ms  cuDNN {peer:9.2f} ms  "
                     f"{ratio:5.2f}x  target <= {bound}x  {'MET' if ratio <= bound else 'NOT MET'}")
    return lines


def run_zoo(args, engines: list[str], per_net: dict[str, Counter[Shape]]) -> dict:
    for name, shapes in per_net.items():
        print(f"{name}: {sum(shapes.values())} convolutions, {len(shapes)} distinct shapes")
    distinct = list(dict.fromkeys(s for shapes in per_net.values() for s in shapes))
    sums: dict[tuple[str, int], dict[str, float]] = {}
    results = []
    for batch in map(int, args.batches.split(",")):
        print(f"\n-- batch {batch}: ms per call ({args.timing} time); ratio: ours / cuDNN, fwd+bwd time")
        print(f"{'shape':38s} {'count':4s} {'engine':>16s} {'fwd':>8s} {'bwd':>8s}")
        times = {}
        for shape in distinct:
            prob = at_batch(shape[0], batch)
            times[shape] = measure(prob, shape[1], engines, batch > 1, args)
            count = sum(shapes[shape] for shapes in per_net.values())
            print_row(label((prob, shape[1])), count, times[shape])
            results.append({"batch": batch, "shape": label((prob, shape[1])), "count": count, **times[shape]})
        for name, shapes in per_net.items():
            s = sums[name, batch] = net_sums(shapes, times)
            mine, peer = s["ours_fwd"] + s["ours_bwd"], s["cudnn_fwd"] + s["cudnn_bwd"]
            print(f"SUM {name:14s} batch {batch:3d}: ours fwd {s['ours_fwd']:8.2f} bwd {s['ours_bwd']:8.2f} ms, "
                  f"cuDNN fwd {s['cudnn_fwd']:8.2f} bwd {s['cudnn_bwd']:8.2f} ms: fwd {s['ours_fwd'] / s['cudnn_fwd']:.2f}x"
                  + (f", fwd+bwd {mine / peer:.2f}x" if batch > 1 else ""))
    print("\n== targets (ours / cuDNN time, summed over the nets' convolution layers)")
    lines = summary(sums, args.tf32)
    print("\n".join(lines) or "(run resnet50, vgg16, mobilenet_v2 at batches 1 and 32 for the targets)")
    return {"shapes": results, "sums": [{"net": n, "batch": b, **s} for (n, b), s in sums.items()],
            "targets": lines}


def run_shapes(args, engines: list[str]) -> dict:
    """The fixed shapes of run_all.CONV_SHAPES (with bias, as Convolution's default)."""
    results = []
    for name, (n, c, h, w, k, ks, pad) in CONV_SHAPES.items():
        prob = ConvProblem(n, c, h, w, k, 1, (ks, ks), (pad, pad), (1, 1), (1, 1), "<f4")
        res = measure(prob, True, engines, True, args)
        print_row(name, 1, res)
        results.append({"shape": name, **res})
    return {"shapes": results}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", action="store_true", help="every convolution shape of the model-zoo nets")
    ap.add_argument("--nets", default=ZOO_NETS, help=f"--zoo: comma-separated, of {', '.join(NETS)}")
    ap.add_argument("--batches", default="1,32", help="--zoo: comma-separated batch sizes (default 1,32)")
    ap.add_argument("--all-engines", action="store_true", help="also time every engine forced alone")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 on both sides")
    ap.add_argument("--reps", type=int, default=10, help="timed calls per measurement (median; default 10)")
    ap.add_argument("--timing", choices=("device", "wall"), default="device")
    ap.add_argument("--out", help="write the results as JSON to this file")
    args = ap.parse_args(argv)
    reason = peer_torch.available()
    if reason:
        raise SystemExit(f"the cuDNN side needs PyTorch: {reason}")
    import pycaffe_lite as caffe
    from pycaffe_lite.conv import engines as conv_engines
    from pycaffe_lite.gpu import backend

    per_net = None
    if args.zoo:
        nets = args.nets.split(",")
        unknown = [n for n in nets if n not in NETS]
        if unknown:
            raise SystemExit(f"unknown nets {unknown}; known: {', '.join(NETS)}")
        per_net = zoo_conv_shapes(nets)  # on the CPU, before the GPU side starts
    caffe.set_mode_gpu()
    caffe.set_allow_tf32(args.tf32)
    peer_torch.ALLOW_TF32 = args.tf32
    print(f"device: {backend.device_name()}{' (TF32 allowed on both sides)' if args.tf32 else ' (fp32)'}")
    engines = list(conv_engines.ENGINES) if args.all_engines else []
    out = run_zoo(args, engines, per_net) if per_net is not None else run_shapes(args, engines)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": backend.device_name(), "tf32": args.tf32,
                                              "timing": args.timing, **out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
