"""Refuse allocations that cannot fit, before numpy or CUDA tries (and fails with a bare MemoryError,
or the kernel's OOM killer ends the process without a word, or after minutes of swapping).

The host limit is the smallest of: the machine's memory, the memory cgroup's limit (cgroup v2
``memory.max`` or v1 ``memory.limit_in_bytes`` of this process's cgroup, read from
``/proc/self/cgroup``, and of its parents: containers, Slurm and systemd set these) and
``RLIMIT_AS`` (``ulimit -v``). One allocation is checked against the limit (Blob.reshape, a
layer's set-up: :func:`check_fits`); a net's blobs together against what is still free under it
(:func:`check_total`: the cgroup's limit minus its anonymous memory, RLIMIT_AS minus this process's
address space). Checked where sizes are decided, never per forward. A ``MemoryError`` that
happens anyway (numpy temporaries) becomes an :class:`OutOfMemoryError` naming what was being
allocated and the limits (:func:`out_of_memory`). Tests lower the limits by monkeypatching
:func:`host_limit` / :func:`device_limit` / :func:`host_available`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import CaffeError
from .gpu import backend

_UNLIMITED = 1 << 60
PROC_CGROUP = Path("/proc/self/cgroup")  # (module attributes: tests point them at fake trees)
CGROUP_ROOT = Path("/sys/fs/cgroup")


class OutOfMemoryError(CaffeError, MemoryError):
    """A blob or buffer would need more memory than the machine, its memory limits or its GPU allow."""


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value < _UNLIMITED else None


def _cgroup_dirs() -> list[tuple[Path, int]]:
    """The memory cgroup folders of this process, innermost first, with the cgroup version."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return []
    root = CGROUP_ROOT
    found: list[tuple[Path, int]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "" and parts[0] == "0":  # v2 (in hybrid mode mounted at unified/)
            hybrid = (root / "unified").is_dir() and not (root / "cgroup.controllers").exists()
            version, base = 2, root / "unified" if hybrid else root
        elif "memory" in controllers.split(","):
            version, base = 1, root / "memory"
        else:
            continue
        d = base / rel.lstrip("/")
        while True:  # the cgroup, its parents, and (in a container's namespace) the mount itself
            if d.is_dir():
                found.append((d, version))
            if d == base or base not in d.parents:
                break
            d = d.parent
        if (base, version) not in found and base.is_dir():
            found.append((base, version))
    return found


def cgroup_limit() -> tuple[int, Path] | None:
    """The smallest memory limit of this process's cgroups (bytes, the file it came from), or None."""
    best: tuple[int, Path] | None = None
    for d, version in _cgroup_dirs():
        f = d / ("memory.max" if version == 2 else "memory.limit_in_bytes")
        value = _read_int(f)
        if value is not None and (best is None or value < best[0]):
            best = (value, f)
    return best


def _cgroup_anon(limit_file: Path) -> int:
    """Anonymous (not reclaimable) memory charged to the cgroup of ``limit_file``; 0 if unknown."""
    try:
        stat = dict(line.split()[:2] for line in (limit_file.parent / "memory.stat").read_text().splitlines())
    except (OSError, ValueError):
        return 0
    for key in ("anon", "total_rss", "rss"):
        if key in stat:
            try:
                return int(stat[key])
            except ValueError:
                return 0
    return 0


def address_space_limit() -> int | None:
    """``RLIMIT_AS`` (soft) in bytes, or None when unlimited."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft in (resource.RLIM_INFINITY, -1) or soft >= _UNLIMITED else int(soft)


def _vm_size() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def host_limits() -> list[tuple[int, str]]:
    """Every limit on this process's host memory, as (bytes, words for a message)."""
    out = [(host_memory_bytes(), "of memory this machine has")]
    cg = cgroup_limit()
    if cg is not None:
        out.append((cg[0], f"that this process's memory cgroup allows ({cg[1]})"))
    rl = address_space_limit()
    if rl is not None:
        out.append((rl, "of address space that RLIMIT_AS (ulimit -v) allows"))
    return out


def host_available() -> tuple[int, str]:
    """What is still free for new host allocations under the tightest limit: (bytes, words)."""
    best = (host_memory_bytes(), "of memory this machine has")
    cg = cgroup_limit()
    if cg is not None:
        free = max(0, cg[0] - _cgroup_anon(cg[1]))
        if free < best[0]:
            best = (free, f"still free under the memory cgroup limit of {human(cg[0])} ({cg[1]})")
    rl = address_space_limit()
    if rl is not None:
        free = max(0, rl - _vm_size())
        if free < best[0]:
            best = (free, f"of address space still free under RLIMIT_AS (ulimit -v) of {human(rl)}")
    return best


def _limit_words(limit: int) -> str:
    for value, words in host_limits():
        if value == limit:
            return words
    return "of memory this machine has"


def describe_limits() -> str:
    """The host limits in words, for messages about a failed allocation."""
    return "; ".join(f"{human(v)} {w}" for v, w in host_limits())


def out_of_memory(what: str, nbytes: int | None = None) -> OutOfMemoryError:
    """The project error for a ``MemoryError`` while allocating ``what``."""
    size = f" ({human(nbytes)})" if nbytes is not None else ""
    return OutOfMemoryError(f"out of memory while allocating {what}{size}; limits: {describe_limits()} "
                            "(a smaller batch_size, or more memory, is needed)")


def check_total(where: str, items: list[tuple[str, int]], what: str = "its blobs", device: bool = False,
                host_items: list[tuple[str, int]] | None = None) -> None:
    """OutOfMemoryError naming ``where`` and the largest ``items`` (name, bytes) when together
    they exceed what is still free on the host (see :func:`host_available`) or, with ``device``,
    on the GPU (:func:`device_available`). With ``device``, ``host_items`` (default: ``items``) are
    what the host holds (in GPU mode blobs live on the device; the host holds copies of some)."""
    host_have, host_words = host_available()
    checks: list[tuple[int, str, list[tuple[str, int]], Callable[[], int] | None]] = [
        (host_have, host_words, items if host_items is None or not device else host_items, None)]
    if device:  # short of memory: dropped nets are collected first (device_available's reclaim)
        checks.append((device_available(), "of GPU memory still free", items, lambda: device_available(reclaim=True)))
    for have, words, these, again in checks:
        need = sum(n for _, n in these)
        if need > have and again is not None:
            have = again()
        if need <= have:
            continue
        top = sorted(these, key=lambda item: -item[1])[:3]
        largest = ", ".join(f"'{name}' {human(n)}" for name, n in top)
        prefix = f"{where}: " if where else ""
        params = sum(n for name, n in these if name.rpartition(" param ")[2].isdigit())  # (Net's labels)
        advice = (f"the params alone need {human(params)}: make the largest layers smaller (num_output, kernel "
                  "size); a smaller batch_size does not shrink them") if params * 2 >= need else \
            "use a smaller batch_size"
        raise OutOfMemoryError(f"{prefix}{what} would need {human(need)}, more than the {human(have)} {words} "
                               f"(largest: {largest}); {advice}")


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
    """The most bytes one host allocation may ask for: the machine's memory, or less under a memory
    cgroup limit or RLIMIT_AS (see the module docstring)."""
    return min(v for v, _ in host_limits())


def device_available(reclaim: bool = False) -> int:
    """Device memory free for new allocations: the driver's free memory plus what our pool caches;
    with ``reclaim``, after :func:`backend.reclaim` (dropped nets are reference cycles that hold
    their memory until Python's cyclic collector runs)."""

    try:
        if reclaim:
            backend.reclaim()
        st = backend.state()
        cached = int(getattr(st.pool, "managed_bytes", 0)) - int(getattr(st.pool, "active_bytes", 0))
        return driver_free() + max(0, cached)
    except Exception:  # no device (yet), or a test's stand-in backend: nothing to tell
        return _UNLIMITED


def driver_free() -> int:
    """The driver's free memory on the current device (cuMemGetInfo)."""
    return int(backend.state().cuda.mem_get_info()[0])


def device_limit() -> int:
    """The most bytes one device allocation may ask for: the current GPU's total memory."""

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
    have = host_limit() if limit is None else limit
    checks = [(_limit_words(have) if limit is None else "of memory this machine has", have)]
    if device:
        checks.append(("of memory the GPU has", device_limit()))
    for name, have in checks:
        if need > have:
            prefix = f"{where}: " if where else ""
            raise OutOfMemoryError(f"{prefix}{what} would need {human(need)} ({int(count):,} values), more than "
                                   f"the {human(have)} {name}")


# -- a net's build: its params counted against what was free when the build began ---------------
class _Ledger:
    def __init__(self, where: str) -> None:
        self.where = where
        self.budget, self.words = host_available()
        self.items: list[tuple[str, int]] = []  # (what, bytes) of each param blob made so far


_LEDGERS: list[_Ledger] = []
_PARAM_OF: list[str] = []  # the layer whose param blob is being made (Layer.make_param_blob)


@contextmanager
def net_build(where: str) -> Iterator[None]:
    """While a net is built (``Net``'s set-up), the param blobs its layers make on the host are
    added up (:func:`note_blob`) and an OutOfMemoryError is raised *before* the param that takes
    the total past what was free at the start, so weights that cannot fit are refused before they
    are allocated and filled. (Params always take their memory; the other blobs are counted once
    the net is built, when what a forward-only net can share is known.) Nested builds count
    separately."""
    _LEDGERS.append(_Ledger(where))
    try:
        yield
    finally:
        _LEDGERS.pop()


@contextmanager
def param_of(layer: str) -> Iterator[None]:
    """Blobs made inside are the params of ``layer`` (counted and named by :func:`net_build`)."""
    _PARAM_OF.append(layer)
    try:
        yield
    finally:
        _PARAM_OF.pop()


def note_blob(shape: tuple[int, ...], nbytes: int) -> None:
    """Count a new host param blob of ``nbytes`` in the net being built (if any); OutOfMemoryError
    when the params so far exceed what was free, naming the largest, with the advice that fits:
    the layers' sizes (a smaller batch_size does not shrink params)."""
    if not _LEDGERS or not _PARAM_OF:
        return
    ledger = _LEDGERS[-1]
    ledger.items.append((f"layer '{_PARAM_OF[-1]}' param {shape}", int(nbytes)))
    need = sum(n for _, n in ledger.items)
    if need <= ledger.budget:
        return
    top = [item for item in sorted(ledger.items, key=lambda item: -item[1])[:3] if item[1] * 100 >= need]
    largest = ", ".join(f"{name} {human(n)}" for name, n in top)
    raise OutOfMemoryError(f"{ledger.where}: its params alone would need {human(need)} or more, more than the "
                           f"{human(ledger.budget)} {ledger.words} (largest: {largest}; refused before "
                           "allocating them): make the largest layers smaller (num_output, kernel size) or use "
                           "a machine with more memory; a smaller batch_size does not shrink params")
