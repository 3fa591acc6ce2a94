"""Half-precision convolution passes, ours against cuDNN, on ResNet-50's distinct convolution shapes.

    python benchmarks/conv_half.py [--precision fp16,bf16] [--batches 32,256] [--reps 10] [--nets resnet50]
                                   [--engines tensorcore16-128x128,...] [--only REGEX] [--out FILE.json]

For each distinct Convolution shape of the nets' deploy files (``conv_engines.zoo_conv_shapes``:
identical geometry and bias merged, with their multiplicity), at each batch and in each precision:
the device time of the forward (bias included), the weight gradient (bias gradient included) and
the data gradient. Ours: the engine per pass that the autotune picks among every engine supporting
the half problem (``engine: DEFAULT``; ``--engines`` narrows the candidates), timed under
``conv_engines.graph_timing()`` as the nets' graphs tune it, then each pass run through
``conv_engines.run`` on fp16 / bf16 blobs. Peer: PyTorch's cuDNN on ``channels_last`` tensors of
the same type (``F.conv2d``; ``aten.convolution_backward`` with only the weight (and bias) or only
the input gradient asked for), ``cudnn.benchmark`` on. Both sides: median of ``--reps`` calls, each
queued behind a spin kernel between CUDA events (``timing.device_median_ms``: kernels' device
time). One run; the table gives both times and ours / cuDNN per pass, then the
multiplicity-weighted sums per net, batch and precision; ``--out`` also keeps every candidate's
autotune time per pass (``tuned``), so an engine that lost is still measured. PyTorch is imported
only here, on the device machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ours  # noqa: E402
import peer_torch  # noqa: E402

from pycaffe_lite.conv.problem import ConvProblem  # noqa: E402

PRECISIONS = {"fp16": "<f2", "bf16": "<u2"}  # storage dtype strings (bfloat16 as uint16 bit patterns)
PASSES = (("fwd", "forward"), ("dW", "backward_weight"), ("dX", "backward_data"))


def ours_ms(prob: ConvProblem, bias: bool, candidates: tuple[str, ...], reps: int) -> dict:
    """Device ms per pass of the autotune's pick among ``candidates`` (and the picks)."""
    from pycaffe_lite.blob import Blob
    from pycaffe_lite.conv import engines as conv_engines
    from pycaffe_lite.gpu import backend

    dt = prob.np_dtype
    rng = np.random.default_rng(0)
    blobs = []
    for shape in ((prob.num, prob.channels, prob.height, prob.width), (prob.num, prob.num_output, *prob.out_hw),
                  (prob.num_output, prob.cg, *prob.kernel), (prob.num_output,)):
        b = Blob(shape, dt)
        b.set_math_data(rng.standard_normal(shape).astype(np.float32) * 0.1)
        b.set_math_diff(rng.standard_normal(shape).astype(np.float32) * 0.1)
        blobs.append(b)
    (x, dx), (y, dy), (w, dw), (b, db) = ((bl.mutable_gpu_data(), bl.mutable_gpu_diff()) for bl in blobs)
    b, db = (b, db) if bias else (None, None)
    backend.state().pool.free_held()
    supported = tuple(n for n in candidates if conv_engines.ENGINES[n].supports(prob))
    with conv_engines.graph_timing():
        choice = conv_engines.choose(prob, bias, supported)
    run = {"fwd": lambda: conv_engines.run(prob, choice, "forward", x, w, b, y),
           "dW": lambda: conv_engines.run(prob, choice, "backward_weight", x, dy, dw, db),
           "dX": lambda: conv_engines.run(prob, choice, "backward_data", w, dy, dx)}
    out = {k: ours.device_ms(fn, reps) for k, fn in run.items()}
    out["engines"] = {k: getattr(choice, p) for k, p in PASSES}
    out["tuned"] = [[p, name, ms] for p, name, ms in choice.timings]  # every candidate's autotune ms (--out JSON)
    return out


def cudnn_ms(prob: ConvProblem, bias: bool, precision: str, reps: int) -> dict:
    """Device ms per pass of cuDNN (PyTorch) in ``precision`` on channels_last tensors."""
    import torch

    torch.backends.cudnn.benchmark = True
    torch.cuda.empty_cache()
    dev = torch.device("cuda")
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    F = torch.nn.functional
    cl = torch.channels_last
    x = (torch.randn(prob.num, prob.channels, prob.height, prob.width, device=dev) * 0.1).to(dtype, memory_format=cl)
    wt = (torch.randn(prob.num_output, prob.cg, *prob.kernel, device=dev) * 0.1).to(dtype, memory_format=cl)
    bt = torch.zeros(prob.num_output, device=dev, dtype=dtype) if bias else None
    args = (prob.stride, prob.pad, prob.dilation)
    with torch.no_grad():
        gy = torch.randn_like(F.conv2d(x, wt, bt, *args, prob.group)).contiguous(memory_format=cl)

    def fwd():
        with torch.no_grad():
            F.conv2d(x, wt, bt, *args, prob.group)

    def backward(mask):
        return lambda: torch.ops.aten.convolution_backward(gy, x, wt, [prob.num_output] if bias else None, *args,
                                                           False, [0, 0], prob.group, mask)

    def timed(step) -> float:
        return peer_torch.cuda_median_ms(torch, step, reps)

    return {"fwd": timed(fwd), "dW": timed(backward([False, True, bias])), "dX": timed(backward([True, False, False]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="fp16,bf16", help="comma-separated, of fp16, bf16")
    ap.add_argument("--batches", default="32,256")
    ap.add_argument("--nets", default="resnet50", help="model-zoo nets whose convolutions to time")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--engines", default="", help="comma-separated candidates for ours (default: every engine)")
    ap.add_argument("--out", help="also write the results as JSON")
    ap.add_argument("--only", default="", help="a regular expression: time only the shapes whose label it finds "
                    "(e.g. ' 3x3 |/2' for the 3x3 and the strided convolutions)")
    args = ap.parse_args(argv)
    precisions = args.precision.split(",")
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad:
        ap.error(f"unknown precision(s) {', '.join(bad)}; known: {', '.join(PRECISIONS)}")
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"PyTorch is needed for the cuDNN side ({exc})", file=sys.stderr)
        return 1
    import conv_engines as bench_conv  # the zoo's shapes (imports the benchmarks' zoo tables)

    import pycaffe_lite as caffe
    from pycaffe_lite.conv import engines as conv_engines

    per_net = bench_conv.zoo_conv_shapes(args.nets.split(","))
    candidates = tuple(args.engines.split(",")) if args.engines else conv_engines.ENGINE_CANDIDATES["DEFAULT"]
    unknown = [e for e in candidates if e not in conv_engines.ENGINES]
    if unknown:
        ap.error(f"unknown engine(s) {', '.join(unknown)}; known: {', '.join(conv_engines.ENGINES)}")
    caffe.set_mode_gpu()
    results = []
    for net, shapes in per_net.items():
        for precision in precisions:
            for batch in (int(b) for b in args.batches.split(",")):
                sums = dict.fromkeys(("ours_fwd", "ours_dW", "ours_dX", "cudnn_fwd", "cudnn_dW", "cudnn_dX"), 0.0)
                print(f"\n{net} {precision} batch {batch}: ms per pass (ours / cuDNN)")
                print(f"{'shape':44s} {'x':>3s} {'fwd':>21s} {'dW':>21s} {'dX':>21s}  engines (fwd, dW, dX)")
                for (prob, bias), count in shapes.items():
                    p = dataclasses.replace(prob, num=batch, dtype=PRECISIONS[precision], cache={})
                    if args.only and not re.search(args.only, bench_conv.label((p, bias))):
                        continue
                    mine, peer = ours_ms(p, bias, candidates, args.reps), cudnn_ms(p, bias, precision, args.reps)
                    cells = []
                    for k, _ in PASSES:
                        sums[f"ours_{k}"] += count * mine[k]
                        sums[f"cudnn_{k}"] += count * peer[k]
                        cells.append(f"{mine[k]:6.3f}/{peer[k]:6.3f} {mine[k] / max(peer[k], 1e-9):5.2f}x")
                    print(f"{bench_conv.label((p, bias)):44s} {count:3d} {' '.join(cells)}  "
                          f"{', '.join(mine['engines'].values())}", flush=True)
                    results.append({"net": net, "precision": precision, "batch": batch, "shape": bench_conv.label((p, bias)),
                                    "count": count, "ours": mine, "cudnn": peer})
                line = " ".join(f"{k} {sums[f'ours_{k}']:8.3f}/{sums[f'cudnn_{k}']:8.3f} "
                                f"{sums[f'ours_{k}'] / max(sums[f'cudnn_{k}'], 1e-9):5.2f}x" for k, _ in PASSES)
                total = sum(sums[f"ours_{k}"] for k, _ in PASSES) / max(sum(sums[f"cudnn_{k}"] for k, _ in PASSES), 1e-9)
                print(f"{'sum (weighted by count)':48s} {line}  all passes {total:5.2f}x")
    if args.out:  # written beside, then renamed: an earlier file survives a failed write
        from pycaffe_lite import durable

        final = Path(args.out)
        durable.write_temp(final, json.dumps(results, indent=1).encode()).replace(final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
