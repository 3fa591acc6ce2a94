"""End-to-end Faster R-CNN training on synthetic pictures with the ported Python layers
(RoIDataLayer, AnchorTargetLayer, ProposalLayer, ProposalTargetLayer), SmoothL1Loss and ROIPooling.

    python examples/faster_rcnn/train.py [--iters 20] [--gpu N] [--out DIR]

Each picture holds a few filled rectangles labelled by colour (3 classes + background). The loop
is pycaffe-lite's SGD solver on the train net of build_net.py; it prints the four losses (RPN
classification and box, detector classification and box) and writes the final weights, which
``detect.py --weights`` can load.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import build_net  # noqa: E402

build_net.add_lib_path()

from fast_rcnn.config import cfg  # noqa: E402

import pycaffe_lite as caffe  # noqa: E402

COLOURS = np.array([[0, 0, 220], [0, 200, 0], [220, 0, 0]], np.uint8)  # BGR of classes 1, 2, 3


def synthetic_roidb(n: int, seed: int = 0, h: int = 160, w: int = 200) -> list[dict]:
    rng = np.random.default_rng(seed)
    roidb = []
    for _ in range(n):
        im = np.full((h, w, 3), 128, np.uint8)
        boxes, classes = [], []
        for _ in range(rng.integers(1, 4)):
            bw, bh = rng.integers(40, 100), rng.integers(40, 100)
            x1, y1 = rng.integers(0, w - bw), rng.integers(0, h - bh)
            c = int(rng.integers(1, 4))
            im[y1:y1 + bh, x1:x1 + bw] = COLOURS[c - 1]
            boxes.append([x1, y1, x1 + bw - 1, y1 + bh - 1])
            classes.append(c)
        roidb.append({"image": im, "boxes": np.array(boxes, np.float64), "gt_classes": np.array(classes)})
    return roidb


def make_solver(tmp: Path, base_lr: float, classes: int):
    (tmp / "train.prototxt").write_text(str(build_net.train_net(classes)))
    (tmp / "solver.prototxt").write_text(
        f'net: "{tmp / "train.prototxt"}"\nbase_lr: {base_lr}\nlr_policy: "fixed"\nmomentum: 0.9\n'
        'weight_decay: 0.0005\ndisplay: 0\nmax_iter: 100000\nsnapshot: 0\n'
        f'snapshot_prefix: "{tmp / "frcnn"}"\n')
    return caffe.SGDSolver(str(tmp / "solver.prototxt"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--scale", type=int, default=160)
    parser.add_argument("--gpu", type=int, default=-1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=".", help="folder for faster_rcnn_small.caffemodel")
    args = parser.parse_args(argv)
    if args.gpu >= 0:
        caffe.set_mode_gpu()
        caffe.set_device(args.gpu)
    caffe.set_random_seed(args.seed)
    np.random.seed(args.seed)  # the sampling of the target layers
    cfg.TRAIN.SCALES, cfg.TRAIN.MAX_SIZE = (args.scale,), 2 * args.scale
    cfg.TRAIN.RPN_BATCHSIZE, cfg.TRAIN.BATCH_SIZE = 64, 32
    cfg.TRAIN.RPN_PRE_NMS_TOP_N, cfg.TRAIN.RPN_POST_NMS_TOP_N = 600, 100
    with tempfile.TemporaryDirectory() as tmp:
        solver = make_solver(Path(tmp), args.lr, 4)
    net = solver.net
    net.layers[list(net.layer_dict).index("input-data")].set_roidb(synthetic_roidb(args.images, args.seed))
    names = ("rpn_loss_cls", "rpn_loss_bbox", "loss_cls", "loss_bbox")
    history = []
    for it in range(args.iters):
        solver.step(1)
        losses = [float(net.blobs[n].data) for n in names]
        history.append(losses)
        print(f"iter {it + 1:3d}  " + "  ".join(f"{n} {v:.4f}" for n, v in zip(names, losses)))
    out = Path(args.out) / "faster_rcnn_small.caffemodel"
    net.save(str(out))
    print(f"wrote {out}")
    return 0 if np.isfinite(history).all() else 1


if __name__ == "__main__":
    sys.exit(main())
