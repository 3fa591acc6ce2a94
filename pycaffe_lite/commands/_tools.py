"""Shared pieces of BVLC's tools (``convert_imageset`` & co.): their gflags as argparse options for
``pycaffe-lite <tool>``, the gflags result as the same ``argparse.Namespace`` for ``caffe <tool>`` and
the tools' console scripts, and database writers/readers for both of BVLC's backends.

LMDB goes through :class:`pycaffe_lite.data.db.LMDBWriter` / :func:`pycaffe_lite.data.db.open_cursor`. LevelDB
goes through ``plyvel`` (the ``leveldb`` extra), with a writer that builds the database in a
temporary folder and renames it into place when complete, as the LMDB writer does.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..data import db
from ..durable import temp_path
from ..errors import DataError
from ..optional import require
from .gflags import Flag, FlagError, Parsed

log = logging.getLogger("pycaffe_lite")

BACKENDS = ("lmdb", "leveldb")


def add_gflags(parser: argparse.ArgumentParser, flags: Sequence[Flag], positional: Sequence[str],
               optional: Sequence[str] = ()) -> None:
    """The tool's gflags as ``--name`` / ``-name`` options, and its positional arguments."""
    for f in flags:
        names = [f"--{f.name}", f"-{f.name}"]
        if f.kind is bool:
            parser.add_argument(*names, dest=f.name, action="store_true", default=f.default, help=f.help)
        else:
            parser.add_argument(*names, dest=f.name, type=f.kind, default=f.default, help=f.help)
    for name in positional:
        parser.add_argument(name, metavar=name.upper())
    for name in optional:
        parser.add_argument(name, metavar=name.upper(), nargs="?", default=None)


def namespace(parsed: Parsed, positional: Sequence[str], optional: Sequence[str], usage: str) -> argparse.Namespace:
    """The Namespace ``add_gflags``'s parser would give, from a gflags parse; FlagError with the
    tool's usage when the number of positional arguments is wrong."""
    args = parsed.positional
    if not len(positional) <= len(args) <= len(positional) + len(optional):
        raise FlagError(f"expected {len(positional)}" + (f" to {len(positional) + len(optional)}" if optional else "")
                        + f" arguments, got {len(args)}. Usage: {usage}")
    ns = argparse.Namespace(**parsed.values)
    names = list(positional) + list(optional)
    for i, name in enumerate(names):
        setattr(ns, name, args[i] if i < len(args) else None)
    return ns


def check_backend(backend: str) -> str:
    name = str(backend).lower()
    if name not in BACKENDS:
        raise FlagError(f"-backend {backend}: unknown database backend (lmdb or leveldb)")
    return name


def _plyvel():
    return require("plyvel", feature="the LevelDB backend", extra="leveldb")


class LevelDBWriter:
    """Build a new LevelDB at ``path`` (``put``, ``commit``, ``close``; ``with`` discards it on error)."""

    def __init__(self, path: str | os.PathLike) -> None:
        plyvel = _plyvel()
        self.path = Path(path)
        if self.path.exists():
            raise DataError(f"{self.path}: already exists (remove it first)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = temp_path(self.path)
        self._db = plyvel.DB(str(self._tmp), create_if_missing=True, error_if_exists=True)
        self._batch = self._db.write_batch()
        self.count = 0

    def put(self, key: bytes, value: bytes) -> None:
        self._batch.put(key, value)
        self.count += 1

    def commit(self) -> None:
        self._batch.write()
        self._batch = self._db.write_batch()

    def close(self) -> None:
        self.commit()
        self._db.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._db.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> LevelDBWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def open_writer(path: str | os.PathLike, backend: str):
    """A new database of ``backend`` ('lmdb' or 'leveldb') at ``path`` (which must not exist)."""
    if check_backend(backend) == "lmdb":
        return db.LMDBWriter(path)
    return LevelDBWriter(path)


def read_records(path: str | os.PathLike, backend: str) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of a database, in key order, once."""
    if check_backend(backend) == "lmdb":
        with db.open_cursor(path, "lmdb") as cursor:
            for _ in range(len(cursor)):
                yield cursor.key(), cursor.value()
                cursor.next()
        return
    plyvel = _plyvel()
    if not Path(path).is_dir():
        raise DataError(f"{path}: database not found (no such folder)")
    try:
        handle = plyvel.DB(str(path), create_if_missing=False)
    except plyvel.Error as exc:
        raise DataError(f"{path}: cannot open as a LevelDB database: {exc}") from None
    try:
        yield from handle.iterator()
    finally:
        handle.close()
