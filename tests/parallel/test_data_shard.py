"""Multi-GPU data sharding of the Data layer (on the CPU): rank r of N reads batches r, r+N, ..."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.data.db import LMDBWriter
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer

pytest.importorskip("lmdb")

RECORDS, BATCH = 14, 3


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("shard") / "lmdb"
    with LMDBWriter(path) as w:
        for i in range(RECORDS):
            d = caffe_pb2.Datum(channels=1, height=1, width=1, data=bytes([i]), label=i)
            w.put(b"%08d" % i, d.SerializeToString())
    return path


def labels_read(path, rank, count, phase="TRAIN", batches=4):
    caffe.set_solver_count(count)
    caffe.set_solver_rank(rank)
    try:
        layer = make_layer(f'type: "Data" phase: {phase} data_param {{ source: "{path}" batch_size: {BATCH} '
                           f"backend: LMDB }}", np.float32)
        top = empty_blobs(2, np.float32)
        layer.setup([], top)
        out = []
        for _ in range(batches):
            layer.forward([], top)
            out.append(top[1].cpu_data().astype(int).tolist())
        layer.close()
        return out
    finally:
        caffe.set_solver_count(1)
        caffe.set_solver_rank(0)


def expected(rank, count, batches=4):
    return [[(BATCH * (rank + count * b) + k) % RECORDS for k in range(BATCH)] for b in range(batches)]


@pytest.mark.parametrize("rank, count", [(0, 1), (0, 2), (1, 2), (2, 3)])
def test_rank_reads_every_nth_batch(source, rank, count):
    caffe.set_mode_cpu()
    assert labels_read(source, rank, count) == expected(rank, count)


def test_two_ranks_cover_what_one_reads_at_double_batch(source):
    caffe.set_mode_cpu()
    r0, r1 = labels_read(source, 0, 2, batches=2), labels_read(source, 1, 2, batches=2)
    assert [a + b for a, b in zip(r0, r1)] == [list(range(0, 6)), list(range(6, 12))]


def test_test_phase_reads_everything(source):
    caffe.set_mode_cpu()
    assert labels_read(source, 1, 2, phase="TEST") == expected(0, 1)
