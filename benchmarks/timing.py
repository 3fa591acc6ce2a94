"""Timing shared by both sides of the benchmarks (no framework imports)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_ms(step: Callable[[], object], sync: Callable[[], None], reps: int, warmup: int) -> float:
    """Median wall time of ``step`` in ms over ``reps`` calls after ``warmup`` untimed ones; each
    timed call runs between two ``sync()`` (device synchronizations), so it is device time plus
    launch overhead, not queueing."""
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(max(1, reps)):
        start = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


SPIN_CYCLES = 4_000_000  # the spin kernel's length: ~2 ms at 2 GHz, longer than the host takes to enqueue a call


def device_median_ms(step: Callable[[], object], spin: Callable[[], None], record: Callable[[], Any],
                     elapsed_ms: Callable[[Any, Any], float], reps: int, warmup: int) -> float:
    """Median device time of ``step`` in ms over ``reps`` calls after ``warmup`` untimed ones. Each
    timed call is queued behind ``spin()`` (a kernel busy for :data:`SPIN_CYCLES` clock cycles,
    during which the host enqueues the call) between two events (``record()`` returns a recorded
    event; ``elapsed_ms(a, b)`` waits for ``b``), so the call's kernels run back to back: their
    device time, without the host's launch overhead."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(max(1, reps)):
        spin()
        start = record()
        step()
        times.append(elapsed_ms(start, record()))
    return statistics.median(times)
