"""``convert_mnist_siamese_data input_image_file input_label_file output_db_file``: BVLC's siamese
example converter. For each item i, two random images (uniformly, with replacement) are stacked as
a 2-channel Datum (2, rows, cols) labelled 1 when their digits agree, else 0, under the key
``%08d`` of i. The database is LevelDB, as BVLC's (``-backend lmdb`` is our addition).
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from .. import common
from ..schema import caffe_pb2
from . import _tools
from .gflags import Flag

NAME = "convert_mnist_siamese_data"
HELP = "random MNIST image pairs as 2-channel Datums for the siamese example (BVLC's tool)"
USAGE = "convert_mnist_siamese_data input_image_file input_label_file output_db_file"
GFLAGS = (Flag("backend", str, "leveldb", "The backend {leveldb, lmdb} for storing the result (BVLC: leveldb)"),)
POSITIONAL = ("input_image_file", "input_label_file", "output_db_file")

log = logging.getLogger("pycaffe_lite")


add_arguments, namespace = _tools.arguments(GFLAGS, POSITIONAL, USAGE)


def run(args: argparse.Namespace) -> int:
    backend = _tools.check_backend(args.backend)
    images, labels = _tools.load_mnist(args)
    n, rows, cols = images.shape
    rng = common.rng()
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = 2, rows, cols
    with _tools.open_writer(args.output_db_file, backend) as writer:
        for item in range(n):
            i, j = (int(v) for v in rng.integers(0, n, size=2))
            datum.data = np.ascontiguousarray(np.stack([images[i], images[j]]), np.uint8).tobytes()
            datum.label = int(labels[i] == labels[j])
            writer.put(b"%08d" % item, datum.SerializeToString())
            if (item + 1) % 1000 == 0:
                writer.commit()
    return 0
