"""MNIST IDX reading (errors on small hand-made files, the real files) and the LMDB converter."""

from __future__ import annotations

import argparse
import gzip
import struct

import numpy as np
import pytest

from pycaffe_lite.data import mnist
from pycaffe_lite.errors import DataError
from pycaffe_lite.schema import caffe_pb2

lmdb = pytest.importorskip("lmdb")


def write_idx(path, magic, dims, payload: bytes, gz=False):
    raw = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload
    if gz:
        raw = gzip.compress(raw)
    path.write_bytes(raw)
    return path


@pytest.fixture
def small(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 4, 3), dtype=np.uint8)
    labels = np.array([3, 0, 9, 1, 7], dtype=np.uint8)
    ip = write_idx(tmp_path / "imgs-idx3-ubyte", 2051, (5, 4, 3), images.tobytes())
    lp = write_idx(tmp_path / "labels-idx1-ubyte.gz", 2049, (5,), labels.tobytes(), gz=True)
    return images, labels, ip, lp


def test_reads_plain_and_gzipped(small, tmp_path):
    images, labels, ip, lp = small
    got_i, got_l = mnist.load(ip, lp)
    np.testing.assert_array_equal(got_i, images)
    np.testing.assert_array_equal(got_l, labels)
    assert got_i.dtype == np.uint8 and got_i.shape == (5, 4, 3)
    gz = write_idx(tmp_path / "imgs.gz", 2051, (5, 4, 3), images.tobytes(), gz=True)
    np.testing.assert_array_equal(mnist.read_images(gz), images)


def test_wrong_magic_names_file(small, tmp_path):
    _, _, ip, lp = small
    with pytest.raises(DataError, match=r"labels-idx1-ubyte\.gz.*wrong magic number 2049.*2051"):
        mnist.read_images(lp)  # a label file where images are expected
    bad = write_idx(tmp_path / "junk", 0x12345678, (1,), b"\0")
    with pytest.raises(DataError, match=r"junk.*wrong magic"):
        mnist.read_labels(bad)
    with pytest.raises(DataError, match="not an IDX file"):
        mnist.read_idx(bad)


def test_truncated_files(small, tmp_path):
    images, _, ip, _ = small
    cut = write_idx(tmp_path / "cut-images", 2051, (5, 4, 3), images.tobytes()[:-7])
    with pytest.raises(DataError, match=r"cut-images: truncated IDX file.*\(5, 4, 3\) \(60 data bytes\).*53 bytes"):
        mnist.read_images(cut)
    header_only = tmp_path / "short"
    header_only.write_bytes(struct.pack(">I", 2051) + b"\0\0")
    with pytest.raises(DataError, match=r"short: truncated IDX header"):
        mnist.read_images(header_only)
    tiny = tmp_path / "tiny"
    tiny.write_bytes(b"\0\0")
    with pytest.raises(DataError, match="tiny: truncated"):
        mnist.read_images(tiny)
    gz = gzip.compress(ip.read_bytes())
    (tmp_path / "cut.gz").write_bytes(gz[: len(gz) // 2])
    with pytest.raises(DataError, match=r"cut\.gz: corrupt or truncated gzip"):
        mnist.read_images(tmp_path / "cut.gz")
    with pytest.raises(DataError, match="cannot read"):
        mnist.read_images(tmp_path / "missing.gz")


def test_count_mismatch(small, tmp_path):
    _, labels, ip, _ = small
    lp = write_idx(tmp_path / "four-labels", 2049, (4,), labels[:4].tobytes())
    with pytest.raises(DataError, match=r"imgs-idx3-ubyte holds 5 images but .*four-labels holds 4 labels"):
        mnist.load(ip, lp)


def test_datum_bytes_match_caffe_wire_format():
    img = np.arange(6, dtype=np.uint8).reshape(2, 3)
    # Datum fields in number order: channels=1, height=2, width=3, data (length 6), label=7.
    expected = b"\x08\x01" + b"\x10\x02" + b"\x18\x03" + b"\x22\x06" + bytes(range(6)) + b"\x28\x07"
    assert mnist.datum_bytes(img, 7) == expected
    assert mnist.datum_bytes(img, 0).endswith(b"\x28\x00")  # label 0 is written, as C++ set_label does


def test_convert_round_trip(small, tmp_path):
    images, labels, ip, lp = small
    db = tmp_path / "out_lmdb"
    assert mnist.convert(ip, lp, db) == 5
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # temp folder renamed
    env = lmdb.open(str(db), readonly=True, lock=False)
    with env.begin() as txn:
        items = list(txn.cursor())
    env.close()
    assert [k for k, _ in items] == [b"%08d" % i for i in range(5)]
    for i, (_, value) in enumerate(items):
        d = caffe_pb2.Datum.FromString(value)
        assert (d.channels, d.height, d.width, d.label, d.encoded) == (1, 4, 3, labels[i], False)
        np.testing.assert_array_equal(np.frombuffer(d.data, np.uint8).reshape(4, 3), images[i])
    with pytest.raises(DataError, match="already exists"):
        mnist.convert(ip, lp, db)
    assert mnist.convert(ip, lp, db, overwrite=True, limit=2) == 2
    env = lmdb.open(str(db), readonly=True, lock=False)
    assert env.stat()["entries"] == 2
    env.close()


def test_convert_to_leveldb(small, tmp_path):
    plyvel = pytest.importorskip("plyvel")
    images, labels, ip, lp = small
    db = tmp_path / "db"
    assert mnist.convert(ip, lp, db, backend="leveldb") == len(labels)
    handle = plyvel.DB(str(db))
    got = list(handle)
    handle.close()
    assert [k for k, _ in got] == [b"%08d" % i for i in range(len(labels))]
    for i, (_, value) in enumerate(got):
        d = caffe_pb2.Datum.FromString(value)
        assert d.label == labels[i]
        np.testing.assert_array_equal(np.frombuffer(d.data, np.uint8).reshape(images[i].shape), images[i])
    with pytest.raises(DataError, match="unknown database backend 'rocksdb'"):
        mnist.convert(ip, lp, tmp_path / "db2", backend="rocksdb")
    assert not (tmp_path / "db2").exists()


def test_convert_onto_read_only_folder_is_a_data_error(small, tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    _, _, ip, lp = small
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(DataError, match=r"ro/db: cannot create the database"):
            mnist.convert(ip, lp, ro / "db")
    finally:
        ro.chmod(0o755)


def test_convert_mnist_command(small, tmp_path, capsys):
    from pycaffe_lite.commands import convert_mnist

    _, _, ip, lp = small
    parser = argparse.ArgumentParser()
    convert_mnist.add_arguments(parser)
    args = parser.parse_args([str(ip), str(lp), str(tmp_path / "cmd_lmdb"), "--backend", "lmdb"])
    assert convert_mnist.NAME == "convert_mnist" and convert_mnist.HELP
    assert convert_mnist.run(args) == 0
    assert "Wrote 5 records" in capsys.readouterr().err
    assert (tmp_path / "cmd_lmdb" / "data.mdb").is_file()


def test_real_mnist(mnist_dir):
    train = mnist.find_files(mnist_dir, "train")
    test = mnist.find_files(mnist_dir, "test")
    assert train is not None and test is not None
    ti, tl = mnist.load(*train)
    assert ti.shape == (60000, 28, 28) and tl.shape == (60000,)
    np.testing.assert_array_equal(tl[:10], [5, 0, 4, 1, 9, 2, 1, 3, 1, 4])
    vi, vl = mnist.load(*test)
    assert vi.shape == (10000, 28, 28)
    np.testing.assert_array_equal(vl[:10], [7, 2, 1, 0, 4, 1, 4, 9, 5, 9])
    np.testing.assert_array_equal(np.bincount(vl), [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009])
    assert vi.max() == 255 and vi.min() == 0 and (vi[:, 0, :] == 0).all()  # top rows are background


def test_convert_onto_a_file_or_a_failing_disk_is_a_data_error(small, tmp_path, monkeypatch):
    """(root ignores read-only folders: a path under a file, and a disk error raised by LMDB.)"""
    _, _, ip, lp = small
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match=r"file/db: cannot create the database"):
        mnist.convert(ip, lp, tmp_path / "file" / "db")

    class FailingTxn:
        def put(self, key, value):
            raise lmdb.DiskError("mdb_put: No space left on device")

        def abort(self):
            pass

    real_open = lmdb.open

    def open_failing(*args, **kwargs):
        env = real_open(*args, **kwargs)

        class Env:
            def begin(self, write=False):
                return FailingTxn()

            def __getattr__(self, name):
                return getattr(env, name)

        return Env()

    monkeypatch.setattr(lmdb, "open", open_failing)
    with pytest.raises(DataError, match=r"full/db: cannot write the LMDB database: .*No space left.*disk full"):
        mnist.convert(ip, lp, tmp_path / "full" / "db")
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == []  # the partial build is gone
