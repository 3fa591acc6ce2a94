"""Run an SSD deploy net on an image and draw its detections into a PNG.

    python examples/ssd/detect.py --net ssdlite --image photo.jpg --out detections.png
    python examples/ssd/detect.py --net ssd300 --model deploy.prototxt --weights ssd.caffemodel --image x.jpg

Without ``--weights`` the net gets random weights (the boxes are then meaningless, but the whole
pipeline runs: resize, mean subtraction, forward, DetectionOutput, drawing). Without ``--image``
a synthetic test image is used. ``--model`` takes any SSD deploy prototxt in the fork's layout
(an Input of shape (1, 3, H, W) and a DetectionOutput top); otherwise ``--net`` builds one with
``ssd_nets.py``. The ``--max-boxes`` best boxes with a score of at least ``--threshold`` are drawn,
labelled by class id (or by ``--labels``, a file with one class name per line, background first);
the net's DetectionOutput already dropped those below its ``confidence_threshold``. Random
weights are announced with a warning line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ssd_nets  # noqa: E402

import pycaffe_lite as caffe  # noqa: E402
from pycaffe_lite.optional import require  # noqa: E402

MEAN = np.array([104, 117, 123], np.float32)  # BGR, as the SSD models were trained


def synthetic_image(h: int = 360, w: int = 480) -> np.ndarray:
    """An RGB uint8 test image: a gradient with a few coloured rectangles."""
    img = np.zeros((h, w, 3), np.uint8)
    img[..., 0] = np.linspace(40, 200, w)[None, :]
    img[..., 1] = np.linspace(60, 160, h)[:, None]
    img[..., 2] = 90
    for (y0, x0, y1, x1), colour in [((40, 50, 200, 180), (220, 40, 40)), ((150, 250, 330, 440), (40, 200, 60)),
                                     ((20, 300, 110, 460), (30, 60, 220))]:
        img[y0:y1, x0:x1] = colour
    return img


def detect(net: caffe.Net, rgb: np.ndarray) -> np.ndarray:
    """Rows [image, label, score, xmin, ymin, xmax, ymax] (relative coordinates) for one RGB image."""
    _, _, h, w = net.blobs["data"].shape
    resized = caffe.io.resize(rgb.astype(np.float32), h, w)
    bgr = resized[..., ::-1] - MEAN
    net.blobs["data"].data[0] = bgr.transpose(2, 0, 1)
    out = net.forward()
    return out["detection_out"].reshape(-1, 7)


def draw(rgb: np.ndarray, dets: np.ndarray, path: Path, threshold: float, names: list[str] | None) -> int:
    """Draw the detections with score >= threshold into a PNG; returns how many were drawn."""
    Image = require("PIL.Image", feature="drawing detections")
    ImageDraw = require("PIL.ImageDraw", feature="drawing detections")
    img = Image.fromarray(rgb)
    pen = ImageDraw.Draw(img)
    h, w = rgb.shape[:2]
    drawn = 0
    for _, label, score, x0, y0, x1, y1 in dets:
        if label < 0 or score < threshold:
            continue
        hue = (int(label) * 67) % 360
        colour = tuple(int(255 * v) for v in _hsv(hue / 360.0))
        box = [float(np.clip(x0, 0, 1)) * w, float(np.clip(y0, 0, 1)) * h,
               float(np.clip(x1, 0, 1)) * w, float(np.clip(y1, 0, 1)) * h]
        pen.rectangle(box, outline=colour, width=2)
        name = names[int(label)] if names and int(label) < len(names) else f"class {int(label)}"
        pen.text((box[0] + 3, box[1] + 2), f"{name} {score:.2f}", fill=colour)
        drawn += 1
    img.save(path)
    return drawn


def _hsv(h: float) -> tuple[float, float, float]:
    import colorsys

    return colorsys.hsv_to_rgb(h, 0.9, 1.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", choices=sorted(ssd_nets.NETS), default="ssdlite")
    ap.add_argument("--model", type=Path, help="a deploy prototxt instead of --net")
    ap.add_argument("--weights", type=Path)
    ap.add_argument("--image", type=Path)
    ap.add_argument("--out", type=Path, default=Path("detections.png"))
    ap.add_argument("--num-classes", type=int, default=21)
    ap.add_argument("--size", type=int, default=300)
    ap.add_argument("--width", type=float, default=1.0, help="channel width multiplier of a built net")
    ap.add_argument("--threshold", type=float, default=0.3, help="draw boxes scoring at least this (default 0.3)")
    ap.add_argument("--max-boxes", type=int, default=20, help="draw at most this many, the best first (default 20)")
    ap.add_argument("--labels", type=Path)
    ap.add_argument("--gpu", type=int, default=-1)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.gpu >= 0:
        caffe.set_mode_gpu()
        caffe.set_device(args.gpu)
    caffe.set_random_seed(args.seed)
    if args.model:
        net = caffe.Net(str(args.model), caffe.TEST, weights=str(args.weights) if args.weights else None)
    else:
        param = ssd_nets.NETS[args.net](args.num_classes, size=args.size, width=args.width)
        net = caffe.Net(param, caffe.TEST, weights=str(args.weights) if args.weights else None)
    if args.image:
        Image = require("PIL.Image", feature="reading images")
        rgb = np.asarray(Image.open(args.image).convert("RGB"))
    else:
        rgb = synthetic_image()
    if not args.weights:
        print("warning: no --weights: the net has random weights, so its boxes and scores mean nothing (an "
              f"untrained net is often sure of everything); drawing the {args.max_boxes} best only", file=sys.stderr)
    dets = detect(net, rgb)
    names = args.labels.read_text().split() if args.labels else None
    kept = dets[(dets[:, 1] >= 0) & (dets[:, 2] >= args.threshold)]
    kept = kept[np.argsort(-kept[:, 2], kind="stable")[: args.max_boxes]]
    drawn = draw(rgb, kept, args.out, args.threshold, names)
    print(f"{len(dets)} detection rows (DetectionOutput's confidence_threshold {threshold_of(net):g}), {drawn} drawn "
          f"(score >= {args.threshold}, the {args.max_boxes} best at most) into {args.out}")
    return 0


def threshold_of(net: caffe.Net) -> float:
    """The confidence_threshold of the net's DetectionOutput layer (the deploy file's own filter)."""
    for layer in net.layers:
        if layer.type == "DetectionOutput":
            return float(layer.layer_param.detection_output_param.confidence_threshold)
    return 0.0


if __name__ == "__main__":
    raise SystemExit(main())
