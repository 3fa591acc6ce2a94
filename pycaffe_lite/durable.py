"""Files that are whole or absent: temporary names beside the final one, then a rename.

``temp_path`` names a temporary ``.<final name>.<pid>.<random>.tmp``; ``write_temp`` writes and
fsyncs one; ``remove_stale_temps`` removes those whose writing process has ended. New files and
folders follow the umask (``default_mode``; ``tempfile`` would make them 0600 / 0700). Used by every
writer of the package (weights, solver states, databases, converted data).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

_TMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]+\.tmp$")


def current_umask() -> int:
    """This process's umask (read without changing it where /proc allows)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_mode(directory: bool = False) -> int:
    """The mode ``open``/``mkdir`` would give a new file (0666) or folder (0777) under the umask."""
    return (0o777 if directory else 0o666) & ~current_umask()


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def writer_alive(tmp: Path) -> bool:
    """Whether the process that named the temporary ``tmp`` (see ``temp_path``) still runs."""
    m = _TMP_RE.match(tmp.name)
    return m is not None and pid_alive(int(m.group("pid")))


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def describe(exc: OSError) -> str:
    return exc.strerror or str(exc)


def temp_path(final: Path) -> Path:
    """A new name ``.<final name>.<pid>.<random>.tmp`` beside ``final`` for a file or folder built
    before it is renamed to ``final``; ``remove_stale_temps`` removes those of ended processes."""
    return final.parent / f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def remove_stale_temps(directory: Path, owns: Callable[[str], bool]) -> list[Path]:
    """Remove the temporary files and folders (named by ``temp_path``) in ``directory`` whose
    process has ended and whose final name ``owns`` accepts. Returns the removed paths."""
    removed = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    for entry in entries:
        m = _TMP_RE.match(entry.name)
        if m is None or not owns(m.group("name")) or writer_alive(entry):
            continue
        try:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        except OSError:
            continue
        removed.append(entry)
    return removed


def write_temp(final: Path, data: bytes) -> Path:
    """Write ``data`` to a fsynced temporary file beside ``final`` (mode per umask); returns it."""
    tmp = temp_path(final)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # open() applies the umask
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp
