"""Key-value databases of serialized records (Caffe's ``db`` layer): LMDB only.

``open_cursor(source, backend)`` gives a read cursor that cycles back to the first record after
the last one; ``LMDBWriter`` builds a new database in a temporary folder and renames it into place
when closed without error, so a killed build leaves no half database under the final name; the
next build of that name removes the temporary folders of killed ones. LevelDB is not supported:
convert such data to LMDB.

py-lmdb refuses to open one environment twice in a process, so read environments are shared
between cursors (a train and a test net reading the same database) and closed with the last one.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

from ..durable import default_mode, remove_stale_temps, temp_path
from ..errors import DataError
from ..optional import require

log = logging.getLogger("pycaffe_lite")

_ENVS: dict[str, list] = {}  # realpath -> [env, reference count]
_ENVS_LOCK = threading.Lock()


def _lmdb():
    return require("lmdb", feature="the LMDB backend")


def backend_name(backend) -> str:
    """'lmdb' or 'leveldb' from a DataParameter.DB value or a string."""
    if isinstance(backend, str):
        return backend.lower()
    return {0: "leveldb", 1: "lmdb"}.get(int(backend), str(backend))


def check_backend(backend, source: str | os.PathLike, where: str = "") -> None:
    """Raise a DataError unless ``backend`` is LMDB (naming the source and how to fix it)."""
    name = backend_name(backend)
    if name == "lmdb":
        return
    prefix = f"{where}: " if where else ""
    if name == "leveldb":
        hint = ""
        if (Path(source) / "data.mdb").is_file():
            hint = f" ({source} looks like an LMDB: set 'backend: LMDB' in data_param)"
        raise DataError(
            f"{prefix}{source}: the LevelDB backend is not supported by pycaffe-lite; convert the "
            f"data to LMDB and set 'backend: LMDB'{hint}"
        )
    raise DataError(f"{prefix}{source}: unknown database backend '{backend}' (supported: LMDB)")


def _acquire_env(path: Path):
    lmdb = _lmdb()
    key = os.path.realpath(path)
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is None:
            if not path.exists():
                raise DataError(f"{path}: database not found (no such file or folder)")
            try:
                env = lmdb.open(
                    str(path), readonly=True, lock=False, readahead=False,
                    subdir=path.is_dir(), max_readers=512,
                )
            except lmdb.Error as exc:
                raise DataError(f"{path}: cannot open as an LMDB database: {exc}") from None
            try:
                _check_complete(path, env)
            except BaseException:
                env.close()
                raise
            entry = _ENVS[key] = [env, 0]
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


def _release_env(key: str) -> None:
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _ENVS[key]
            entry[0].close()


class Cursor:
    """Read cursor over an LMDB in key order; ``next()`` wraps to the first record at the end."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._key, self._env = _acquire_env(self.path)
        self._closed = False
        try:
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

    def __len__(self) -> int:
        return self._length

    def seek_to_first(self) -> None:
        if not self._cursor.first():
            raise DataError(f"{self.path}: the LMDB database is empty")
        self.index = 0

    def seek(self, index: int, key: bytes | None = None) -> None:
        """Go to the record ``index`` (0-based, key order), whose key is ``key`` when given (a
        saved position: found directly, and checked)."""
        index = int(index)
        if not 0 <= index < self._length:
            raise DataError(f"{self.path}: record {index} out of range (the database holds {self._length})")
        if key:
            if not self._cursor.set_key(bytes(key)):
                raise DataError(f"{self.path}: no record with key {bytes(key)!r} (was the database rebuilt?)")
            self.index = index
            return
        self.seek_to_first()
        for _ in range(index):
            self.next()

    def key(self) -> bytes:
        return self._cursor.key()

    def value(self) -> bytes:
        return self._cursor.value()

    def next(self) -> bool:
        """Advance; at the end go back to the first record and return True (wrapped)."""
        if self._cursor.next():
            self.index += 1
            return False
        self.seek_to_first()
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for name in ("_cursor", "_txn"):
            obj = self.__dict__.pop(name, None)
            if obj is not None and name == "_txn":
                obj.abort()
        _release_env(self._key)

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def open_cursor(source: str | os.PathLike, backend="lmdb", where: str = "") -> Cursor:
    """A cycling read cursor on ``source``; DataError (prefixed by ``where``) when it is missing,
    unreadable, empty or not LMDB."""
    check_backend(backend, source, where)
    try:
        return Cursor(source)
    except DataError as exc:
        raise DataError(f"{where}: {exc}" if where else str(exc)) from None


class LMDBWriter:
    """Build a new LMDB at ``path``: ``put(key, value)``, ``commit()``; ``close()`` commits and
    renames the finished database into place (an exception inside ``with`` discards it)."""

    def __init__(self, path: str | os.PathLike, overwrite: bool = False, map_size: int = 1 << 30) -> None:
        lmdb = _lmdb()
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise DataError(
                f"{self.path}: already exists (remove it first, or use --overwrite on the command line, "
                "overwrite=True in Python)"
            )
        self.overwrite = overwrite
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for left in remove_stale_temps(self.path.parent, lambda name: name == self.path.name):
            log.info("Removed %s (left by an interrupted database build)", left)
        self._tmp = temp_path(self.path)
        os.mkdir(self._tmp)  # mode per umask
        self._map_size = map_size
        self._env = lmdb.open(str(self._tmp), map_size=map_size, subdir=True)
        self._txn = self._env.begin(write=True)
        self._pending: list[tuple[bytes, bytes]] = []
        self.count = 0

    def put(self, key: bytes, value: bytes) -> None:
        lmdb = _lmdb()
        try:
            self._txn.put(key, value)
        except lmdb.MapFullError:
            self._grow()
            self._txn.put(key, value)
        self._pending.append((key, value))
        self.count += 1

    def _grow(self) -> None:
        """Abort, double the map size and replay the uncommitted records."""
        self._txn.abort()
        self._map_size *= 2
        self._env.set_mapsize(self._map_size)
        self._txn = self._env.begin(write=True)
        for k, v in self._pending:
            self._txn.put(k, v)

    def commit(self) -> None:
        lmdb = _lmdb()
        try:
            self._txn.commit()
        except lmdb.MapFullError:
            self._grow()
            self._txn.commit()
        self._pending.clear()
        self._txn = self._env.begin(write=True)

    def close(self) -> None:
        """Commit what remains and move the database to its final path."""
        if self._env is None:
            return
        self.commit()
        self._txn.abort()
        self._env.close()
        self._env = None
        for f in self._tmp.iterdir():
            os.chmod(f, default_mode())  # py-lmdb creates them with its own mode: follow the umask
        old = None
        if self.path.exists() and self.overwrite:  # moved aside whole, removed once replaced
            old = temp_path(self.path)
            os.replace(self.path, old)
        os.replace(self._tmp, self.path)
        if old is not None:
            shutil.rmtree(old) if old.is_dir() else old.unlink()

    def abort(self) -> None:
        """Discard the database being built."""
        if self._env is None:
            return
        self._txn.abort()
        self._env.close()
        self._env = None
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> LMDBWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
