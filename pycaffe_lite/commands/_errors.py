"""One rule for the errors of every command (``pycaffe-lite``, ``caffe``, BVLC's tools, the examples'
scripts): the project's errors (:class:`~pycaffe_lite.errors.CaffeError`), ``OSError`` and
``ValueError`` end the command with one line naming the file and what to do, and exit status 1;
``--debug`` (or ``PYCAFFE_LITE_DEBUG=1`` in the environment) also prints the Python traceback.
Other exceptions are bugs and keep their traceback.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Callable

from ..errors import CaffeError

DEBUG_ENV = "PYCAFFE_LITE_DEBUG"
HANDLED = (CaffeError, OSError, ValueError)

# what to do, per errno of an OSError
_ADVICE = {
    errno.EACCES: "check its permissions, or choose another path",
    errno.EPERM: "check its permissions, or choose another path",
    errno.EROFS: "the file system is read-only: choose another path",
    errno.ENOENT: "check the path (its folder must exist)",
    errno.ENOTDIR: "a part of the path is a file, not a folder: check the path",
    errno.EISDIR: "it is a folder: give a file name",
    errno.ENOSPC: "the disk is full: free some space or choose another path",
    errno.EDQUOT: "the disk quota is used up: free some space or choose another path",
    errno.EEXIST: "it exists already: remove it or choose another name",
}


def debug_requested(flag: bool = False) -> bool:
    """``flag`` (a ``--debug`` option) or ``$PYCAFFE_LITE_DEBUG`` set to anything but ``""``/``0``."""
    return bool(flag) or os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


def describe(exc: BaseException) -> str:
    """The one-line message for a handled error: a CaffeError's own message; an OSError's file,
    reason and advice; a ValueError's text, marked as a bad value."""
    if isinstance(exc, CaffeError):
        return str(exc).strip().replace("\n", " ")
    if isinstance(exc, OSError):
        names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
        reason = exc.strerror or str(exc) or type(exc).__name__
        advice = _ADVICE.get(exc.errno or -1)
        text = f"{' -> '.join(names)}: {reason}" if names else reason
        return f"{text} ({advice})" if advice else text
    text = str(exc).strip().replace("\n", " ") or type(exc).__name__
    return f"bad value: {text}"


def run_guarded(where: str, work: Callable[[], int | None], report: Callable[[str], None],
                debug: bool = False) -> int:
    """``work()``'s exit status; a handled error (see the module docstring) gives 1, its one-line
    message passed to ``report`` (the traceback first, on stderr, when debugging); Ctrl-C gives
    130 with ``<where>: interrupted``."""
    try:
        return int(work() or 0)
    except HANDLED as exc:
        if debug_requested(debug):
            traceback.print_exc(file=sys.stderr)
        hint = "" if isinstance(exc, CaffeError) or debug_requested(debug) else \
            f" (--debug or {DEBUG_ENV}=1 shows the traceback)"
        report(f"{describe(exc)}{hint}")
        return 1
    except KeyboardInterrupt:
        if debug_requested(debug):
            traceback.print_exc(file=sys.stderr)
        print(f"{where}: interrupted", file=sys.stderr)
        return 130
