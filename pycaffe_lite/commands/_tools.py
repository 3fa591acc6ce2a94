"""Shared pieces of BVLC's tools (``convert_imageset`` & co.): their gflags as argparse options for
``pycaffe-lite <tool>``, the gflags result as the same ``argparse.Namespace`` for ``caffe <tool>`` and
the tools' console scripts, and database writers/readers for both of BVLC's backends.

Both backends go through :mod:`pycaffe_lite.data.db` (LMDB with ``lmdb``, LevelDB with ``plyvel``, the
``leveldb`` extra): writers build the database under a temporary name and rename it into place when
complete; readers are its cursors.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..data import db, mnist
from ..errors import DataError
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


def arguments(flags: Sequence[Flag], positional: Sequence[str], usage: str, optional: Sequence[str] = ()
              ) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[Parsed], argparse.Namespace]]:
    """A tool module's ``add_arguments`` (argparse, ``pycaffe-lite <tool>``) and ``namespace`` (a gflags
    parse, ``caffe <tool>``) for its flags and positional arguments."""

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_gflags(parser, flags, positional, optional)

    def to_namespace(parsed: Parsed) -> argparse.Namespace:
        return namespace(parsed, positional, optional, usage)

    return add_arguments, to_namespace


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


def load_mnist(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """The MNIST IDX files of ``args`` (``input_image_file``, ``input_label_file``) as (N, rows, cols)
    images and N labels (``mnist.load`` checks the counts agree), logged as BVLC's MNIST tools do."""
    images, labels = mnist.load(args.input_image_file, args.input_label_file)
    log.info("A total of %d items.", len(images))
    log.info("Rows: %d Cols: %d", images.shape[1], images.shape[2])
    return images, labels


def open_writer(path: str | os.PathLike, backend: str) -> db.LMDBWriter | db.LevelDBWriter:
    """A new database of ``backend`` ('lmdb' or 'leveldb') at ``path`` (which must not exist):
    Caffe's ``db->Open(path, NEW)``, built under a temporary name and renamed into place when
    closed (:func:`pycaffe_lite.data.db.open`). BVLC's tools have no ``-overwrite``: an existing
    ``path`` is refused with a message saying to remove it."""
    name = check_backend(backend)
    if os.path.lexists(path):
        raise DataError(f"{path}: already exists (remove it first)")
    return db.open(path, name, mode="new")


def read_records(path: str | os.PathLike, backend: str) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of a database, in key order, once (through :mod:`pycaffe_lite.data.db`'s
    cursors, which cycle: read ``len(cursor)`` records)."""
    with db.open_cursor(path, check_backend(backend)) as cursor:
        for _ in range(len(cursor)):
            yield cursor.key(), cursor.value()
            cursor.next()
