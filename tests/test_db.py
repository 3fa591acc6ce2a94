"""LMDB reader/writer: %08d keys round trip, cycling cursor, shared environments, clear errors."""

from __future__ import annotations

import pytest

from pycaffe_lite.data import db
from pycaffe_lite.errors import DataError

pytest.importorskip("lmdb")


def make_db(path, n):
    with db.LMDBWriter(path) as w:
        for i in range(n):
            w.put(b"%08d" % i, b"value-%d" % i)
            if i % 3 == 2:
                w.commit()
    return path


def test_round_trip_and_cycling(tmp_path):
    path = make_db(tmp_path / "d", 7)
    with db.open_cursor(path, "lmdb") as cur:
        assert len(cur) == 7
        seen, wraps = [], []
        for _ in range(16):
            seen.append((cur.key(), cur.value()))
            wraps.append(cur.next())
    keys = [b"%08d" % (i % 7) for i in range(16)]
    assert [k for k, _ in seen] == keys
    assert [v for _, v in seen] == [b"value-%d" % (i % 7) for i in range(16)]
    assert [i for i, w in enumerate(wraps) if w] == [6, 13]


def test_two_cursors_share_one_environment(tmp_path):
    path = make_db(tmp_path / "d", 3)
    a = db.open_cursor(path)
    b = db.open_cursor(path, 1)  # DataParameter.LMDB
    a.next()
    assert (a.key(), b.key()) == (b"00000001", b"00000000")
    a.close()
    b.next()
    assert b.key() == b"00000001"  # still readable after the other cursor closed
    b.close()
    b.close()  # idempotent
    with db.open_cursor(path) as c:
        assert c.key() == b"00000000"


def test_missing_and_unreadable_sources(tmp_path):
    with pytest.raises(DataError, match=r"layer 'x': .*nowhere.*not found"):
        db.open_cursor(tmp_path / "nowhere", where="layer 'x'")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "data.mdb").write_bytes(b"this is not an lmdb file" * 200)
    with pytest.raises(DataError, match=r"junk.*(cannot open as an LMDB|unreadable)"):
        db.open_cursor(junk)
    empty = tmp_path / "empty"
    db.LMDBWriter(empty).close()
    with pytest.raises(DataError, match=r"empty.*database is empty"):
        db.open_cursor(empty)


def test_leveldb_not_supported(tmp_path):
    path = make_db(tmp_path / "d", 1)
    with pytest.raises(DataError, match="LevelDB backend is not supported.*convert the data to LMDB"):
        db.open_cursor(tmp_path / "ldb", "leveldb")
    with pytest.raises(DataError, match="looks like an LMDB: set 'backend: LMDB'"):
        db.open_cursor(path, 0)  # DataParameter.LEVELDB, the proto default
    with pytest.raises(DataError, match="unknown database backend 'rocksdb'"):
        db.open_cursor(path, "rocksdb")


def test_writer_is_atomic(tmp_path):
    target = tmp_path / "d"
    with pytest.raises(RuntimeError):
        with db.LMDBWriter(target) as w:
            w.put(b"00000000", b"x")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []  # nothing left behind
    make_db(target, 2)
    with pytest.raises(DataError, match="already exists.*--overwrite"):
        db.LMDBWriter(target)
    with db.LMDBWriter(target, overwrite=True) as w:
        w.put(b"k", b"v")
    with db.open_cursor(target) as c:
        assert (len(c), c.key(), c.value()) == (1, b"k", b"v")


def test_writer_grows_map(tmp_path):
    target = tmp_path / "big"
    value = b"\xab" * 100_000
    with db.LMDBWriter(target, map_size=1 << 20) as w:  # 1 MiB map, 3 MB of data
        for i in range(30):
            w.put(b"%08d" % i, value)
    with db.open_cursor(target) as c:
        assert len(c) == 30 and c.value() == value
