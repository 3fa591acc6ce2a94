"""Refuse allocations that cannot fit, before numpy or CUDA tries (and fails with a bare MemoryError
or after minutes of swapping). Checked where sizes are decided (Blob.reshape, a layer's set-up),
never per forward. Tests lower the limits by monkeypatching :func:`host_limit` / :func:`device_limit`.
"""

from __future__ import annotations

import os

from .errors import CaffeError


class OutOfMemoryError(CaffeError):
    """A blob or buffer would need more memory than the machine (or its GPU) has."""


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


def host_limit() -> int:
    """The most bytes one host allocation may ask for: the machine's physical memory."""
    return host_memory_bytes()


def device_limit() -> int:
    """The most bytes one device allocation may ask for: the current GPU's total memory."""
    from .gpu import backend

    return backend.device_memory_bytes()


def human(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} PiB"


def check_fits(where: str, what: str, count: int, itemsize: int, limit: int | None = None,
               device: bool = False) -> None:
    """OutOfMemoryError naming ``where`` and ``what`` when ``count`` items of ``itemsize`` bytes
    exceed the host's memory (or ``limit``), or with ``device`` the GPU's."""
    need = int(count) * int(itemsize)
    checks = [("of memory this machine has", host_limit() if limit is None else limit)]
    if device:
        checks.append(("of memory the GPU has", device_limit()))
    for name, have in checks:
        if need > have:
            prefix = f"{where}: " if where else ""
            raise OutOfMemoryError(f"{prefix}{what} would need {human(need)} ({int(count):,} values), more than "
                                   f"the {human(have)} {name}")
