"""Timer: wall-clock timing like ``caffe.Timer`` (start, stop, ms); in GPU mode it waits for
queued device work at start and stop, so the time covers the kernels too."""

from __future__ import annotations

import time

from . import common
from .gpu import backend


def _sync_if_gpu() -> None:
    if common.mode() is common.Mode.GPU:
        backend.synchronize()


class Timer:
    """``t = Timer(); t.start(); ...; t.stop(); t.ms`` (or ``milliseconds()`` / ``seconds()``)."""

    def __init__(self) -> None:
        self._start: float | None = None
        self._elapsed = 0.0
        self._running = False

    @property
    def running(self) -> bool:
        return self._running

    @property
    def has_run_at_least_once(self) -> bool:
        return self._start is not None

    def start(self) -> None:
        """Start (or restart) timing."""
        if not self._running:
            _sync_if_gpu()
            self._start = time.perf_counter()
            self._running = True

    def stop(self) -> None:
        """Stop timing; the elapsed time is kept until the next start."""
        if self._running and self._start is not None:
            _sync_if_gpu()
            self._elapsed = time.perf_counter() - self._start
            self._running = False

    def seconds(self) -> float:
        """Seconds between the last start and stop (or until now while running)."""
        if self._start is None:
            return 0.0
        if self._running:
            self.stop()
        return self._elapsed

    def milliseconds(self) -> float:
        return self.seconds() * 1000.0

    @property
    def ms(self) -> float:
        """pycaffe's property: milliseconds of the last timed interval."""
        return self.milliseconds()
