"""Peak device memory of deploy-net forwards (TEST phase, no force_backward) at batch 32.

    python benchmarks/deploy_memory.py [--nets resnet50,vgg16,...] [--batch 32] [--plan]

Each net runs in its own subprocess (so memory is counted from a fresh CUDA context, as in
``zoo.py``): build the model-zoo deploy net, three forwards (a plain run, a CUDA-graph capture, a
replay), then print what the process holds from the device (``backend.memory_held()``); once with
intermediate blobs sharing memory (the default, ``shared_data.SharedData``) and once with
``PYCAFFE_LITE_SHARE_DATA=0`` for reference; and, in a third subprocess, what the same net's
batch-32 training step holds (``zoo.py``'s measurement), so the ratio the issue targets (deploy at
most half of training) comes from one run. ``--plan`` needs no GPU: it builds the nets on the CPU
and prints the bytes of their blobs' data alone and with the shared-data plan.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="resnet50,vgg16,squeezenet1_1,mobilenet_v2,googlenet")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--plan", action="store_true", help="print the CPU-counted plan only (no GPU)")
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
