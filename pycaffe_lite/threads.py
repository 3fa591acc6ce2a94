"""BLAS threads for the CPU path.

numpy's OpenBLAS starts one busy-waiting thread per core. When anything else runs on the machine
the threads oversubscribe the cores and the CPU path collapses (measured on 2 cores: 68 it/s idle,
28 it/s with one core busy; 56 it/s with one BLAS thread). ``configure()`` (run when pycaffe_lite is
imported) therefore picks the thread count itself, unless the user chose one:

* ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` or ``MKL_NUM_THREADS`` set: left alone (BLAS reads
  them when it loads);
* else ``PYCAFFE_LITE_THREADS=N``: N threads;
* else the cores this process may run on (``sched_getaffinity``), less the cores other processes
  keep busy (the 1-minute load average), at least 1 and at most 8.

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


def default_threads(env: Mapping[str, str] | None = None, cores: int | None = None,
                    load: float | None = None) -> int | None:
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
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
    busy = int(load + 0.5)
    return max(1, min(MAX_THREADS, cores - busy if busy < cores else 1))


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
    return n
