"""Where a training iteration's device memory goes: a zoo net stepped by the solver on synthetic
input, each device allocation of 1 MiB or more traced to what owns it. GPU only.

    python3 benchmarks/train_memory.py [--net resnet50] [--precision fp16] [--batch 256] [--steps 8]

Prints ``backend.memory_held()`` after the build and after each step (``device``: the driver's count
since the context was made; ``peak``: its most so far, what PyTorch's peak reserved memory is compared
with; ``pool``: what our pool holds, in use or cached; ``active``: in use), then what is live after the last step, in MiB: net blob data
and diffs, buffers layers keep in blobs of their own (the largest by layer and attribute), and the
rest by call site (memory plans' slots, the workspace, cuBLAS).
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deploy_memory import FILES, ZOO  # noqa: E402

MiB = 1 << 20


class Tracer:
    """Wraps ``backend.alloc``: each live allocation of 1 MiB or more with the ``SyncedMemory`` that
    asked for it (``id``) or, for the others, the package call site."""

    def __init__(self, backend) -> None:
        self.backend, self.real = backend, backend.alloc
        self.live: dict[int, tuple[int, int | None, str]] = {}  # serial -> (bytes, owner id, site)
        self.serial = 0
        backend.alloc = self.alloc

    def alloc(self, nbytes: int):
        block = self.real(nbytes)
        if nbytes >= MiB:
            self.serial += 1
            self.live[self.serial] = (int(nbytes), self._owner(), self._site())
            weakref.finalize(block, self.live.pop, self.serial, None)
        return block

    @staticmethod
    def _owner() -> int | None:
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.endswith("synced_memory.py"):
            me = frame.f_locals.get("self")
            if type(me).__name__ == "SyncedMemory":
                return id(me)
            frame = frame.f_back
        return None

    @staticmethod
    def _site() -> str:
        frames = [f for f in traceback.extract_stack()[:-2] if "/pycaffe_lite/" in f.filename][-3:]
        return " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))


def owners(solver) -> dict[int, tuple[str, str]]:
    """``id(SyncedMemory)`` -> (kind, name) for the net's blobs and params, layers' own blobs and
    the solver's history and master weights."""
    from pycaffe_lite.blob import Blob

    net = solver.net.graph
    out: dict[int, tuple[str, str]] = {}

    def note(blob, kind: str, name: str) -> None:
        out.setdefault(id(blob.data_memory), (f"{kind} data", name))
        out.setdefault(id(blob.diff_memory), (f"{kind} diff", name))

    for name, blob in zip(net.blob_names, net.blobs):
        note(blob, "net blob", name)
    for blob, (k, i) in zip(net.params_list, net.param_layer_indices):
        note(blob, "param", f"{net.layer_names[k]}[{i}]")
    for kind in ("history", "masters"):
        for i, blob in enumerate(getattr(solver.update, kind, [])):
            if blob is not None:
                note(blob, f"solver {kind}", str(i))
    for layer in net.layers:
        for attr, value in vars(layer).items():
            for i, blob in enumerate(value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(blob, Blob):
                    note(blob, "layer", f"{layer.layer_param.name}.{attr}[{i}]")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", default="resnet50", choices=sorted(FILES))
    ap.add_argument("--precision", default="fp16", choices=["fp32", "tf32", "fp16", "bf16"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--top", type=int, default=12, help="rows of layers' own buffers and of call sites")
    args = ap.parse_args()

    import numpy as np
    import ours

    import pycaffe_lite as caffe
    from pycaffe_lite.gpu import backend
    from pycaffe_lite.schema import caffe_pb2

    caffe.set_mode_gpu()
    caffe.set_precision(args.precision)
    backend.state()
    tracer = Tracer(backend)

    def held(tag: str) -> None:
        m = backend.memory_held()
        print(f"{tag:>8}: device {m['device'] / MiB:8.0f}  peak {m['peak'] / MiB:8.0f}  pool {m['pool'] / MiB:8.0f}  "
              f"active {m['pool_active'] / MiB:8.0f} MiB", flush=True)

    param = ours.zoo_param(ZOO / f"{FILES[args.net]}_deploy.prototxt", args.batch, train=True)
    param.force_backward = False  # as a solver's net: no gradient for the input
    sp = caffe_pb2.SolverParameter(net_param=param, base_lr=1e-3, momentum=0.9, lr_policy="fixed",
                                   max_iter=10**6, display=0, snapshot_after_train=False, random_seed=1)
    solver = caffe.get_solver(sp, progress=False)
    solver.stop_on_nonfinite_loss = False
    ours.randomize_params(solver.net)
    data = solver.net.blobs["data"]
    data.data[...] = np.random.default_rng(0).normal(0, 50, data.shape)
    print(f"{args.net} {args.precision} batch {args.batch}, {args.steps} solver steps")
    held("built")
    for step in range(args.steps):
        solver.step(1)
        backend.synchronize()
        held(f"step {step}")

    names = owners(solver)
    kinds: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    layer_own: list[tuple[int, str]] = []
    sites: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for nbytes, owner, site in tracer.live.values():
        kind, name = names.get(owner, ("", "")) if owner is not None else ("", "")
        if not kind:
            sites[site][0] += nbytes
            sites[site][1] += 1
            continue
        kinds[kind][0] += nbytes
        kinds[kind][1] += 1
        if kind.startswith("layer"):
            layer_own.append((nbytes, f"{name}.{kind.split()[-1]}"))
    total = sum(n for n, _, _ in tracer.live.values())
    print(f"live after step {args.steps - 1}, allocations of 1 MiB or more: {total / MiB:.0f} MiB")
    for kind, (nbytes, count) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"  {nbytes / MiB:9.1f} MiB in {count:4d}  {kind}")
    print("  layers' own buffers, largest:")
    for nbytes, name in sorted(layer_own, reverse=True)[:args.top]:
        print(f"  {nbytes / MiB:9.1f} MiB        {name}")
    print("  the rest by call site:")
    for site, (nbytes, count) in sorted(sites.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"  {nbytes / MiB:9.1f} MiB in {count:4d}  {site}")


if __name__ == "__main__":
    main()
