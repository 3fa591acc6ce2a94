"""Key-value databases of serialized records (Caffe's ``db`` layer): LMDB and LevelDB.

One interface for both backends (Caffe's ``db::GetDB`` / ``Open`` / ``NewCursor`` /
``NewTransaction``)::

    open(path, backend="lmdb", mode="r")   # "r": a Cursor; "w": a Writer replacing any database
                                           # there; "new": a Writer, DataError if path exists

A cursor (``open_cursor(source, backend)``, or ``open(..., "r")``) reads records in key order and
cycles back to the first record after the last one: ``key()``, ``value()``, ``next()`` (True when
it wrapped), ``seek_to_first()``, ``seek(index, key)``, ``len()``, ``index``, ``close()``. A writer
(``LMDBWriter``, ``LevelDBWriter``, or ``open(..., "w")``) has ``put(key, value)``, ``commit()``,
``close()`` and ``abort()``: it builds the new database in a temporary folder and renames it into
place when closed without error, so a killed build leaves no half database under the final name; the
next build of that name removes the temporary folders of killed ones.

``backend`` is a string ("lmdb", "leveldb") or a ``DataParameter.DB`` value; BVLC's default (a Data
layer without ``backend:``) is LEVELDB. LevelDB needs the ``plyvel`` package (the ``leveldb`` extra).

py-lmdb refuses to open one environment twice in a process, and LevelDB locks its folder, so read
handles are shared between cursors (a train and a test net reading the same database) and closed
with the last one. LMDB files are memory-mapped: a data file replaced or rewritten while a run reads
it would kill the process with SIGBUS, so an LMDB cursor checks the file's identity (device, inode,
size, modification time) before each access and raises a DataError when it changed. LevelDB
memory-maps its table files too: a LevelDB cursor checks every 64 records and at each wrap that no
table file it opened was rewritten in place (a check per record would cost a stat per table file;
a rewrite read within those 64 records can still crash the reader).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from ..durable import default_mode, remove_stale_temps, temp_path
from ..errors import DataError
from ..optional import require

log = logging.getLogger("pycaffe_lite")

_ENVS: dict[tuple[str, str], list] = {}  # (backend, realpath) -> [handle, reference count]
_ENVS_LOCK = threading.Lock()
# Held by every LMDB cursor operation and across the fork of data workers (quiesced), so that no
# operation is half done in another thread when a worker process is forked: py-lmdb counts the
# operations in flight on an environment, and a count copied mid-operation never drops in the child.
_OPS_LOCK = threading.RLock()
BACKENDS = ("lmdb", "leveldb")


def _lmdb():
    return require("lmdb", feature="the LMDB backend")


def _plyvel():
    return require("plyvel", feature="the LevelDB backend", extra="leveldb")


def backend_name(backend) -> str:
    """'lmdb' or 'leveldb' from a DataParameter.DB value or a string."""
    if isinstance(backend, str):
        return backend.lower()
    return {0: "leveldb", 1: "lmdb"}.get(int(backend), str(backend))


def looks_like(path: str | os.PathLike) -> str | None:
    """'lmdb' or 'leveldb' when the folder ``path`` holds that backend's files, else None."""
    path = Path(path)
    if (path / "data.mdb").is_file():
        return "lmdb"
    if (path / "CURRENT").is_file() and any(path.glob("MANIFEST-*")):
        return "leveldb"
    return None


def check_backend(backend, source: str | os.PathLike, where: str = "") -> str:
    """The backend's name ('lmdb' or 'leveldb'); DataError for an unknown one (naming ``source``)."""
    name = backend_name(backend)
    if name in BACKENDS:
        return name
    prefix = f"{where}: " if where else ""
    raise DataError(f"{prefix}{source}: unknown database backend '{backend}' (supported: LMDB, LEVELDB)")


def _wrong_backend_hint(path: Path, name: str) -> str:
    other = looks_like(path)
    if other is None or other == name:
        return ""
    return f" ({path} looks like {'an LMDB' if other == 'lmdb' else 'a LevelDB'}: set 'backend: {other.upper()}' " \
        "in data_param; BVLC's default, when backend is not given, is LEVELDB)"


def _open_lmdb_env(path: Path):
    lmdb = _lmdb()
    try:
        env = lmdb.open(
            str(path), readonly=True, lock=False, readahead=False,
            subdir=path.is_dir(), max_readers=512,
        )
    except lmdb.Error as exc:
        raise DataError(f"{path}: cannot open as an LMDB database: {exc}{_wrong_backend_hint(path, 'lmdb')}") from None
    try:
        _check_complete(path, env)
    except BaseException:
        env.close()
        raise
    return env


def _open_leveldb(path: Path):
    plyvel = _plyvel()
    if not path.is_dir():
        raise DataError(f"{path}: not a LevelDB database (a LevelDB is a folder){_wrong_backend_hint(path, 'leveldb')}")
    try:
        return plyvel.DB(str(path), create_if_missing=False)
    except plyvel.Error as exc:
        msg = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        hint = _wrong_backend_hint(path, "leveldb")
        if "lock" in msg.lower():
            hint += " (another process has it open: LevelDB allows one process at a time; use LMDB to share it)"
        raise DataError(f"{path}: cannot open as a LevelDB database: {msg}{hint}") from None


def _acquire(path: Path, backend: str):
    _lmdb() if backend == "lmdb" else _plyvel()  # a missing package first: it names the extra
    key = (backend, os.path.realpath(path))
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is None:
            if not path.exists():
                raise DataError(f"{path}: database not found (no such file or folder)")
            handle = _open_lmdb_env(path) if backend == "lmdb" else _open_leveldb(path)
            entry = _ENVS[key] = [handle, 0]
        entry[1] += 1
        return key, entry[0]


def _check_complete(path: Path, env) -> None:
    """DataError unless the data file holds every page the environment's header declares: reading
    a page past the end of a truncated memory-mapped file kills the process with SIGBUS."""
    data = path / "data.mdb" if path.is_dir() else path
    try:
        size = data.stat().st_size
        info, stat = env.info(), env.stat()
    except (OSError, _lmdb().Error) as exc:
        raise DataError(f"{path}: cannot inspect the LMDB database: {exc}") from None
    need = (int(info["last_pgno"]) + 1) * int(stat["psize"])
    if size < need:
        raise DataError(
            f"{path}: truncated LMDB database: {data.name} holds {size} bytes but its header declares "
            f"{need} ({int(info['last_pgno']) + 1} pages of {int(stat['psize'])}); copy or convert it again"
        )


def _release(key: tuple[str, str]) -> None:
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _ENVS[key]
            entry[0].close()


@contextlib.contextmanager
def quiesced() -> Iterator[None]:
    """No database is opened, closed or read through a cursor of this module inside the block
    (worker processes are forked inside it)."""
    with _OPS_LOCK, _ENVS_LOCK:
        yield


def close_inherited() -> None:
    """In a forked child (a data worker): close the LMDB handles inherited from the parent, so the
    child may open its own (py-lmdb refuses a second handle on one file in a process; a handle must
    not be used across fork). The parent's handles are untouched; it forks inside :func:`quiesced`,
    so no operation was in flight. LevelDB handles are left alone (closing one waits for background
    compactions, whose threads a forked child does not have). (No lock: the child has one thread.)"""
    for key in [k for k in _ENVS if k[0] == "lmdb"]:
        entry = _ENVS.pop(key)
        try:
            entry[0].close()
        except Exception:
            pass


def _identity(path: str) -> tuple[int, int, int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class _CursorBase:
    """What both backends' cursors share: cycling, seeking by index and key, closing."""

    path: Path
    index: int

    def __len__(self) -> int:
        raise NotImplementedError

    def seek_to_first(self) -> None:
        raise NotImplementedError

    def next(self) -> bool:
        raise NotImplementedError

    def _set_key(self, key: bytes) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def seek(self, index: int, key: bytes | None = None) -> None:
        """Go to the record ``index`` (0-based, key order), whose key is ``key`` when given (a
        saved position: found directly, and checked)."""
        index = int(index)
        if not 0 <= index < len(self):
            raise DataError(f"{self.path}: record {index} out of range (the database holds {len(self)})")
        if key:
            if not self._set_key(bytes(key)):
                self.seek_to_first()  # (the cursor is left on no record)
                raise DataError(f"{self.path}: no record with key {bytes(key)!r} (was the database rebuilt?)")
            self.index = index
            return
        self.seek_to_first()
        for _ in range(index):
            self.next()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class Cursor(_CursorBase):
    """Read cursor over an LMDB in key order; ``next()`` wraps to the first record at the end.
    Every access first checks that the data file is still the one opened (see the module doc)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._closed = True
        self._key, self._env = _acquire(self.path, "lmdb")
        self._closed = False
        self._data_file = self.path / "data.mdb" if self.path.is_dir() else self.path
        self._data_file_str = str(self._data_file)  # (checked before every access: os.stat of a str is cheapest)
        try:
            self._identity = _identity(self._data_file_str)
        except OSError as exc:
            self.close()
            raise DataError(f"{self.path}: cannot read the LMDB database: {exc.strerror}") from None
        try:
            with _OPS_LOCK:
                self._txn = self._env.begin(buffers=False)
                self._cursor = self._txn.cursor()
                self._length = self._txn.stat()["entries"]
        except _lmdb().Error as exc:
            self.close()
            raise DataError(f"{self.path}: unreadable LMDB database: {exc}") from None
        if self._length == 0:
            self.close()
            raise DataError(f"{self.path}: the LMDB database is empty")
        self.seek_to_first()

    def check_unchanged(self) -> None:
        """DataError when the data file was replaced, truncated or rewritten since it was opened
        (reading it on would read a different database, or crash the process with SIGBUS)."""
        try:
            now = _identity(self._data_file_str)
        except OSError as exc:
            raise DataError(f"{self._data_file}: the LMDB data file disappeared while being read "
                            f"({exc.strerror}); restart from the last snapshot once it is back") from None
        if now != self._identity:
            was = self._identity
            what = ("replaced by another file" if now[:2] != was[:2] else
                    f"rewritten ({was[2]} -> {now[2]} bytes)" if now[2] != was[2] else "rewritten")
            raise DataError(
                f"{self._data_file}: the LMDB database was {what} while this run was reading it; stopped "
                "before reading it on (a memory-mapped file changed under a reader crashes the process with "
                "SIGBUS). Write new data under a new name, then resume from the last snapshot"
            )

    def __len__(self) -> int:
        return self._length

    def seek_to_first(self) -> None:
        self.check_unchanged()
        with _OPS_LOCK:
            if not self._cursor.first():
                raise DataError(f"{self.path}: the LMDB database is empty")
        self.index = 0

    def _set_key(self, key: bytes) -> bool:
        self.check_unchanged()
        with _OPS_LOCK:
            return bool(self._cursor.set_key(key))

    def key(self) -> bytes:  # (the record's page was checked by next/seek)
        with _OPS_LOCK:
            return self._cursor.key()

    def value(self) -> bytes:
        self.check_unchanged()
        with _OPS_LOCK:
            return self._cursor.value()

    def next(self) -> bool:
        """Advance; at the end go back to the first record and return True (wrapped)."""
        self.check_unchanged()
        with _OPS_LOCK:
            moved = self._cursor.next()
        if moved:
            self.index += 1
            return False
        self.seek_to_first()
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with _OPS_LOCK:
            for name in ("_cursor", "_txn"):
                obj = self.__dict__.pop(name, None)
                if obj is not None and name == "_txn":
                    obj.abort()
            _release(self._key)


class LevelDBCursor(_CursorBase):
    """Read cursor over a LevelDB in key order (a consistent snapshot of it); ``next()`` wraps to
    the first record at the end. The record count is counted on first use of ``len()``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._closed = True
        self._key, self._db = _acquire(self.path, "leveldb")
        self._closed = False
        self._length: int | None = None
        try:
            self._snapshot = self._db.snapshot()
            self._it = self._snapshot.raw_iterator()
        except _plyvel().Error as exc:
            self.close()
            raise DataError(f"{self.path}: unreadable LevelDB database: {exc}") from None
        self._it.seek_to_first()
        if not self._it.valid():
            self.close()
            raise DataError(f"{self.path}: the LevelDB database is empty")
        self.index = 0
        self._tables = self._table_identities()
        self._since_check = 0

    CHECK_EVERY = 64  # records between checks of the table files (and at every wrap)

    def _table_identities(self) -> dict[str, tuple[int, int, int]]:
        out = {}
        try:
            with os.scandir(self.path) as entries:
                for e in entries:
                    if e.name.endswith((".ldb", ".sst")):
                        st = e.stat()
                        out[e.name] = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            pass
        return out

    def check_unchanged(self) -> None:
        """DataError when a table file that this reader may have memory-mapped was rewritten in place
        (same file, new size or time: ``cp -r new/* old/``), which could crash it with SIGBUS.
        Table files LevelDB itself adds or removes (compaction) are fine: tables never change."""
        for name, (ino, size, mtime) in self._tables.items():
            try:
                st = os.stat(self.path / name)
            except OSError:
                continue  # compacted away, or the folder replaced: the open files stay readable
            if st.st_ino == ino and (st.st_size != size or st.st_mtime_ns != mtime):
                raise DataError(
                    f"{self.path / name}: a table file of the LevelDB database was rewritten while this run was "
                    "reading it; stopped before reading it on (a memory-mapped file changed under a reader crashes "
                    "the process with SIGBUS). Write new data under a new name, then resume from the last snapshot"
                )

    def __len__(self) -> int:
        if self._length is None:
            n = 0
            for _ in self._snapshot.iterator(include_value=False):
                n += 1
            self._length = n
        return self._length

    def seek_to_first(self) -> None:
        self._it.seek_to_first()
        if not self._it.valid():
            raise DataError(f"{self.path}: the LevelDB database is empty")
        self.index = 0

    def _set_key(self, key: bytes) -> bool:
        self._it.seek(key)
        return bool(self._it.valid()) and self._it.key() == key

    def key(self) -> bytes:
        return self._it.key()

    def value(self) -> bytes:
        return self._it.value()

    def next(self) -> bool:
        self._since_check += 1
        if self._since_check >= self.CHECK_EVERY:
            self._since_check = 0
            self.check_unchanged()
        self._it.next()
        if self._it.valid():
            self.index += 1
            return False
        self.check_unchanged()
        self._tables.update({k: v for k, v in self._table_identities().items() if k not in self._tables})
        self.seek_to_first()
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for name in ("_it", "_snapshot"):
            obj = self.__dict__.pop(name, None)
            if obj is not None:
                obj.close()
        _release(self._key)


def open_cursor(source: str | os.PathLike, backend="lmdb", where: str = "") -> LevelDBCursor | Cursor:
    """A cycling read cursor on ``source``; DataError (prefixed by ``where``) when it is missing,
    unreadable, empty or of another backend (the message says which one it looks like)."""
    name = check_backend(backend, source, where)
    try:
        return Cursor(source) if name == "lmdb" else LevelDBCursor(source)
    except DataError as exc:
        raise DataError(f"{where}: {exc}" if where else str(exc)) from None


def open_writer(path: str | os.PathLike, backend="lmdb", overwrite: bool = False) -> LMDBWriter | LevelDBWriter:
    """A writer building a new database of ``backend`` at ``path`` (see ``LMDBWriter``)."""
    name = check_backend(backend, path)
    return LMDBWriter(path, overwrite=overwrite) if name == "lmdb" else LevelDBWriter(path, overwrite=overwrite)


def open(path: str | os.PathLike, backend="lmdb", mode: str = "r"):  # noqa: A001 (Caffe's db::Open)
    """Caffe's ``db->Open(source, mode)`` for both backends: mode "r" gives a cycling read
    ``Cursor``; "w" a writer that replaces the database at ``path`` when closed; "new" a writer
    that refuses an existing ``path`` (Caffe's NEW)."""
    if mode == "r":
        return open_cursor(path, backend)
    if mode in ("w", "new"):
        return open_writer(path, backend, overwrite=(mode == "w"))
    raise DataError(f"{path}: unknown database open mode '{mode}' (expected 'r', 'w' or 'new')")


class _AtomicBuild:
    """A database folder built under a temporary name and renamed into place on ``close()``."""

    path: Path
    overwrite: bool
    _tmp: Path

    def _prepare(self, path: str | os.PathLike, overwrite: bool) -> None:
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise DataError(
                f"{self.path}: already exists (remove it first, or use --overwrite on the command line, "
                "overwrite=True in Python)"
            )
        self.overwrite = overwrite
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for left in remove_stale_temps(self.path.parent, lambda name: name == self.path.name):
                log.info("Removed %s (left by an interrupted database build)", left)
            self._tmp = temp_path(self.path)
            os.mkdir(self._tmp)  # mode per umask
        except OSError as exc:
            raise DataError(f"{self.path}: cannot create the database: {exc.strerror or exc}") from None

    def _place(self) -> None:
        """Move the finished database to its final path (DataError, the build removed, if it cannot)."""
        try:
            for f in self._tmp.iterdir():
                os.chmod(f, default_mode())  # the libraries create files with their own mode: follow the umask
            old = None
            if self.path.exists() and self.overwrite:  # moved aside whole, removed once replaced
                old = temp_path(self.path)
                os.replace(self.path, old)
            os.replace(self._tmp, self.path)
            if old is not None:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
        except OSError as exc:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise DataError(f"{self.path}: cannot move the finished database into place: {exc.strerror}") from None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()  # type: ignore[attr-defined]
        else:
            self.abort()  # type: ignore[attr-defined]


class LevelDBWriter(_AtomicBuild):
    """Build a new LevelDB at ``path``: ``put(key, value)``, ``commit()`` (writes the batch);
    ``close()`` commits and renames the finished database into place (an exception inside
    ``with`` discards it)."""

    def __init__(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        plyvel = _plyvel()
        self._prepare(path, overwrite)
        try:
            self._db = plyvel.DB(str(self._tmp), create_if_missing=True, error_if_exists=False)
        except plyvel.Error as exc:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise DataError(f"{self.path}: cannot create the LevelDB database: {exc}") from None
        self._batch = self._db.write_batch()
        self.count = 0

    def put(self, key: bytes, value: bytes) -> None:
        self._batch.put(bytes(key), bytes(value))
        self.count += 1

    def commit(self) -> None:
        try:
            self._batch.write()
        except _plyvel().Error as exc:
            raise DataError(f"{self.path}: cannot write the LevelDB database: {exc}") from None
        self._batch = self._db.write_batch()

    def close(self) -> None:
        """Commit what remains and move the database to its final path."""
        if self._db is None:
            return
        self.commit()
        self._db.close()
        self._db = None
        self._place()

    def abort(self) -> None:
        """Discard the database being built."""
        if self._db is None:
            return
        self._db.close()
        self._db = None
        shutil.rmtree(self._tmp, ignore_errors=True)


class LMDBWriter(_AtomicBuild):
    """Build a new LMDB at ``path``: ``put(key, value)``, ``commit()``; ``close()`` commits and
    renames the finished database into place (an exception inside ``with`` discards it). A full or
    read-only disk is a DataError naming the database (the partial build is removed)."""

    def __init__(self, path: str | os.PathLike, overwrite: bool = False, map_size: int = 1 << 30) -> None:
        lmdb = _lmdb()
        self._prepare(path, overwrite)
        self._map_size = map_size
        self._env = None
        try:
            self._env = lmdb.open(str(self._tmp), map_size=map_size, subdir=True)
            self._txn = self._env.begin(write=True)
        except lmdb.Error as exc:
            self._fail("cannot create the LMDB database", exc)
        self._pending: list[tuple[bytes, bytes]] = []
        self.count = 0

    def _fail(self, what: str, exc: BaseException):
        """Discard the build and raise a DataError naming the database."""
        self.abort()
        shutil.rmtree(self._tmp, ignore_errors=True)
        raise DataError(f"{self.path}: {what}: {exc} (disk full or not writable?)") from None

    def put(self, key: bytes, value: bytes) -> None:
        lmdb = _lmdb()
        try:
            try:
                self._txn.put(key, value)
            except lmdb.MapFullError:
                self._grow()
                self._txn.put(key, value)
        except lmdb.Error as exc:
            self._fail("cannot write the LMDB database", exc)
        self._pending.append((key, value))
        self.count += 1

    def _grow(self) -> None:
        """Abort, double the map size and replay the uncommitted records."""
        assert self._env is not None
        self._txn.abort()
        self._map_size *= 2
        self._env.set_mapsize(self._map_size)
        self._txn = self._env.begin(write=True)
        for k, v in self._pending:
            self._txn.put(k, v)

    def commit(self) -> None:
        lmdb = _lmdb()
        assert self._env is not None
        try:
            try:
                self._txn.commit()
            except lmdb.MapFullError:
                self._grow()
                self._txn.commit()
            self._pending.clear()
            self._txn = self._env.begin(write=True)
        except lmdb.Error as exc:
            self._fail("cannot write the LMDB database", exc)

    def close(self) -> None:
        """Commit what remains and move the database to its final path."""
        if self._env is None:
            return
        self.commit()
        self._txn.abort()
        self._env.close()
        self._env = None
        self._place()

    def abort(self) -> None:
        """Discard the database being built."""
        if self._env is None:
            return
        try:
            self._txn.abort()
            self._env.close()
        except Exception:
            pass
        self._env = None
        shutil.rmtree(self._tmp, ignore_errors=True)
