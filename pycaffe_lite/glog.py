"""The one logging set-up: the ``pycaffe_lite`` logger writes glog's lines, as BVLC Caffe does.

``I1123 01:23:45.123456 12345 solver.py:449] Iteration 100, loss = 0.3`` (severity letter,
month+day, local time with microseconds, thread id padded to 5, file:line), so BVLC's
``tools/extra/parse_log.py`` reads our training logs. Modules log through :data:`LOG` (or
``logging.getLogger("pycaffe_lite")``); :func:`init_log` (pycaffe's ``caffe.init_log``, also called
by the CLI) installs the single handler.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TextIO

LOGGER_NAME = "pycaffe_lite"
LOG = logging.getLogger(LOGGER_NAME)
GLOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.CRITICAL}


class GlogFormatter(logging.Formatter):
    """glog's prefix: ``<I|W|E|F>mmdd hh:mm:ss.uuuuuu <tid> file:line] message``."""

    def format(self, record: logging.LogRecord) -> str:
        letter = "F" if record.levelno >= logging.CRITICAL else record.levelname[:1]
        seconds = int(record.created)
        usec = min(int((record.created - seconds) * 1e6), 999_999)
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(seconds))
        tid = threading.get_native_id() if record.thread == threading.get_ident() else record.process
        line = f"{letter}{stamp}.{usec:06d} {tid:5d} {record.filename}:{record.lineno}] {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _ConsoleHandler(logging.StreamHandler):
    """Writes to the *current* ``sys.stderr`` (or ``sys.stdout``), so redirections are honoured."""

    def __init__(self, std_out: bool) -> None:
        self.std_out = std_out
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stdout if self.std_out else sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def env_level() -> int:
    """glog's minimum level from ``$GLOG_minloglevel`` (0 INFO .. 3 FATAL; 0 when unset or bad)."""
    try:
        return min(max(int(os.environ.get("GLOG_minloglevel", "0")), 0), 3)
    except ValueError:
        return 0


def init_log(level: int | None = None, std_out: bool = False) -> None:
    """Show messages of glog ``level`` (0 INFO .. 3 FATAL) and above on stderr (stdout when
    ``std_out``). ``None`` reads ``$GLOG_minloglevel`` (default 0). Calling it again replaces the
    handler it installed."""
    if level is None:
        level = env_level()
    if level not in GLOG_LEVELS:
        raise ValueError(f"init_log: level must be 0 (INFO) .. 3 (FATAL), got {level}")
    for old in [h for h in LOG.handlers if isinstance(h, _ConsoleHandler)]:
        LOG.removeHandler(old)
    handler = _ConsoleHandler(std_out)
    handler.setFormatter(GlogFormatter())
    LOG.addHandler(handler)
    LOG.setLevel(GLOG_LEVELS[level])


def ensure_console_log() -> bool:
    """Install :func:`init_log`'s handler (level from ``$GLOG_minloglevel``) unless logging is
    configured already (a handler on this logger or on the root logger): what a Python script
    driving a solver needs to see Caffe's log when no progress bar is shown, as Caffe logs to
    stderr by default. Returns whether it installed the handler."""
    if LOG.handlers or logging.getLogger().handlers:
        return False
    init_log()
    return True


def log(message: str) -> None:
    """Log ``message`` at INFO level (pycaffe's ``caffe.log``, glog's LOG(INFO))."""
    LOG.info(message, stacklevel=2)
