"""Compiling one kernel source is serialized across processes (gpu.backend._compile_lock): PyCUDA's compiler
cache writes cubin files in place, and a parallel reader could load a truncated image."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pycaffe_lite.gpu import backend

PROBE = """
import fcntl, sys
with open(sys.argv[1], "a") as f:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(3)
"""


def _probe(key: str) -> int:
    path = backend.compile_lock_path(key)
    return subprocess.run([sys.executable, "-c", PROBE, str(path)], timeout=60).returncode


@pytest.mark.slow
def test_another_process_cannot_compile_the_same_source_while_one_holds_the_lock():
    with backend._compile_lock("source a"):
        assert _probe("source a") == 3
        assert _probe("source b") == 0  # other sources compile in parallel
    assert _probe("source a") == 0
