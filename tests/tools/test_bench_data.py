"""benchmarks/data.py on the CPU, tiny: the LMDBs it writes (raw and JPEG records of the same
images), and a positive rate from the Data layer with the prefetch thread and with a worker."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite.data.db import open_cursor
from pycaffe_lite.data.transformer import decode_datum
from pycaffe_lite.proto import caffe_pb2

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "data.py"
pytest.importorskip("lmdb")
pytest.importorskip("PIL")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_data", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_lmdbs_hold_the_same_images(bench, tmp_path):
    raw, jpeg, mean_bytes = bench.write_lmdbs(tmp_path, 3, 40)
    assert 0 < mean_bytes < 40 * 40 * 3
    with open_cursor(raw, "lmdb") as r, open_cursor(jpeg, "lmdb") as j:
        assert len(r) == len(j) == 3
        for _ in range(3):
            a = decode_datum(caffe_pb2.Datum.FromString(r.value())).astype(int)
            b = decode_datum(caffe_pb2.Datum.FromString(j.value())).astype(int)
            assert a.shape == b.shape == (3, 40, 40)
            lossy = np.abs(a - b).mean()  # JPEG (quality 90, chroma subsampled) of the same pixels,
            assert lossy < 30 and lossy < np.abs(a - b[::-1]).mean()  # in the same (BGR) channel order
            r.next()
            j.next()


@pytest.mark.parametrize("workers", [0, 1])
def test_layer_rate(bench, tmp_path, workers):
    raw, jpeg, _ = bench.write_lmdbs(tmp_path, 6, 32)
    for source in (raw, jpeg):
        rate, path = bench.layer_rate(source, workers, batch=4, crop=24, seconds=0.01, gpu=False)
        assert rate > 0
        assert path == ("thread" if workers == 0 else "workers, host transform")
