"""NCCL discovery and pycaffe's surface without a GPU (BVLC's test_nccl.py logic included)."""

from __future__ import annotations

import sys

import pytest

import pycaffe_lite as caffe
from pycaffe_lite.config import Config
from pycaffe_lite.parallel import nccl


@pytest.fixture
def fresh(monkeypatch):
    """The loader's cache emptied for the test (and put back after)."""
    monkeypatch.setattr(nccl, "_lib", None)
    monkeypatch.setattr(nccl, "_load_error", None)
    return monkeypatch


def test_missing_library_says_what_to_install(fresh, tmp_path):
    bogus = tmp_path / "libnccl.so.2"
    bogus.write_text("not a library")
    fresh.setattr(nccl, "config", Config(nccl=str(bogus)))
    fresh.setattr(sys, "path", [str(tmp_path)])
    fresh.setattr(nccl.ctypes.util, "find_library", lambda name: None)
    fresh.setattr(nccl, "candidates", lambda: [str(bogus), "libnccl-missing.so.9"])
    with pytest.raises(nccl.NCCLUnavailableError) as err:
        nccl.library()
    msg = str(err.value)
    assert "pip install nvidia-nccl-cu13" in msg and "PYCAFFE_LITE_NCCL" in msg and str(bogus) in msg
    assert not nccl.available() and caffe.has_nccl() is False
    assert isinstance(err.value, caffe.GPUUnavailableError)


def test_candidates_order(fresh, tmp_path):
    wheel = tmp_path / "site" / "nvidia" / "nccl" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libnccl.so.2").write_bytes(b"")
    own = tmp_path / "own"
    own.mkdir()
    (own / "libnccl.so.2").write_bytes(b"")
    fresh.setattr(nccl, "config", Config(nccl=str(own)))
    fresh.setattr(sys, "path", [str(tmp_path / "site")])
    names = nccl.candidates()
    assert names[0] == str(own / "libnccl.so.2")
    assert names[1] == str(wheel / "libnccl.so.2")
    assert "libnccl.so.2" in names[2:]


def test_has_nccl_is_a_function_and_uid_is_bytes():
    """BVLC's python/caffe/test/test_nccl.py: has_nccl() is callable; new_uid() gives bytes."""
    assert callable(caffe.has_nccl) and isinstance(caffe.has_nccl(), bool)
    if caffe.has_nccl():
        uid = caffe.NCCL.new_uid()
        assert isinstance(uid, bytes) and len(uid) == nccl.UNIQUE_ID_BYTES
        assert uid != caffe.NCCL.new_uid()


@pytest.mark.skipif(not nccl.available(), reason="NCCL not installed")
def test_version_and_errors():
    major, minor, _ = nccl.version()
    assert (major, minor) >= (2, 0)
    with pytest.raises(caffe.CaffeError, match="128 bytes"):
        nccl.Communicator(b"short", 2, 0)
    with pytest.raises(caffe.CaffeError, match="float16"):
        nccl.nccl_dtype("float16")


def test_solver_count_rank_multiprocess():
    from pycaffe_lite import common

    try:
        caffe.set_solver_count(4)
        caffe.set_solver_rank(3)
        caffe.set_multiprocess(True)
        assert caffe.solver_count() == 4 and caffe.solver_rank() == 3 and common.multiprocess()
        assert not common.root_solver()
        with pytest.raises(ValueError):
            caffe.set_solver_count(0)
    finally:
        caffe.set_solver_count(1)
        caffe.set_solver_rank(0)
        caffe.set_multiprocess(False)


def test_nccl_needs_gpu_mode():
    caffe.set_mode_cpu()
    with pytest.raises(caffe.CaffeError, match="GPU mode"):
        caffe.NCCL(object(), b"\0" * 128)

