"""Kernel compilation is serialized across processes (gpu.backend._compile_lock): PyCUDA's compiler
cache writes cubin files in place, and a parallel reader could load a truncated image."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pycaffe_lite.gpu import backend

PROBE = """
import fcntl, sys
with open(sys.argv[1], "a") as f:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(3)
"""


def _probe() -> int:
    path = Path(tempfile.gettempdir()) / f"pycaffe-lite-nvcc-{os.getuid()}.lock"
    return subprocess.run([sys.executable, "-c", PROBE, str(path)], timeout=60).returncode


def test_another_process_cannot_compile_while_one_holds_the_lock():
    with backend._compile_lock():
        assert _probe() == 3
    assert _probe() == 0
