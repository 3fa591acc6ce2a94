"""Write the model zoo's deploy prototxts (``<model>_deploy.prototxt``) with
``model_zoo.py`` (this folder).

    python examples/model_zoo/generate.py [--out DIR] [--models NAME ...] [--summary] [--published]

``--published`` writes ``<model>_published_deploy.prototxt`` instead: the same nets in the style of
the authors' files (legacy ``input_dim`` header, ``engine: CAFFE`` on depthwise convolutions,
BatchNorm and Scale with tops of their own; ``model_zoo.published``).

``--summary`` also builds each net (CPU, weights from the prototxt fillers) and prints its layer
count, parameter counts and output blobs; VGG-16 and FCN-32s each allocate about 550 MB.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import model_zoo  # noqa: E402

import pycaffe_lite as caffe  # noqa: E402


def summarize(name: str, path: Path) -> str:
    """One line: layers, all parameter values, learnable ones (no BatchNorm statistics, no
    lr_mult 0 blobs) and the output blob shapes at the prototxt's input size."""
    net = caffe.Net(str(path), caffe.TEST)
    spec = {lp.name: lp for lp in model_zoo.MODELS[name]().layer}
    total = learnable = 0
    for lname, blobs in net.params.items():
        lp = spec[lname]
        for j, blob in enumerate(blobs):
            total += blob.count
            frozen = lp.type == "BatchNorm" or (j < len(lp.param) and lp.param[j].lr_mult == 0)
            learnable += 0 if frozen else blob.count
    n_layers = sum(1 for layer in net.layers if layer.type != "Split")
    outs = ", ".join(f"{o} {tuple(net.blobs[o].shape)}" for o in net.outputs)
    return f"{name:24s} {n_layers:4d} layers  {learnable:>12,d} learnable  {total:>12,d} total  -> {outs}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="output folder")
    ap.add_argument("--models", nargs="*", choices=list(model_zoo.MODELS), help="default: all")
    ap.add_argument("--summary", action="store_true", help="build each net and print its parameter counts")
    ap.add_argument("--published", action="store_true",
                    help="write <model>_published_deploy.prototxt (the published files' style)")
    args = ap.parse_args(argv)
    paths = model_zoo.write_all(args.out, args.models, "published" if args.published else "ours")
    for name, path in paths.items():
        print(summarize(name, path) if args.summary else f"{name:24s} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
