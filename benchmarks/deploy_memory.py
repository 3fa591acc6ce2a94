"""Peak device memory of deploy-net forwards (TEST phase, no force_backward) at batch 32.

    python benchmarks/deploy_memory.py [--nets resnet50,vgg16,...] [--batch 32]

Each net runs in its own subprocess (so memory is counted from a fresh CUDA context, as in
``zoo.py``): build the model-zoo deploy net, two forwards (the second a CUDA-graph replay), then
print what the process holds from the device (``backend.memory_held()``). The issue's target:
at most half of the same net's training step, which ``zoo.py`` reports.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "examples" / "model_zoo"
FILES = {"resnet50": "resnet50", "vgg16": "vgg16", "googlenet": "bvlc_googlenet", "alexnet": "bvlc_alexnet",
         "squeezenet1_1": "squeezenet_v1_1", "mobilenet_v2": "mobilenet_v2"}


def worker(name: str, batch: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import numpy as np
    import ours

    import pycaffe_lite as caffe
    from pycaffe_lite.gpu import backend

    caffe.set_mode_gpu()
    backend.state()
    net = caffe.Net(ours.zoo_param(ZOO / f"{FILES[name]}_deploy.prototxt", batch, train=False), caffe.TEST)
    ours.randomize_params(net)
    net.blobs["data"].data[...] = np.random.default_rng(0).standard_normal(net.blobs["data"].shape)
    for _ in range(3):
        net.forward_prefilled()
    backend.synchronize()
    return {"net": name, "batch": batch, **backend.memory_held(), "fusions": len(net.executor.fusions)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="resnet50,vgg16,squeezenet1_1,mobilenet_v2")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch)))
        return 0
    for name in args.nets.split(","):
        proc = subprocess.run([sys.executable, __file__, "--worker", name, "--batch", str(args.batch)],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode:
            print(f"{name}: error\n{proc.stderr[-2000:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name:14s} deploy b{r['batch']} forward: {r['device'] / 2**20:8.0f} MiB held "
              f"(pool {r['pool'] / 2**20:.0f} MiB), {r['fusions']} Conv+BN(+Scale) fusions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
