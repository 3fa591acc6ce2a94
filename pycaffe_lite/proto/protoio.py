"""Reading and writing protobuf messages (text and binary) with clear errors and atomic writes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

from google.protobuf import message as pb_message
from google.protobuf import text_format

from ..durable import remove_stale_temps, temp_path
from ..errors import PrototxtError
from . import nvcaffe

M = TypeVar("M", bound=pb_message.Message)


def path_kind(path: str | os.PathLike) -> str:
    """What ``path`` is, in words ("a folder", "a FIFO (named pipe)", "a character device"...),
    for messages about a path that should be a regular file."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "missing"
    for test, words in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def check_regular_file(path: str | os.PathLike, what: str, error: type[Exception] = PrototxtError) -> None:
    """``error`` naming ``path`` unless it is a regular file: "<what> not found" when it does not
    exist, else what it is (a folder, a FIFO, /dev/zero's character device: reading those would
    fail or never end)."""
    if os.path.isfile(path):
        return
    if not os.path.exists(path):
        raise error(f"{path}: {what} not found")
    raise error(f"{path}: is {path_kind(path)}, not a {what}")


def parse_text(text: str, message: M, source: str = "<string>") -> M:
    """Parse prototxt ``text`` into ``message``; errors carry ``source:line:column``."""
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        line, col = exc.GetLine(), exc.GetColumn()
        where = f"{source}:{line}:{col}" if line is not None else source
        detail = str(exc)
        # The parser prefixes "line:col : "; keep only its explanation.
        if line is not None and " : " in detail:
            detail = detail.split(" : ", 1)[1]
        raise PrototxtError(
            f"{where}: malformed {message.DESCRIPTOR.name} prototxt: {detail}"
        ) from None
    return message


def read_text(path: str | os.PathLike, message: M) -> M:
    """Read a prototxt file into ``message``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PrototxtError(f"{path}: cannot read {message.DESCRIPTOR.name} file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PrototxtError(
            f"{path}: not a text prototxt (is it a binary file? expected a {message.DESCRIPTOR.name})"
        ) from None
    return parse_text(text, message, str(path))


def read_binary(path: str | os.PathLike, message: M, what: str = "binary proto") -> M:
    """Read a binary protobuf file (``.caffemodel``, ``.solverstate``, ``.binaryproto``).

    A NetParameter written by NVCaffe keeps its layers' precision types (``nvcaffe.move_layer_types``)."""
    path = Path(path)
    check_regular_file(path, what if "file" in what else f"{what} file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PrototxtError(f"{path}: cannot read {what}: {exc.strerror}") from None
    if message.DESCRIPTOR.full_name == "caffe.NetParameter":
        data = nvcaffe.move_layer_types(data)
    try:
        message.ParseFromString(data)
    except pb_message.DecodeError as exc:
        raise PrototxtError(
            f"{path}: corrupt or not a {what} (expected a binary {message.DESCRIPTOR.name}): {exc}"
        ) from None
    return message


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it (``durable.temp_path``: named
    with this process id; those that ended writers of ``path`` left are removed first), then rename."""

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent, lambda name: name == path.name)
    tmp = temp_path(path)
    try:
        with open(tmp, "xb") as fh:  # created under the umask, as open() makes any file
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_binary(path: str | os.PathLike, message: pb_message.Message) -> None:
    """Serialize ``message`` to ``path`` atomically."""
    atomic_write_bytes(path, message.SerializeToString())


def write_text(path: str | os.PathLike, message: pb_message.Message) -> None:
    """Write ``message`` as prototxt to ``path`` atomically."""
    atomic_write_bytes(path, text_format.MessageToString(message).encode())
