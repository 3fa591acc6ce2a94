"""``convert_mnist_data [FLAGS] input_image_file input_label_file output_db_file``: BVLC's MNIST
converter (IDX files, gzipped or not) -> Datums (1, rows, cols) with keys ``%08d``; ``-backend
lmdb|leveldb`` (default lmdb). ``pycaffe-lite convert_mnist`` is the same conversion with more options.
"""

from __future__ import annotations

import argparse
import logging

from ..data import mnist
from . import _tools
from .gflags import Flag

NAME = "convert_mnist_data"
HELP = "convert MNIST IDX image/label files to an LMDB/LevelDB of Datums (BVLC's tool)"
USAGE = "convert_mnist_data [FLAGS] input_image_file input_label_file output_db_file"
GFLAGS = (Flag("backend", str, "lmdb", "The backend {lmdb, leveldb} for storing the result"),)
POSITIONAL = ("input_image_file", "input_label_file", "output_db_file")

log = logging.getLogger("pycaffe_lite")


add_arguments, namespace = _tools.arguments(GFLAGS, POSITIONAL, USAGE)


def run(args: argparse.Namespace) -> int:
    backend = _tools.check_backend(args.backend)
    images, labels = _tools.load_mnist(args)
    with _tools.open_writer(args.output_db_file, backend) as writer:
        for i in range(len(images)):
            writer.put(b"%08d" % i, mnist.datum_bytes(images[i], int(labels[i])))
            if (i + 1) % 1000 == 0:
                writer.commit()
    log.info("Processed %d files.", len(images))
    return 0
