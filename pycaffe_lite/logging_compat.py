"""``caffe.init_log`` / ``caffe.log``: glog-like messages through Python's ``logging``.

Messages go to the ``pycaffe_lite`` logger. ``init_log(level)`` takes glog's minimum level
(0 INFO, 1 WARNING, 2 ERROR, 3 FATAL) and installs one stderr (or stdout) handler.
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "pycaffe_lite"
_GLOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.CRITICAL}
_handler: logging.Handler | None = None


class _GlogFormatter(logging.Formatter):
    """``I1121 10:42:41.123456 file.py:12] message``, like glog's prefix."""

    def format(self, record: logging.LogRecord) -> str:
        letter = record.levelname[:1] if record.levelname != "CRITICAL" else "F"
        t = self.formatTime(record, "%m%d %H:%M:%S")
        return f"{letter}{t}.{int(record.msecs * 1000):06d} {record.filename}:{record.lineno}] {record.getMessage()}"


def init_log(level: int = 0, std_out: bool = False) -> None:
    """Show messages of glog ``level`` and above on stderr (stdout when ``std_out``)."""
    global _handler
    if level not in _GLOG_LEVELS:
        raise ValueError(f"init_log: level must be 0 (INFO) .. 3 (FATAL), got {level}")
    logger = logging.getLogger(LOGGER_NAME)
    if _handler is not None:
        logger.removeHandler(_handler)
    _handler = logging.StreamHandler(sys.stdout if std_out else sys.stderr)
    _handler.setFormatter(_GlogFormatter())
    logger.addHandler(_handler)
    logger.setLevel(_GLOG_LEVELS[level])
    logger.propagate = False


def log(message: str) -> None:
    """Log ``message`` at INFO level (glog's LOG(INFO))."""
    logging.getLogger(LOGGER_NAME).info(message, stacklevel=2)
