"""``convert_cifar_data input_folder output_folder db_type``: BVLC's CIFAR-10 converter.

Reads the binary version of CIFAR-10 (``data_batch_1.bin`` .. ``data_batch_5.bin`` and
``test_batch.bin``: records of one label byte and 3 x 32 x 32 channel-major pixel bytes) and writes
``output_folder/cifar10_train_<db_type>`` and ``output_folder/cifar10_test_<db_type>`` (db_type
``lmdb`` or ``leveldb``) with Datums (3, 32, 32) under BVLC's keys: ``%05d`` of
``batch * 10000 + item`` for training, ``%05d`` of the item for testing. Batches may hold fewer
than CIFAR's 10,000 records (small test sets); each file must hold whole records.
"""

from __future__ import annotations

import argparse
import logging
import os

from ..errors import DataError
from ..schema import caffe_pb2
from . import _tools

NAME = "convert_cifar_data"
HELP = "convert CIFAR-10's binary batches to LMDB/LevelDB databases (BVLC's tool)"
USAGE = "convert_cifar_data input_folder output_folder db_type"
GFLAGS = ()
POSITIONAL = ("input_folder", "output_folder", "db_type")

SIZE = 32
IMAGE_BYTES = 3 * SIZE * SIZE
BATCH_SIZE = 10000
TRAIN_BATCHES = 5

log = logging.getLogger("pycaffe_lite")


add_arguments, namespace = _tools.arguments(GFLAGS, POSITIONAL, USAGE)


def read_batch(path: str) -> list[tuple[int, bytes]]:
    """(label, 3072 pixel bytes) records of one CIFAR-10 binary batch file."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise DataError(f"{path}: Unable to open the batch file: {exc.strerror or exc}") from None
    record = IMAGE_BYTES + 1
    if not raw or len(raw) % record or len(raw) // record > BATCH_SIZE:
        raise DataError(f"{path}: {len(raw)} bytes is not 1 to {BATCH_SIZE} CIFAR-10 records of {record} bytes")
    return [(raw[i], raw[i + 1:i + record]) for i in range(0, len(raw), record)]


def _write(path: str, db_type: str, keyed) -> None:
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = 3, SIZE, SIZE
    with _tools.open_writer(path, db_type) as writer:
        for key, (label, pixels) in keyed:
            datum.label = label
            datum.data = pixels
            writer.put(key, datum.SerializeToString())


def run(args: argparse.Namespace) -> int:
    db_type = _tools.check_backend(args.db_type)
    folder = args.input_folder

    def train_records():
        log.info("Writing Training data")
        for fileid in range(TRAIN_BATCHES):
            log.info("Training Batch %d", fileid + 1)
            for itemid, rec in enumerate(read_batch(os.path.join(folder, f"data_batch_{fileid + 1}.bin"))):
                yield f"{fileid * BATCH_SIZE + itemid:05d}".encode(), rec

    for fileid in range(TRAIN_BATCHES):  # BVLC stops at a missing batch before writing anything
        if not os.path.isfile(os.path.join(folder, f"data_batch_{fileid + 1}.bin")):
            raise DataError(f"{folder}: Unable to open train file #{fileid + 1} (data_batch_{fileid + 1}.bin)")
    _write(os.path.join(args.output_folder, f"cifar10_train_{db_type}"), db_type, train_records())
    log.info("Writing Testing data")
    test = read_batch(os.path.join(folder, "test_batch.bin"))
    _write(os.path.join(args.output_folder, f"cifar10_test_{db_type}"), db_type,
           ((f"{i:05d}".encode(), rec) for i, rec in enumerate(test)))
    return 0
