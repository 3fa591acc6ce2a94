"""Refuse allocations that cannot fit, before numpy tries (and fails with a bare MemoryError)."""

from __future__ import annotations

import os

from .errors import CaffeError


class OutOfMemoryError(CaffeError):
    """A blob or buffer would need more memory than the machine has."""


def host_memory_bytes() -> int:
    """Physical memory of this machine (MemTotal), or 2**62 when unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def human(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} PiB"


def check_fits(where: str, what: str, count: int, itemsize: int, limit: int | None = None) -> None:
    """OutOfMemoryError naming ``where`` when ``count`` items of ``itemsize`` bytes exceed the
    host's memory (or ``limit``)."""
    limit = host_memory_bytes() if limit is None else limit
    need = int(count) * int(itemsize)
    if need > limit:
        raise OutOfMemoryError(f"{where}: {what} would need {human(need)} ({count:,} values), more than the "
                               f"{human(limit)} of memory this machine has")
