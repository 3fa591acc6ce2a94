"""``pycaffe-lite convert_mnist IMAGES LABELS DB_PATH [--backend lmdb]``: Caffe's
convert_mnist_data (IDX files, gzipped or not -> LMDB or LevelDB of Datums with keys ``%08d``)."""

from __future__ import annotations

import argparse
import sys
import time

from ..data import mnist
from . import flag

NAME = "convert_mnist"
HELP = "convert MNIST IDX image/label files (gzipped or not) to an LMDB or LevelDB of Datums"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("images", metavar="IMAGES", help="IDX image file, e.g. train-images-idx3-ubyte.gz")
    parser.add_argument("labels", metavar="LABELS", help="IDX label file, e.g. train-labels-idx1-ubyte.gz")
    parser.add_argument("db_path", metavar="DB_PATH", help="output database folder (must not exist)")
    flag(parser, "backend", default="lmdb", help="database backend: lmdb or leveldb (leveldb needs plyvel: pip install pycaffe-lite[leveldb])")
    flag(parser, "overwrite", action="store_true", help="replace DB_PATH if it exists")
    flag(parser, "limit", type=int, default=None, help="convert only the first N records")


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    n = mnist.convert(args.images, args.labels, args.db_path, backend=args.backend,
                      overwrite=args.overwrite, limit=args.limit)
    print(f"Wrote {n} records to {args.db_path} ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return 0
