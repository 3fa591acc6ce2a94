"""``pycaffe-lite convert_annoset ROOT LISTFILE DB_PATH``: the SSD fork's convert_annoset (images with
box annotations -> an LMDB of AnnotatedDatum).

LISTFILE lines are ``image_path annotation_path`` relative to ROOT. Annotations
(``--label_type``): ``xml`` (PASCAL VOC: ``object/name``, ``bndbox``, ``difficult``) or ``txt``
(one box per line: ``label xmin ymin xmax ymax [difficult]``), in pixels; names are mapped to
labels with ``--label_map_file`` (a LabelMap prototxt; a numeric label is used as is). Boxes are
stored relative to the image size, grouped by label (AnnotationGroup), with instance ids counted
per group. Keys are ``%08d_<image path>`` in list order (``--shuffle`` shuffles the list with
``--seed``). Images are stored encoded (``--encoded``, with ``--encode_type``) or as raw BGR
bytes, resized to ``--resize_height`` x ``--resize_width`` when those are given.

From Python: :func:`write_annoset` writes arrays and pixel boxes directly (tests use it).
"""

from __future__ import annotations

import argparse
import io as _io
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from .. import io
from ..data.db import LMDBWriter
from ..errors import DataError
from ..optional import require
from ..proto import protoio
from ..schema import caffe_pb2
from . import flag

NAME = "convert_annoset"
HELP = "convert images + box annotations (VOC xml or txt) to an LMDB of AnnotatedDatum (SSD)"

Box = tuple  # (label, xmin, ymin, xmax, ymax[, difficult]) in pixels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", metavar="ROOT", help="folder the list file's paths are relative to")
    parser.add_argument("listfile", metavar="LISTFILE", help="lines 'image_path annotation_path'")
    parser.add_argument("db_path", metavar="DB_PATH", help="output LMDB folder")
    flag(parser, "anno_type", default="detection", choices=["detection"], help="annotation type")
    flag(parser, "label_type", default="xml", choices=["xml", "txt"], help="annotation file format")
    flag(parser, "label_map_file", default="", help="LabelMap prototxt mapping names to labels")
    flag(parser, "backend", default="lmdb", help="database backend (only lmdb is supported)")
    flag(parser, "encoded", action="store_true", help="store encoded images (PNG/JPEG bytes)")
    flag(parser, "encode_type", default="png", help="image format for --encoded (png or jpg)")
    flag(parser, "resize_height", type=int, default=0)
    flag(parser, "resize_width", type=int, default=0)
    flag(parser, "shuffle", action="store_true")
    flag(parser, "seed", type=int, default=0)
    flag(parser, "gray", action="store_true", help="store images as one channel")
    flag(parser, "overwrite", action="store_true", help="replace DB_PATH if it exists")


def load_label_map(path: str | Path) -> dict[str, int]:
    lm = protoio.parse_text(Path(path).read_text(), caffe_pb2.LabelMap(), str(path))
    return {item.name: item.label for item in lm.item}


def _label(name: str, label_map: dict[str, int], where: str) -> int:
    if name in label_map:
        return label_map[name]
    try:
        return int(name)
    except ValueError:
        raise DataError(f"{where}: label '{name}' is not in the label map") from None


def read_annotation(path: str | Path, label_type: str, label_map: dict[str, int]) -> list[Box]:
    """Pixel boxes of one annotation file."""
    path = Path(path)
    boxes: list[Box] = []
    if label_type == "xml":
        root = ET.parse(path).getroot()
        for obj in root.iter("object"):
            bb = obj.find("bndbox")
            if bb is None:
                raise DataError(f"{path}: an object without bndbox")
            vals = [float(bb.findtext(k, "nan")) for k in ("xmin", "ymin", "xmax", "ymax")]
            boxes.append((_label(obj.findtext("name", ""), label_map, str(path)), *vals,
                          int(obj.findtext("difficult", "0") or 0)))
    else:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) not in (5, 6):
                raise DataError(f"{path}:{n}: expected 'label xmin ymin xmax ymax [difficult]'")
            boxes.append((_label(parts[0], label_map, f"{path}:{n}"), *map(float, parts[1:5]),
                          int(parts[5]) if len(parts) == 6 else 0))
    return boxes


def make_annotated_datum(bgr: np.ndarray, boxes: Sequence[Box], encoded: bool = False,
                         encode_type: str = "png") -> caffe_pb2.AnnotatedDatum:
    """An AnnotatedDatum of an (H, W, C) uint8 BGR image and its pixel boxes."""
    h, w = bgr.shape[:2]
    ad = caffe_pb2.AnnotatedDatum()
    ad.type = caffe_pb2.AnnotatedDatum.BBOX
    d = ad.datum
    if encoded:
        Image = require("PIL.Image", feature="convert_annoset --encoded")
        buf = _io.BytesIO()
        rgb = bgr[..., ::-1] if bgr.shape[2] == 3 else bgr[..., 0]
        Image.fromarray(np.ascontiguousarray(rgb)).save(buf, format="JPEG" if encode_type in ("jpg", "jpeg") else "PNG")
        d.data = buf.getvalue()
        d.encoded = True
    else:
        d.channels, d.height, d.width = bgr.shape[2], h, w
        d.data = np.ascontiguousarray(bgr.transpose(2, 0, 1)).tobytes()
    groups: dict[int, caffe_pb2.AnnotationGroup] = {}
    for box in boxes:
        label, x0, y0, x1, y1 = box[:5]
        difficult = bool(box[5]) if len(box) > 5 else False
        if not (x1 > x0 and y1 > y0):
            raise DataError(f"box {box} is empty (xmax <= xmin or ymax <= ymin)")
        if label not in groups:
            groups[label] = ad.annotation_group.add()
            groups[label].group_label = int(label)
        g = groups[label]
        a = g.annotation.add()
        a.instance_id = len(g.annotation) - 1
        b = a.bbox
        b.xmin, b.ymin, b.xmax, b.ymax = x0 / w, y0 / h, x1 / w, y1 / h
        b.difficult = difficult
    return ad


def write_annoset(db_path: str | Path, items: Iterable[tuple[str, np.ndarray, Sequence[Box]]],
                  encoded: bool = False, encode_type: str = "png", overwrite: bool = False) -> int:
    """Write ``(name, bgr image (H, W, C) uint8, pixel boxes)`` items to a new LMDB; returns the count."""

    n = 0
    with LMDBWriter(db_path, overwrite=overwrite) as writer:
        for name, bgr, boxes in items:
            writer.put(f"{n:08d}_{name}".encode(), make_annotated_datum(bgr, boxes, encoded, encode_type)
                       .SerializeToString())
            n += 1
    return n


def _load_image(path: Path, gray: bool, height: int, width: int):
    Image = require("PIL.Image", feature="convert_annoset")
    with Image.open(path) as im:
        rgb = np.asarray(im.convert("L" if gray else "RGB"))
    img = rgb[..., None] if gray else rgb[..., ::-1]
    src_hw = img.shape[:2]
    if height and width:
        img = np.clip(np.rint(io.resize(img, height, width)), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(img), src_hw


def run(args: argparse.Namespace) -> int:
    root = Path(args.root)
    label_map = load_label_map(args.label_map_file) if args.label_map_file else {}
    lines = [ln.split() for ln in Path(args.listfile).read_text().splitlines() if ln.strip()]
    for n, parts in enumerate(lines, 1):
        if len(parts) != 2:
            raise DataError(f"{args.listfile}:{n}: expected 'image_path annotation_path'")
    if args.shuffle:
        np.random.default_rng(args.seed).shuffle(lines)

    def items():
        for img_path, anno_path in lines:
            img, (h, w) = _load_image(root / img_path, args.gray, args.resize_height, args.resize_width)
            boxes = read_annotation(root / anno_path, args.label_type, label_map)
            sy, sx = img.shape[0] / h, img.shape[1] / w  # boxes follow a resize (stored relative anyway)
            yield img_path, img, [(b[0], b[1] * sx, b[2] * sy, b[3] * sx, b[4] * sy, *b[5:]) for b in boxes]

    n = write_annoset(args.db_path, items(), args.encoded, args.encode_type, args.overwrite)
    print(f"Wrote {n} records to {args.db_path}", file=sys.stderr)
    return 0
