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
FILES_ONLY = "files_only"  # a LogRecord attribute: not on the console (see _ConsoleHandler.filter)
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

    def filter(self, record: logging.LogRecord) -> bool:
        """Records logged with ``extra={FILES_ONLY: True}`` (lines a command also prints to stdout)
        go to the log files only, so the screen shows them once."""
        return not getattr(record, FILES_ONLY, False) and bool(super().filter(record))


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


# -- glog's log files (``-log_dir``) -----------------------------------------------------------
SEVERITIES = (("INFO", logging.INFO), ("WARNING", logging.WARNING), ("ERROR", logging.ERROR),
              ("FATAL", logging.CRITICAL))


def log_file_name(program: str, severity: str, when: float | None = None, pid: int | None = None) -> str:
    """glog's file name: ``<program>.<host>.<user>.log.<SEVERITY>.<yyyymmdd-hhmmss>.<pid>``."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no user name from the environment or the password database
        user = "invalid-user"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if when is None else when))
    return f"{program}.{socket.gethostname()}.{user}.log.{severity}.{stamp}.{os.getpid() if pid is None else pid}"


class GlogFileHandler(logging.Handler):
    """One of glog's per-severity files: messages of ``severity`` and above, in glog's line format,
    after glog's three header lines. The file is created at its first message (as glog does), with
    the ``<program>.<SEVERITY>`` symlink beside it pointing at the newest file; flushed every line."""

    def __init__(self, log_dir: str | os.PathLike, program: str, severity: str, levelno: int) -> None:
        super().__init__(levelno)
        self.log_dir = os.fspath(log_dir)
        self.program = program
        self.severity = severity
        self.path: str | None = None
        self._file: TextIO | None = None
        self.setFormatter(GlogFormatter())

    def _open(self) -> TextIO:
        import socket

        now = time.time()
        name = log_file_name(self.program, self.severity, now)
        self.path = os.path.join(self.log_dir, name)
        f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for the process's life)
        f.write(time.strftime("Log file created at: %Y/%m/%d %H:%M:%S\n", time.localtime(now)))
        f.write(f"Running on machine: {socket.gethostname()}\n")
        f.write("Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg\n")
        link = os.path.join(self.log_dir, f"{self.program}.{self.severity}")
        try:
            if os.path.islink(link) or os.path.exists(link):
                os.remove(link)
            os.symlink(name, link)
        except OSError:  # glog ignores a symlink it cannot make
            pass
        return f

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._file is None:
                self._file = self._open()
            self._file.write(self.format(record) + "\n")
            self._file.flush()
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


def log_to_files(log_dir: str | os.PathLike, program: str) -> list[GlogFileHandler]:
    """Add glog's INFO/WARNING/ERROR/FATAL files in ``log_dir`` (created if missing) to the logger,
    replacing files added before; returns the handlers. The logger's own level still decides
    what is logged at all (``init_log``/``-minloglevel``)."""
    os.makedirs(log_dir, exist_ok=True)
    close_log_files()
    handlers = [GlogFileHandler(log_dir, program, sev, levelno) for sev, levelno in SEVERITIES]
    for h in handlers:
        LOG.addHandler(h)
    return handlers


def close_log_files() -> None:
    """Remove and close the file handlers :func:`log_to_files` added."""
    for old in [h for h in LOG.handlers if isinstance(h, GlogFileHandler)]:
        LOG.removeHandler(old)
        old.close()


def set_stderr_level(level: int) -> None:
    """Show only messages of glog ``level`` (0 INFO .. 3 FATAL; 4 = none) and above on the console
    handler of :func:`init_log` (the files keep every message the logger passes)."""
    for h in LOG.handlers:
        if isinstance(h, _ConsoleHandler):
            h.setLevel(GLOG_LEVELS.get(level, logging.CRITICAL + 1))
