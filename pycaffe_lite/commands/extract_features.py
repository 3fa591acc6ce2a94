"""``extract_features pretrained_net_param feature_extraction_proto_file extract_feature_blob_name1[,name2,...]
save_feature_dataset_name1[,name2,...] num_mini_batches db_type [CPU/GPU] [DEVICE_ID=0]``: BVLC's tool.

Builds the net in the TEST phase with the pretrained weights, runs ``num_mini_batches`` forward passes
and writes, for each named blob, one Datum per item of the batch into its own new database (``db_type``
lmdb or leveldb): ``float_data`` holds the item's values, channels/height/width the blob's legacy
shape, the key is the running item index as ``%010d``.
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from .. import common
from ..errors import CaffeError, NetError
from ..net import Net
from ..schema import caffe_pb2
from . import _tools, use_device

NAME = "extract_features"
HELP = "write a trained net's blob values for each input item into LMDB/LevelDB (BVLC's tool)"
USAGE = ("extract_features pretrained_net_param feature_extraction_proto_file extract_feature_blob_name1"
         "[,name2,...] save_feature_dataset_name1[,name2,...] num_mini_batches db_type [CPU/GPU] [DEVICE_ID=0]")
GFLAGS = ()
POSITIONAL = ("pretrained_net_param", "feature_extraction_proto_file", "blob_names", "dataset_names",
              "num_mini_batches", "db_type")
OPTIONAL = ("mode", "device_id")

log = logging.getLogger("pycaffe_lite")


add_arguments, namespace = _tools.arguments(GFLAGS, POSITIONAL, USAGE, OPTIONAL)


def _select_device(args: argparse.Namespace) -> None:
    """BVLC's positional ``[CPU/GPU] [DEVICE_ID=0]``."""
    if (args.mode or "CPU") == "GPU":
        try:
            device = int(args.device_id or 0)
        except ValueError:
            raise CaffeError(f"DEVICE_ID must be an integer, got {args.device_id!r}") from None
        log.error("Using Device_id=%d", device)
        use_device(device)
    else:
        log.error("Using CPU")
        use_device(None)


def run(args: argparse.Namespace) -> int:
    db_type = _tools.check_backend(args.db_type)
    _select_device(args)
    try:
        batches = int(args.num_mini_batches)
    except ValueError:
        raise CaffeError(f"num_mini_batches must be an integer, got {args.num_mini_batches!r}") from None
    net = Net(args.feature_extraction_proto_file, common.TEST)
    net.copy_from(args.pretrained_net_param)
    blob_names = args.blob_names.split(",")
    dataset_names = args.dataset_names.split(",")
    if len(blob_names) != len(dataset_names):
        raise CaffeError(f"the number of blob names ({len(blob_names)}) and dataset names "
                         f"({len(dataset_names)}) must be equal")
    for name in blob_names:
        if name not in net.blobs:
            raise NetError(f"Unknown feature blob name {name} in the network {args.feature_extraction_proto_file}")
    writers = []
    try:
        for name in dataset_names:
            log.info("Opening dataset %s", name)
            writers.append(_tools.open_writer(name, db_type))
        log.error("Extracting Features")
        counts = [0] * len(blob_names)
        datum = caffe_pb2.Datum()
        for _ in range(batches):
            net.forward_prefilled()
            for i, name in enumerate(blob_names):
                blob = net.blobs[name]
                values = np.asarray(blob.cpu_data(), np.float32).reshape(blob.num, -1)
                datum.channels, datum.height, datum.width = blob.channels, blob.height, blob.width
                for row in values:
                    del datum.float_data[:]
                    datum.float_data.extend(row.tolist())
                    writers[i].put(f"{counts[i]:010d}".encode(), datum.SerializeToString())
                    counts[i] += 1
                    if counts[i] % 1000 == 0:
                        writers[i].commit()
                        log.error("Extracted features of %d query images for feature blob %s", counts[i], name)
        for i, name in enumerate(blob_names):
            log.error("Extracted features of %d query images for feature blob %s", counts[i], name)
    except BaseException:
        for w in writers:
            w.abort()
        raise
    for w in writers:
        w.close()
    log.error("Successfully extracted the features!")
    return 0
