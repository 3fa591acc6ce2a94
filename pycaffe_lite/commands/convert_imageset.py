"""``convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME``: BVLC's image list -> a database of Datums.

LISTFILE holds one ``path label`` per line (the label follows the last space, so paths may hold
spaces); each image is read from ROOTFOLDER + path (plain concatenation, as BVLC: end ROOTFOLDER with
``/``). Pixels are BVLC's: OpenCV decodes (``cv2.imread``, colour as BGR or ``-gray``) and, when both
``-resize_height`` and ``-resize_width`` are set, resizes with ``cv2.resize`` (bilinear); Datums hold
them channel-major (C, H, W) as uint8 bytes. ``-encoded`` stores compressed bytes instead:
the file itself when nothing changes it and its extension is the wanted encoding, else
``cv2.imencode`` in ``-encode_type`` (default: each file's extension). Keys are
``%08d_<path>`` in list order (``-shuffle`` shuffles the list first); unreadable images are skipped
with an error line. ``-check_size`` requires every Datum to hold as many bytes as the first.
Needs ``opencv-python-headless`` (the ``data`` extra).
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from .. import common
from ..errors import DataError
from ..optional import require
from ..schema import caffe_pb2
from . import _tools
from .gflags import Flag

NAME = "convert_imageset"
HELP = "convert a list of images ('path label' lines) to an LMDB/LevelDB of Datums (BVLC's tool)"
USAGE = "convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME"
GFLAGS = (
    Flag("gray", bool, False, "When this option is on, treat images as grayscale ones"),
    Flag("shuffle", bool, False, "Randomly shuffle the order of images and their labels"),
    Flag("backend", str, "lmdb", "The backend {lmdb, leveldb} for storing the result"),
    Flag("resize_width", int, 0, "Width images are resized to"),
    Flag("resize_height", int, 0, "Height images are resized to"),
    Flag("check_size", bool, False, "When this option is on, check that all the datum have the same size"),
    Flag("encoded", bool, False, "When this option is on, the encoded image will be save in datum"),
    Flag("encode_type", str, "", "Optional: What type should we encode the image as ('png','jpg',...)."),
)
POSITIONAL = ("root_folder", "list_file", "db_name")

log = logging.getLogger("pycaffe_lite")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # a Datum's label is an int32


add_arguments, namespace = _tools.arguments(GFLAGS, POSITIONAL, USAGE)


def read_list(path: str) -> list[tuple[str, int]]:
    """``(path, label)`` pairs of a list file (label after the last space). A label must fit the
    Datum's int32 (a DataError naming the line otherwise); negative labels are kept, as BVLC's
    ``atoi`` keeps them, with one warning line counting them."""
    pairs = []
    negative: list[int] = []
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise DataError(f"{path}: cannot read the list file: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        name, space, label = line.rpartition(" ")
        if not space:
            raise DataError(f"{path}:{number}: expected 'path label', got {line!r}")
        try:
            value = int(label)
        except ValueError:
            raise DataError(f"{path}:{number}: the label {label!r} is not an integer") from None
        if not INT32_MIN <= value <= INT32_MAX:
            raise DataError(f"{path}:{number}: the label {value} does not fit Datum's int32 label "
                            f"({INT32_MIN} .. {INT32_MAX})")
        if value < 0:
            negative.append(number)
        pairs.append((name, value))
    if negative:  # BVLC's atoi keeps them; a loss layer refuses them unless they are its ignore_label
        log.warning("%s: %d negative label%s (first on line %d): stored as given, as BVLC does; a loss layer "
                    "accepts them only as its ignore_label", path, len(negative), "s" if len(negative) > 1 else "",
                    negative[0])
    return pairs


def read_image(filename: str, height: int = 0, width: int = 0, is_color: bool = True):
    """BVLC's ReadImageToCVMat: the decoded image (H, W, 3) BGR or (H, W) gray uint8, resized
    bilinearly when both sizes are positive; None when OpenCV cannot read it."""
    cv2 = require("cv2", feature="convert_imageset (image decoding)")
    img = cv2.imread(filename, cv2.IMREAD_COLOR if is_color else cv2.IMREAD_GRAYSCALE)
    if img is None:
        log.error("Could not open or find file %s", filename)
        return None
    if height > 0 and width > 0:
        img = cv2.resize(img, (width, height), interpolation=cv2.INTER_LINEAR)
    return img


def _match_ext(filename: str, encoding: str) -> bool:
    ext = filename.rpartition(".")[2].lower() if "." in filename else filename.lower()
    encoding = encoding.lower()
    return ext == encoding or (encoding == "jpg" and ext == "jpeg")


def image_datum(filename: str, label: int, height: int, width: int, is_color: bool, encoding: str
                ) -> caffe_pb2.Datum | None:
    """BVLC's ReadImageToDatum (None when the image cannot be read)."""
    img = read_image(filename, height, width, is_color)
    if img is None:
        return None
    datum = caffe_pb2.Datum()
    datum.label = label
    if encoding:
        if (img.ndim == 3) == is_color and not height and not width and _match_ext(filename, encoding):
            with open(filename, "rb") as f:
                datum.data = f.read()
        else:
            cv2 = require("cv2", feature="convert_imageset (image encoding)")
            ok, buf = cv2.imencode("." + encoding, img)
            if not ok:
                raise DataError(f"{filename}: OpenCV cannot encode it as '{encoding}'")
            datum.data = buf.tobytes()
        datum.encoded = True
        return datum
    chw = img[None] if img.ndim == 2 else img.transpose(2, 0, 1)
    datum.channels, datum.height, datum.width = (int(d) for d in chw.shape)
    datum.data = np.ascontiguousarray(chw, dtype=np.uint8).tobytes()
    return datum


def run(args: argparse.Namespace) -> int:
    backend = _tools.check_backend(args.backend)
    if (args.resize_height > 0) != (args.resize_width > 0):
        log.warning("Only one of -resize_height and -resize_width is set: images are not resized "
                    "(BVLC resizes only when both are)")
    lines = read_list(args.list_file)
    if args.shuffle:
        log.info("Shuffling data")
        order = common.rng().permutation(len(lines))
        lines = [lines[i] for i in order]
    log.info("A total of %d images.", len(lines))
    encode_type = args.encode_type
    if encode_type and not args.encoded:
        log.info("encode_type specified, assuming encoded=true.")
    encoded = args.encoded or bool(encode_type)
    count = 0
    data_size: int | None = None
    with _tools.open_writer(args.db_name, backend) as writer:
        for line_id, (name, label) in enumerate(lines):
            enc = encode_type
            if encoded and not enc:
                if "." not in name:
                    log.warning("Failed to guess the encoding of '%s'", name)
                enc = name.rpartition(".")[2].lower()
            datum = image_datum(args.root_folder + name, label, args.resize_height, args.resize_width,
                                not args.gray, enc)
            if datum is None:
                continue
            if args.check_size:
                if data_size is None:
                    data_size = datum.channels * datum.height * datum.width
                elif len(datum.data) != data_size:
                    raise DataError(f"{args.root_folder + name}: Incorrect data field size {len(datum.data)} "
                                    f"(the first image had {data_size}; -check_size)")
            writer.put(f"{line_id:08d}_{name}".encode(), datum.SerializeToString())
            count += 1
            if count % 1000 == 0:
                writer.commit()
                log.info("Processed %d files.", count)
    if count % 1000 != 0:
        log.info("Processed %d files.", count)
    return 0
