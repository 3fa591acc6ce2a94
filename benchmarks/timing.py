"""Timing shared by both sides of the benchmarks (no framework imports)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


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
