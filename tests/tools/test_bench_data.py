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


def test_gpu_decode_rows_and_peers_stay_out_without_a_gpu(bench, tmp_path):
    """On the CPU: gpu_decode asks for nothing (no GPU mode), the path says host transform; the
    torchvision peer answers None without torch or a GPU."""
    _, jpeg, _ = bench.write_lmdbs(tmp_path, 6, 32)
    for gpu_decode in (True, None):  # (None: unset, on by default in GPU mode only)
        rate, path = bench.layer_rate(jpeg, 1, batch=4, crop=24, seconds=0.01, gpu=False, gpu_decode=gpu_decode)
        assert rate > 0 and path == "workers, host transform"
    assert bench.gpu_decode_field(None) == "" and bench.gpu_decode_field(False) == "gpu_decode: false "
    peer = bench.torchvision_gpu_rate(jpeg, 4, 24, 0.01)
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    assert (peer is None) == (not has_gpu)


def test_path_of_names_how_batches_travel(bench):
    from types import SimpleNamespace

    assert bench.path_of(object(), True) == "thread"
    pre = SimpleNamespace(raw=True, _registered=object(), register_error="", gpu_decode=True,
                          decoder=SimpleNamespace(backend="hardware"), staged_ahead=7)
    assert bench.path_of(pre, True) == ("workers, uint8 + device kernel, page-locked, nvJPEG (hardware backend), "
                                        "7 staged ahead")
    pre._stager = object()
    assert bench.path_of(pre, True) == ("workers, uint8 + device kernel, page-locked, nvJPEG (hardware backend) on "
                                        "the staging thread, 7 staged ahead")
    pre.adaptive, pre.loader = True, SimpleNamespace(device_decode=False)
    assert bench.path_of(pre, True) == ("workers, uint8 + device kernel, page-locked, host decode by the workers "
                                        "(they keep up: nvJPEG not needed), 7 staged ahead")
    pre.loader.device_decode = True
    assert bench.path_of(pre, True).endswith("on the staging thread (the workers' host decode fell behind), "
                                             "7 staged ahead")
    pre._stager, pre.adaptive = None, False
    assert bench.path_of(pre, False) == "workers, host transform"
    pre.decoder, pre._registered, pre.register_error = None, None, "CudaError: refused"
    assert bench.path_of(pre, True) == ("workers, uint8 + device kernel, pageable (CudaError: refused), "
                                        "nvJPEG failed: host, 7 staged ahead")
