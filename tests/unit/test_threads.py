"""BLAS threads: the user's variables win, else the free cores (capped), and the count can be set."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pycaffe_lite import threads


def test_default_threads_policy():
    assert threads.default_threads(env={"OMP_NUM_THREADS": "3"}, cores=2, load=0) is None
    assert threads.default_threads(env={"OPENBLAS_NUM_THREADS": "1"}, cores=2, load=0) is None
    assert threads.default_threads(env={"PYCAFFE_LITE_THREADS": "5"}, cores=2, load=0) == 5
    assert threads.default_threads(env={}, cores=2, load=0.1) == 2
    assert threads.default_threads(env={}, cores=2, load=1.0) == 1   # one core busy elsewhere
    assert threads.default_threads(env={}, cores=2, load=7.0) == 1
    assert threads.default_threads(env={}, cores=64, load=0) == threads.MAX_THREADS


def test_set_and_read_blas_threads():
    before = threads.blas_threads()
    if before is None:
        pytest.skip("this BLAS library does not expose its thread count")
    try:
        assert threads.set_blas_threads(1) and threads.blas_threads() == 1
    finally:
        threads.set_blas_threads(before)
    with pytest.raises(ValueError):
        threads.set_blas_threads(0)


@pytest.mark.slow
def test_import_applies_pycaffe_lite_threads():
    code = "import pycaffe_lite, pycaffe_lite.threads as t; print(t.blas_threads())"
    env = {"PYCAFFE_LITE_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("1", "None")
