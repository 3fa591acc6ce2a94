"""Peak device memory of deploy-net forwards (TEST phase, no force_backward) at batch 32.

    python benchmarks/deploy_memory.py [--nets resnet50,vgg16,...] [--batch 32] [--plan]
    python benchmarks/deploy_memory.py --train-plan [--nets resnet50] [--batch 256] [--precision fp16]

Each net runs in its own subprocess (so memory is counted from a fresh CUDA context, as in
``zoo.py``): build the model-zoo deploy net, three forwards (a plain run, a CUDA-graph capture, a
replay), then print what the process holds from the device (``backend.memory_held()``); once with
intermediate blobs sharing memory (the default, ``shared_data.SharedData``) and once with
``PYCAFFE_LITE_SHARE_DATA=0`` for reference; and, in a third subprocess, what the same net's
batch-32 training step holds (``zoo.py``'s measurement), so the ratio the issue targets (deploy at
most half of training) comes from one run. ``--plan`` needs no GPU: it builds the nets on the CPU
and prints the bytes of their blobs' data alone and with the shared-data plan. ``--train-plan``
needs no GPU either: it builds the training variant (``ours.zoo_param(train=True)``) under an SGD
solver (momentum: one history blob per learnable param; half nets add float32 master weights) in
``--precision`` on the CPU and counts what a training iteration keeps: the blobs' data and diffs,
params (data and diff), history and masters, with the gradient plan alone (before) and with the
forward-only data inside its slots (after, ``memory_plan.training_slots``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "examples" / "model_zoo"
FILES = {"resnet50": "resnet50", "vgg16": "vgg16", "googlenet": "bvlc_googlenet", "alexnet": "bvlc_alexnet",
         "squeezenet1_1": "squeezenet_v1_1", "mobilenet_v2": "mobilenet_v2"}


def _net(name: str, batch: int):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ours

    import pycaffe_lite as caffe

    return caffe.Net(ours.zoo_param(ZOO / f"{FILES[name]}_deploy.prototxt", batch, train=False), caffe.TEST)


def worker(name: str, batch: int) -> dict:
    import numpy as np

    from pycaffe_lite.gpu import backend

    backend.state()
    net = _net(name, batch)
    import ours  # (on the path now)

    ours.randomize_params(net)
    net.blobs["data"].data[...] = np.random.default_rng(0).standard_normal(net.blobs["data"].shape)
    for _ in range(3):
        net.forward_prefilled()
    backend.synchronize()
    slots, alone = net.executor.shared_data.planned_bytes()
    return {"net": name, "batch": batch, **backend.memory_held(), "fusions": len(net.executor.fusions),
            "slots": slots, "alone": alone}


def train_worker(name: str, batch: int) -> dict:
    """What the process holds after training steps of the net (zoo.py's our-side measurement)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ours

    from pycaffe_lite.gpu import backend

    step, check = ours.zoo_step(ZOO / f"{FILES[name]}_deploy.prototxt", batch)
    for _ in range(5):
        step()
    backend.synchronize()
    return check()["memory"]


def plan(name: str, batch: int) -> str:
    """The shared-data plan's bytes on the CPU (no forward runs)."""
    from pycaffe_lite.runtime.memory_plan import shared_data_slots

    net = _net(name, batch).graph
    memories = {id(b.data_memory): b.data_memory.nbytes for b in net.blobs}
    slots = [s for s in shared_data_slots(net) if len(s[1]) > 1]
    planned = sum(net.blobs[g[0]].data_memory.nbytes for _, groups in slots for g in groups)
    blobs = sum(memories.values())
    shared = blobs - planned + sum(n for n, _ in slots)
    return (f"{name:14s} b{batch} blob data: {blobs / 2**20:7.0f} MiB alone, {shared / 2**20:6.0f} MiB shared "
            f"({len(slots)} slots for {sum(len(g) for _, g in slots)} of {len(memories)} data memories)")


def train_plan(name: str, batch: int, precision: str = "fp32") -> str:
    """A training iteration's bytes counted on the CPU (no pass runs), before and after the
    forward-only data moves into the gradient slots."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import pycaffe_lite as caffe
    from pycaffe_lite import common

    context = common.context()
    mode, previous = context.mode, context.precision
    caffe.set_mode_cpu()
    caffe.set_precision(precision)
    try:
        return _train_plan(name, batch, precision)
    finally:
        context.mode = mode
        caffe.set_precision(previous)


def _train_plan(name: str, batch: int, precision: str) -> str:
    import ours

    import pycaffe_lite as caffe
    from pycaffe_lite.runtime.memory_plan import training_blob_bytes, training_data_blobs
    from pycaffe_lite.schema import caffe_pb2

    sp = caffe_pb2.SolverParameter()
    # Built at batch 1 and reshaped: a half net's set-up on the host converts every bottom into
    # float copies (layer.MathView), which at batch 256 would take tens of GiB; a reshape allocates nothing.
    sp.net_param.CopyFrom(ours.zoo_param(ZOO / f"{FILES[name]}_deploy.prototxt", 1, train=True))
    sp.base_lr, sp.momentum, sp.lr_policy, sp.max_iter, sp.display, sp.snapshot = 1e-3, 0.9, "fixed", 1, 0, 0
    sp.snapshot_after_train = False
    solver = caffe.get_solver(sp, progress=False)
    for top in ("data", "label"):
        blob = solver.net.blobs[top]
        blob.reshape(batch, *blob.shape[1:])
    solver.net.reshape()
    net = solver.net.graph
    memories = {id(m): m.nbytes for blob in net.params_list for m in (blob.data_memory, blob.diff_memory)}
    params = sum(memories.values())
    update = solver.update
    history = sum(h.data_memory.nbytes for h in update.history)
    masters = sum(m.data_memory.nbytes + m.diff_memory.nbytes for m in update.masters if m is not None)
    alone, before = training_blob_bytes(net, data=False)
    _, after = training_blob_bytes(net, data=True)
    shared = training_data_blobs(net)
    forward_only = sum({id(net.blobs[b].data_memory): net.blobs[b].data_memory.nbytes for b in shared}.values())
    rest = params + history + masters
    mib = 2**20
    return (f"{name:14s} {precision} b{batch} training iteration: {(before + rest) / mib:8.0f} MiB before, "
            f"{(after + rest) / mib:8.0f} MiB after (blobs data+diff {alone / mib:.0f} MiB alone, {before / mib:.0f} "
            f"with shared diffs, {after / mib:.0f} with {len(shared)} forward-only data blobs of "
            f"{forward_only / mib:.0f} MiB in the gradient slots; params {params / mib:.0f}, history "
            f"{history / mib:.0f}, masters {masters / mib:.0f} MiB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="resnet50,vgg16,squeezenet1_1,mobilenet_v2,googlenet")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--plan", action="store_true", help="print the CPU-counted plan only (no GPU)")
    ap.add_argument("--train-plan", action="store_true",
                    help="print a training iteration's CPU-counted bytes before and after (no GPU)")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "bf16"), help="with --train-plan")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--train-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch)))
        return 0
    if args.train_worker:
        print(json.dumps(train_worker(args.train_worker, args.batch)))
        return 0
    for name in args.nets.split(","):
        if args.train_plan:
            print(train_plan(name, args.batch, args.precision))
            continue
        if args.plan:
            print(plan(name, args.batch))
            continue
        held = {}
        for what, share in (("--worker", "1"), ("--worker", "0"), ("--train-worker", "1")):
            proc = subprocess.run([sys.executable, __file__, what, name, "--batch", str(args.batch)],
                                  capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "PYCAFFE_LITE_SHARE_DATA": share})
            if proc.returncode:
                print(f"{name}: error\n{proc.stderr[-2000:]}")
                break
            held[what + share] = json.loads(proc.stdout.strip().splitlines()[-1])
        else:
            r, train = held["--worker1"], held["--train-worker1"]["device"]
            print(f"{name:14s} deploy b{r['batch']} forward: {r['device'] / 2**20:8.0f} MiB held = "
                  f"{r['device'] / train:.2f}x of the training step's {train / 2**20:.0f} MiB (pool "
                  f"{r['pool'] / 2**20:.0f} MiB; shared data: {r['slots'] / 2**20:.0f} MiB of slots for "
                  f"{r['alone'] / 2**20:.0f} MiB of blobs); {held['--worker0']['device'] / 2**20:.0f} MiB without "
                  f"sharing (PYCAFFE_LITE_SHARE_DATA=0); {r['fusions']} fusions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
