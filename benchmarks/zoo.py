"""Real networks, pycaffe-lite vs the peer (PyTorch + torchvision), on one device.

    python benchmarks/zoo.py [--nets resnet50,vgg16,...] [--batch 32] [--iters 20] [--tf32]
                             [--out FILE.md] [--quick] [--cpu] [--side both|ours|peer]
                             [--mode solver|pycaffe|published] [--precision fp32|tf32|fp16|bf16]
                             [--forward-only]

Modes (the iteration timed at ``--batch``; the batch-1 forward is the same in all three):

* ``solver`` (default): a training iteration as the Solver runs it (TRAIN phase, below);
* ``pycaffe``: the deploy net in TEST phase with ``force_backward: true``, driven from Python as
  pycaffe scripts drive it, ``net.forward(); net.backward()`` each iteration with a fixed gradient
  on the output blob (BatchNorm on its global statistics); the peer: eval mode, softmax output,
  backward of the same kind of gradient to every weight and the ``requires_grad`` input;
* ``published``: as ``pycaffe``, on ``examples/model_zoo/<net>_published_deploy.prototxt`` (the
  nets written the way the authors' files write them: legacy ``input_dim`` header, ``engine:
  CAFFE`` on depthwise convolutions, BatchNorm and Scale with their own tops; see
  ``model_zoo.published``). The peer is as in ``pycaffe`` mode.

Memory is measured the same way in every mode.

Per net: the median time of a training iteration at ``--batch`` images (forward, loss, backward
to every weight and to the input data; TRAIN phase: dropout on, BatchNorm on batch statistics),
the median batch-1 forward latency (TEST phase / eval mode; on the GPU the peer also as a
CUDA-graph replay: its eval-mode forward captured after warm-up with a static input, replayed;
column ``b1 peer graph ms`` and the ratio ours / replay), and the peak device memory of the
training net. Both sides time each call between device synchronizations (``timing.median_ms``),
after warm-up calls (our conv autotune and CUDA graph capture, cuDNN's benchmark search happen
there). fp32 by default; ``--tf32`` allows TF32 on both sides (ours: ``caffe.set_allow_tf32``;
peer: ``torch.backends.cuda.matmul.allow_tf32`` and ``cudnn.allow_tf32``).
``torch.backends.cudnn.benchmark`` is on.

``--precision fp32|tf32|fp16|bf16`` (issue 34's comparison with PyTorch AMP) builds our nets in
that precision (``caffe.set_precision``: fp16/bf16 store blobs and weights in half and compute in
float32, float32 master weights, fp16 with its adaptive loss scale; tf32 allows TF32, fp32 forbids
it) and runs the peer as AMP runs it: ``channels_last`` model and inputs, ``torch.autocast(dtype=
float16|bfloat16)`` for fp16/bf16, TF32 as the name says. With it the ``solver`` mode times the
whole training iteration, update included, on both sides: ours ``SGDSolver.step(1)`` (SGD,
momentum 0.9, weight decay 1e-4, rate 1e-3), the peer ``torch.optim.SGD`` with the same values,
through ``torch.amp.GradScaler`` for fp16. The batch-1 columns run in the same precision (the
peer's CUDA-graph replay captured under autocast). Without ``--precision`` everything is as above
(no update, NCHW peer, ``--tf32`` or fp32), so earlier tables stay comparable.

``--forward-only``: the timed step is a forward pass at ``--batch`` of the deploy net (TEST phase,
no backward; ours ``net.forward()``, the peer eval mode under ``inference_mode``, eager) instead of
a training iteration, on the mode's files (``--mode published``: the published-style files); the
batch-1 columns are as always (ours against the peer's eager forward and its CUDA-graph replay).
Issue 34's forward-only rows: ``--mode published --forward-only --batch 32`` (fp32: ours vs
eager, and the batch-1 columns: ours vs the graph replay).

Our side runs the deploy prototxts of ``examples/model_zoo`` turned into training nets
(``ours.zoo_param``: batch changed, a label input, Softmax -> SoftmaxWithLoss, BatchNorm on batch
statistics, force_backward), with random He-normal weights; the peer runs torchvision's
architectures (weights=None) with cross-entropy. ResNet-50 (ours has conv1's bias), VGG-16,
SqueezeNet 1.1 and MobileNet v2 are the same networks on both sides; AlexNet/CaffeNet and
GoogLeNet are the BVLC originals on our side (LRN, grouped convs; no BatchNorm) and torchvision's
variants on the peer's (no LRN or groups; GoogLeNet with BatchNorm), so their ratios compare
model families, not identical work.

Isolation: the script runs every (net, side) pair in its own subprocess of this script
(``--worker``), one after the other on the same device, so neither side's memory (our pool, the
peer's caching allocator, cuBLAS/cuDNN workspaces, CUDA context) pollutes the other's figures or
the next net's. Memory: ours is the most the process took from the device after its CUDA context
was created (``backend.memory_held()['peak']``: cuMemGetInfo deltas, our pool plus cuBLAS
workspaces, modules, graphs, noted whenever the pool grew or gave blocks back, so the convolution
autotune's operands count; ``pool`` is what the pool holds at the end); the peer's is ``torch.cuda.max_memory_reserved()`` (its device delta is printed
too). The parent process never touches the GPU. ``--cpu`` runs both sides on the CPU (a smoke
test: no memory figures). Each worker has a time limit (``--timeout``); a failed or timed-out
net is reported and the others still run (exit status 1).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
ZOO = HERE.parent / "examples" / "model_zoo"
RESULT_TAG = "ZOO_RESULT "
MIB = 2**20


class ZooNet(NamedTuple):
    prototxt: str  # in examples/model_zoo
    arch: str  # torchvision.models constructor
    kwargs: dict
    size: int  # input height = width (our prototxt's)


NETS: dict[str, ZooNet] = {
    "resnet50": ZooNet("resnet50_deploy.prototxt", "resnet50", {}, 224),
    "vgg16": ZooNet("vgg16_deploy.prototxt", "vgg16", {}, 224),
    "googlenet": ZooNet("bvlc_googlenet_deploy.prototxt", "googlenet", {"aux_logits": False, "init_weights": True}, 224),
    "alexnet": ZooNet("bvlc_alexnet_deploy.prototxt", "alexnet", {}, 227),
    "caffenet": ZooNet("bvlc_reference_caffenet_deploy.prototxt", "alexnet", {}, 227),
    "squeezenet1_1": ZooNet("squeezenet_v1_1_deploy.prototxt", "squeezenet1_1", {}, 227),
    "mobilenet_v2": ZooNet("mobilenet_v2_deploy.prototxt", "mobilenet_v2", {}, 224),
}
DEFAULT_NETS = "resnet50,vgg16,googlenet,alexnet,squeezenet1_1,mobilenet_v2"
MODES = ("solver", "pycaffe", "published")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")  # pycaffe_lite.precision.PRECISIONS
MODE_TEXT = {
    "solver": "Solver-driven TRAIN",
    "pycaffe": "TEST + force_backward, net.forward(); net.backward()",
    "published": "published-style files, TEST + force_backward, net.forward(); net.backward()",
}


def prototxt(spec: ZooNet, mode: str) -> Path:
    """The deploy file a mode runs: ``published`` the ``*_published_deploy.prototxt`` twin."""
    if mode == "published":
        return ZOO / spec.prototxt.replace("_deploy.prototxt", "_published_deploy.prototxt")
    return ZOO / spec.prototxt


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default=DEFAULT_NETS, help=f"comma-separated, of: {', '.join(NETS)}")
    ap.add_argument("--batch", type=int, default=32, help="training batch (default 32)")
    ap.add_argument("--iters", type=int, default=20, help="timed training iterations (default 20)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed training iterations first (default 5)")
    ap.add_argument("--latency-iters", type=int, default=50, help="timed batch-1 forwards (default 50)")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 on both sides (without --precision: no update, NCHW peer)")
    ap.add_argument("--precision", choices=PRECISIONS, type=str.lower, default=None,
                    help="both sides in this precision, AMP-style (ours: caffe.set_precision; peer: channels_last, "
                         "autocast for fp16/bf16, GradScaler for fp16); the solver mode then includes the SGD update")
    ap.add_argument("--forward-only", action="store_true",
                    help="time a forward pass at --batch (TEST phase, no backward) instead of a training iteration")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (smoke test; no memory figures)")
    ap.add_argument("--side", choices=("both", "ours", "peer"), default="both")
    ap.add_argument("--mode", choices=MODES, default="solver",
                    help="solver: Solver-driven TRAIN (default); pycaffe: TEST + force_backward driven by "
                         "net.forward(); net.backward(); published: pycaffe on the published-style files")
    ap.add_argument("--quick", action="store_true", help="smoke run: batch 4, 2 timed iterations, 1 warm-up")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per net and side (default 180)")
    ap.add_argument("--out", help="append the markdown table to this file")
    ap.add_argument("--worker", choices=("ours", "peer"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.iters, args.warmup, args.latency_iters = 4, 2, 1, 3
    args.net_list = [n.strip() for n in args.nets.split(",") if n.strip()]
    unknown = [n for n in args.net_list if n not in NETS]
    if unknown or not args.net_list:
        ap.error(f"--nets: unknown {unknown or 'empty list'}; known: {', '.join(NETS)}")
    if min(args.batch, args.iters, args.latency_iters) < 1 or args.warmup < 0:
        ap.error("--batch, --iters, --latency-iters must be >= 1 and --warmup >= 0")
    if args.tf32 and args.precision not in (None, "tf32"):
        ap.error(f"--tf32 and --precision {args.precision} contradict each other (--precision tf32 allows TF32)")
    if args.cpu and args.precision == "tf32":
        ap.error("--precision tf32 needs the GPU (TF32 is a mode of its tensor cores): leave out --cpu")
    return args


def step_drive(args: argparse.Namespace) -> str:
    """What each worker times at ``--batch``: ``forward`` (--forward-only), ``update`` (the solver
    mode with --precision: the training iteration with its SGD update), else :func:`drive`."""
    if args.forward_only:
        return "forward"
    if args.precision is not None and args.mode == "solver":
        return "update"
    return drive(args.mode)


def precision_text(args: argparse.Namespace) -> str:
    """How the run's precision reads in the title: ``fp16 (AMP-style)``, ``TF32 allowed``, ``fp32``."""
    if args.precision is not None:
        return f"{args.precision} (AMP-style: peer channels_last{', autocast' if args.precision in ('fp16', 'bf16') else ''})"
    return "TF32 allowed" if args.tf32 else "fp32"


def header(args: argparse.Namespace) -> list[str]:
    """:data:`HEADER` with the timed step named: ``iter`` (training), ``fwd bN`` (--forward-only)."""
    what = f"fwd b{args.batch}" if args.forward_only else "iter"
    return [cell.replace("iter ", f"{what} ", 1) for cell in HEADER]


def run_worker(args: argparse.Namespace) -> int:
    """Measure one net on one side and print its result as one ``ZOO_RESULT {json}`` line."""
    spec = NETS[args.net_list[0]]
    if args.worker == "ours":
        import ours

        res = ours.zoo_net(prototxt(spec, args.mode), args.batch, args.iters, args.warmup, args.latency_iters,
                           gpu=not args.cpu, tf32=args.tf32, drive=step_drive(args), precision=args.precision)
    else:
        import peer_torch

        peer_torch.ALLOW_TF32 = args.tf32
        res = peer_torch.zoo_net(spec.arch, spec.kwargs, spec.size, args.batch, args.iters, args.warmup,
                                 args.latency_iters, device="cpu" if args.cpu else "cuda", drive=step_drive(args),
                                 precision=args.precision)
    print(RESULT_TAG + json.dumps(res), flush=True)
    return 0


def drive(mode: str) -> str:
    """How a mode drives the net: ``solver`` or ``pycaffe`` (``published`` is pycaffe-driven)."""
    return "solver" if mode == "solver" else "pycaffe"


def spawn(args: argparse.Namespace, side: str, net: str) -> dict:
    """Run one worker; its result dict, or ``{"error": why}``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", side, "--nets", net,
           "--batch", str(args.batch), "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--latency-iters", str(args.latency_iters), "--mode", args.mode]
    cmd += ["--tf32"] * args.tf32 + ["--cpu"] * args.cpu + ["--forward-only"] * args.forward_only
    cmd += ["--precision", args.precision] if args.precision else []
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            res = json.loads(line[len(RESULT_TAG):])
            res["wall_s"] = time.perf_counter() - start
            return res
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
    print(f"  [{side} {net}] worker failed (exit {proc.returncode}):\n{tail}", file=sys.stderr, flush=True)
    last = tail.splitlines()[-1] if tail else f"exit {proc.returncode}"
    return {"error": last[:200]}


def _get(res: dict | None, *keys: str) -> float | None:
    for key in keys:
        if not isinstance(res, dict) or key not in res:
            return None
        res = res[key]
    return res


def _fmt(value: float | None, res: dict | None, spec: str) -> str:
    """``value`` formatted; ``-`` where the side did not run (or has no such figure), ``error``
    where it failed."""
    if value is not None:
        return format(value, spec)
    return "error" if res is not None and "error" in res else "-"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def row(net: str, mine: dict | None, peer: dict | None) -> list[str]:
    """Table cells: iteration ms (ours, peer, ratio), batch-1 ms (same), the peer's batch-1
    CUDA-graph replay ms and ours / replay, memory MiB (ours: peak device delta; peer: max reserved;
    ratio), then our pool's share and the peer's device delta."""
    cells = [net]
    for key in ("train_ms", "latency_ms"):
        a, b = _get(mine, key), _get(peer, key)
        cells += [_fmt(a, mine, ".2f"), _fmt(b, peer, ".2f"), _ratio(a, b)]
    g = _get(peer, "latency_graph_ms")
    cells += [_fmt(g, peer, ".2f"), _ratio(_get(mine, "latency_ms"), g)]
    a, b = _get(mine, "memory", "peak"), _get(peer, "memory", "reserved")
    pool, peer_dev = _get(mine, "memory", "pool"), _get(peer, "memory", "device")
    mib = [None if v is None else v / MIB for v in (a, b, pool, peer_dev)]
    cells += [_fmt(mib[0], mine, ".0f"), _fmt(mib[1], peer, ".0f"), _ratio(a, b),
              _fmt(mib[2], mine, ".0f"), _fmt(mib[3], peer, ".0f")]
    return cells


def graphs(mine: dict | None) -> str:
    """`` | ours: N CUDA graph replays`` (GPU), else empty: shows whether whole-net replay worked."""
    n = _get(mine, "graph_replays")
    return f" | ours: {n} CUDA graph replays" if n is not None else ""


HEADER = ["net", "iter ours ms", "iter peer ms", "ours/peer", "b1 fwd ours ms", "b1 fwd peer ms", "ours/peer",
          "b1 peer graph ms", "ours/graph", "mem ours MiB", "mem peer MiB", "ours/peer", "ours pool MiB", "peer device MiB"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return run_worker(args)
    import peer_torch

    peer_reason = peer_torch.torchvision_available() if args.side != "ours" else "not requested (--side ours)"
    if peer_reason and args.side == "peer":
        raise SystemExit(f"zoo.py: the peer cannot run: {peer_reason}")
    prec = precision_text(args)
    what = f"forward-only at batch {args.batch}" if args.forward_only else f"batch {args.batch}"
    print(f"zoo: mode {args.mode} ({MODE_TEXT[args.mode]}), timed step: {step_drive(args)}; "
          f"nets {', '.join(args.net_list)}; {what}, {args.iters} timed iterations after {args.warmup}; "
          f"{'CPU' if args.cpu else 'GPU'} {prec}; peer: {peer_reason or 'PyTorch + torchvision'}", flush=True)
    if peer_reason and args.side == "both":
        print(f"zoo: PEER MISSING, only our side runs: {peer_reason}", flush=True)
    rows, failed, device, versions = [], False, None, None
    for net in args.net_list:
        mine = spawn(args, "ours", net) if args.side != "peer" else None
        peer = spawn(args, "peer", net) if not peer_reason else None
        for res in (mine, peer):
            if res is not None and "error" in res:
                failed = True
        device = device or next((r["device"] for r in (mine, peer) if r and "device" in r), None)
        versions = versions or (peer or {}).get("version")
        cells = row(net, mine, peer)
        rows.append(cells)
        errors = "; ".join(f"{s} error: {r['error']}" for s, r in (("ours", mine), ("peer", peer)) if r and "error" in r)
        label = f"fwd b{args.batch}" if args.forward_only else f"iter b{args.batch}"
        print(f"{net:14s} {label}: ours {cells[1]} ms, peer {cells[2]} ms ({cells[3]}) | "
              f"b1 fwd: ours {cells[4]} ms, peer {cells[5]} ms ({cells[6]}), peer graph {cells[7]} ms "
              f"({cells[8]}) | mem: ours {cells[9]} MiB (pool {cells[12]}), peer {cells[10]} MiB reserved "
              f"(device {cells[13]}) ({cells[11]}){graphs(mine)}{' | ' + errors if errors else ''}", flush=True)
    title = (f"{datetime.date.today()} on {device or 'unknown device'} ({prec}), {what}, "
             f"mode {args.mode} ({MODE_TEXT[args.mode]}), timed step: {step_drive(args)}")
    lines = [f"\n### {title}\n", f"`python benchmarks/zoo.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
             + (f" (peer: {versions})" if versions else "") + "\n",
             "| " + " | ".join(header(args)) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(table)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
