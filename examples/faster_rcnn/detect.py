"""Faster R-CNN inference end to end with the ported Python layers: RPN, proposals (NMS on the GPU
in GPU mode), ROIPooling, classification and box regression, per-class NMS, boxes drawn into a PNG.

    python examples/faster_rcnn/detect.py [--image IMG] [--out detections.png] [--gpu N]

The net is the small ZF-style net of build_net.py with random weights (seeded; ``--weights`` loads
a caffemodel trained for it instead), so the boxes show that the pipeline runs, not what is in the
picture. Without ``--image`` a synthetic picture is drawn.
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

from fast_rcnn.bbox_transform import bbox_transform_inv, clip_boxes  # noqa: E402
from fast_rcnn.config import cfg  # noqa: E402
from nms import nms  # noqa: E402
from roi_data_layer.layer import prep_image  # noqa: E402

import pycaffe_lite as caffe  # noqa: E402


def synthetic_image(h=240, w=320, seed=0) -> np.ndarray:
    """BGR uint8 picture with a few filled rectangles on a gradient."""
    rng = np.random.default_rng(seed)
    im = np.zeros((h, w, 3), np.uint8)
    im[...] = np.linspace(40, 200, w, dtype=np.uint8)[None, :, None]
    for _ in range(4):
        x1, y1 = rng.integers(0, w - 60), rng.integers(0, h - 60)
        bw, bh = rng.integers(30, 120), rng.integers(30, 120)
        im[y1:y1 + bh, x1:x1 + bw] = rng.integers(0, 255, 3)
    return im


def im_detect(net, im: np.ndarray):
    """(scores (R, K), boxes (R, 4K)) for a BGR image, in the image's pixels."""
    blob, scale = prep_image(im, cfg.TEST.SCALES[0], cfg.TEST.MAX_SIZE)
    data = blob.transpose(2, 0, 1)[None]
    net.blobs["data"].reshape(*data.shape)
    net.blobs["im_info"].reshape(1, 3)
    out = net.forward(data=data.astype(np.float32),
                      im_info=np.array([[data.shape[2], data.shape[3], scale]], np.float32))
    rois = net.blobs["rois"].data[:, 1:5].astype(np.float64) / scale
    scores = out["cls_prob"].astype(np.float64)
    deltas = net.blobs["bbox_pred"].data.astype(np.float64)
    boxes = clip_boxes(bbox_transform_inv(rois, deltas), im.shape)
    return scores, boxes


def detect(net, im, conf_thresh=0.0, nms_thresh=None):
    """Per-class detections after NMS: a list of (class, score, x1, y1, x2, y2), best first."""
    nms_thresh = cfg.TEST.NMS if nms_thresh is None else nms_thresh
    scores, boxes = im_detect(net, im)
    found = []
    for j in range(1, scores.shape[1]):
        idx = np.flatnonzero(scores[:, j] > conf_thresh)
        b, s = boxes[idx, 4 * j:4 * j + 4], scores[idx, j]
        for k in nms(b, s, nms_thresh):
            found.append((j, float(s[k]), *map(float, b[k])))
    found.sort(key=lambda d: -d[1])
    return found


def draw(im: np.ndarray, detections, path: Path, top: int = 10) -> None:
    from PIL import Image, ImageDraw

    img = Image.fromarray(np.ascontiguousarray(im[:, :, ::-1]))
    pen = ImageDraw.Draw(img)
    for cls, score, x1, y1, x2, y2 in detections[:top]:
        pen.rectangle([x1, y1, x2, y2], outline=(255, 40, 40), width=2)
        pen.text((x1 + 2, y1 + 2), f"{cls}:{score:.3f}", fill=(255, 255, 0))
    img.save(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="an image file (default: a synthetic picture)")
    parser.add_argument("--out", default="detections.png", help="PNG with the boxes drawn")
    parser.add_argument("--weights", help="a caffemodel for the net of build_net.py (default: random)")
    parser.add_argument("--classes", type=int, default=21)
    parser.add_argument("--scale", type=int, default=224, help="short side of the network input")
    parser.add_argument("--gpu", type=int, default=-1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.gpu >= 0:
        caffe.set_mode_gpu()
        caffe.set_device(args.gpu)
    caffe.set_random_seed(args.seed)
    cfg.TEST.SCALES = (args.scale,)
    cfg.TEST.MAX_SIZE = 2 * args.scale
    with tempfile.TemporaryDirectory() as tmp:
        proto = Path(tmp) / "deploy.prototxt"
        proto.write_text(str(build_net.deploy_net(args.classes, size=(args.scale, args.scale))))
        net = caffe.Net(str(proto), caffe.TEST, weights=args.weights)
    if args.image:
        im = (caffe.io.load_image(args.image)[:, :, ::-1] * 255).astype(np.uint8)
    else:
        im = synthetic_image()
    found = detect(net, im)
    print(f"{len(net.blobs['rois'].data)} proposals, {len(found)} detections after per-class NMS")
    for cls, score, x1, y1, x2, y2 in found[:5]:
        print(f"  class {cls:2d}  score {score:.4f}  box ({x1:.0f}, {y1:.0f}, {x2:.0f}, {y2:.0f})")
    draw(im, found, Path(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
