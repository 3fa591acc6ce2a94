"""BLAS threads for the CPU path.

numpy's OpenBLAS starts one busy-waiting thread per core. ``configure()`` (run when pycaffe_lite
is imported) picks the thread count itself, unless the user chose one:

* ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` or ``MKL_NUM_THREADS`` set: left alone (BLAS reads
  them when it loads);
* else ``PYCAFFE_LITE_THREADS=N``: N threads;
* else the cores this process may run on (``sched_getaffinity``), at most 8.

The default never follows the machine's load: OpenBLAS's sums depend on its thread count (a
convolution's product at 1 and 2 threads differs in the last bits), so a count taken from the load
average made a seeded LeNet run end at 0.9878 or 0.9870 depending on what else ran when it started.
Busy-waiting threads do collapse when other work shares the cores (measured on 2 cores: 68 it/s
idle, 28 it/s with one core busy, 56 it/s with one BLAS thread), so when the 1-minute load average
says other processes keep cores busy, the first CPU solver logs one warning naming
``PYCAFFE_LITE_THREADS`` (:func:`take_hint`).

``set_blas_threads(n)`` changes the count at run time; ``blas_threads()`` reads it (None when the
BLAS library exposes no such call).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping

log = logging.getLogger("pycaffe_lite")

USER_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
MAX_THREADS = 8
_hint: str | None = None  # configure()'s line for a busy machine, until take_hint()
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads", "MKL_Set_Num_Threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads", "MKL_Get_Max_Threads")


def _blas_library() -> ctypes.CDLL | None:
    """The BLAS shared library numpy loaded (found in this process's memory map), or None."""
    import numpy  # noqa: F401  (loads the BLAS library)

    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "blas" in line.lower() or "libmkl" in line.lower()}
    except OSError:
        return None
    for path in sorted(paths):
        if not path.startswith("/"):
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _call(names: tuple[str, ...], *args: int) -> int | None:
    lib = _blas_library()
    if lib is None:
        return None
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            result = fn(*args)
            return int(result) if result is not None else 0
    return None


def blas_threads() -> int | None:
    """The BLAS library's current thread count (None when it cannot be queried)."""
    return _call(_GETTERS)


def set_blas_threads(n: int) -> bool:
    """Use ``n`` (>= 1) BLAS threads from now on; False when the library has no such call."""
    if int(n) < 1:
        raise ValueError(f"BLAS threads must be >= 1, got {n}")
    return _call(_SETTERS, int(n)) is not None


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads(env: Mapping[str, str] | None = None, cores: int | None = None) -> int | None:
    """The thread count ``configure`` would set (None: the user chose one through BLAS's variables)."""
    env = os.environ if env is None else env
    if any(env.get(v) for v in USER_VARIABLES):
        return None
    own = env.get("PYCAFFE_LITE_THREADS")
    if own:
        try:
            return max(1, int(own))
        except ValueError:
            log.warning("PYCAFFE_LITE_THREADS=%r is not an integer: ignored", own)
    cores = available_cores() if cores is None else cores
    return max(1, min(MAX_THREADS, cores))


def busy_hint(threads: int, cores: int, load: float) -> str | None:
    """The warning for ``threads`` BLAS threads on ``cores`` cores when the 1-minute ``load``
    average says other processes keep some of them busy (None when they do not)."""
    busy = int(load + 0.5)
    free = max(1, cores - busy)
    if busy < 1 or free >= threads:
        return None
    return (f"BLAS uses {threads} threads while other processes keep about {min(busy, cores)} of the {cores} cores "
            f"busy (load average {load:.1f}); its threads busy-wait, so PYCAFFE_LITE_THREADS={free} may run "
            f"faster. The count does not follow the load by itself: results depend on it, and a seeded run "
            f"repeats only with the same count")


def configure() -> int | None:
    """Set the BLAS thread count as described in the module docstring; returns it (None: untouched)."""
    n = default_threads()
    if n is None:
        return None
    try:
        set_blas_threads(n)
    except Exception as exc:  # never let thread tuning break the import
        log.debug("could not set BLAS threads: %s", exc)
        return None
    global _hint
    if not os.environ.get("PYCAFFE_LITE_THREADS"):
        try:
            _hint = busy_hint(n, available_cores(), os.getloadavg()[0])
        except (AttributeError, OSError):
            _hint = None
    return n


def take_hint() -> str | None:
    """``configure()``'s busy-machine line, the first time only (a CPU solver logs it: when the
    package is imported no log is set up yet)."""
    global _hint
    hint, _hint = _hint, None
    return hint
