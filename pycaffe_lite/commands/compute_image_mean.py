"""``compute_image_mean [FLAGS] INPUT_DB [OUTPUT_FILE]``: BVLC's mean image of a database of Datums.

Every Datum (encoded ones decoded with OpenCV in their native colour, as BVLC's DecodeDatumNative)
is summed element-wise in float32, in key order, and divided by the count; OUTPUT_FILE receives the
mean as BVLC's binary ``BlobProto`` (num 1, channels, height, width; the file ``mean_file:`` reads).
The per-channel means are logged. ``-backend lmdb|leveldb`` (default lmdb).
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from ..errors import DataError
from ..optional import require
from ..proto import protoio
from ..schema import caffe_pb2
from . import _tools
from .gflags import Flag

NAME = "compute_image_mean"
HELP = "mean image of an LMDB/LevelDB of Datums, written as a binaryproto (BVLC's tool)"
USAGE = "compute_image_mean [FLAGS] INPUT_DB [OUTPUT_FILE]"
GFLAGS = (Flag("backend", str, "lmdb", "The backend {leveldb, lmdb} containing the images"),)
POSITIONAL = ("input_db",)
OPTIONAL = ("output_file",)

log = logging.getLogger("pycaffe_lite")


add_arguments, namespace = _tools.arguments(GFLAGS, POSITIONAL, USAGE, OPTIONAL)


def decode_native(datum: caffe_pb2.Datum) -> bool:
    """BVLC's DecodeDatumNative: an encoded Datum becomes raw (C, H, W) bytes in place; True if it was
    encoded."""
    if not datum.encoded:
        return False
    cv2 = require("cv2", feature="decoding encoded Datums")
    img = cv2.imdecode(np.frombuffer(datum.data, np.uint8), cv2.IMREAD_ANYCOLOR)
    if img is None:
        raise DataError("Could not decode datum")
    chw = img[None] if img.ndim == 2 else img.transpose(2, 0, 1)
    datum.channels, datum.height, datum.width = (int(d) for d in chw.shape)
    datum.data = np.ascontiguousarray(chw).tobytes()
    datum.encoded = False
    return True


def mean_blob(records, where: str) -> tuple[caffe_pb2.BlobProto, int]:
    """(mean BlobProto, count) of serialized Datums ``records`` ((key, value) pairs)."""
    total: np.ndarray | None = None
    blob = caffe_pb2.BlobProto()
    count = 0
    data_size = 0
    for key, value in records:
        datum = caffe_pb2.Datum()
        datum.ParseFromString(value)
        decoded = decode_native(datum)
        if total is None:
            if decoded:
                log.info("Decoding Datum")
            blob.num, blob.channels, blob.height, blob.width = 1, datum.channels, datum.height, datum.width
            data_size = datum.channels * datum.height * datum.width
            total = np.zeros(max(len(datum.data), len(datum.float_data)), np.float32)
            log.info("Starting iteration")
        size = max(len(datum.data), len(datum.float_data))
        if size != data_size or size != total.size:
            raise DataError(f"{where}: record {key!r}: Incorrect data field size {size} (expected {data_size})")
        if datum.data:
            total += np.frombuffer(datum.data, np.uint8)
        else:
            total += np.asarray(datum.float_data, np.float32)
        count += 1
        if count % 10000 == 0:
            log.info("Processed %d files.", count)
    if total is None:
        raise DataError(f"{where}: the database is empty")
    if count % 10000 != 0:
        log.info("Processed %d files.", count)
    blob.data.extend((total / np.float32(count)).astype(np.float32).tolist())
    return blob, count


def run(args: argparse.Namespace) -> int:
    backend = _tools.check_backend(args.backend)
    blob, _ = mean_blob(_tools.read_records(args.input_db, backend), args.input_db)
    if args.output_file:
        log.info("Write to %s", args.output_file)
        protoio.write_binary(args.output_file, blob)
    dim = blob.height * blob.width
    mean = np.asarray(blob.data, np.float32)
    log.info("Number of channels: %d", blob.channels)
    for c in range(blob.channels):
        log.info("mean_value channel [%d]: %g", c, float(mean[c * dim:(c + 1) * dim].sum(dtype=np.float64)) / dim)
    return 0
