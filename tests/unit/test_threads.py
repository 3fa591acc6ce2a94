"""BLAS threads: the user's variables win, else the cores (capped), never the load; the count can be set."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pycaffe_lite import threads


def test_default_threads_policy():
    assert threads.default_threads(env={"OMP_NUM_THREADS": "3"}, cores=2) is None
    assert threads.default_threads(env={"OPENBLAS_NUM_THREADS": "1"}, cores=2) is None
    assert threads.default_threads(env={"PYCAFFE_LITE_THREADS": "5"}, cores=2) == 5
    assert threads.default_threads(env={}, cores=2) == 2
    assert threads.default_threads(env={}, cores=64) == threads.MAX_THREADS


def test_a_busy_machine_gets_a_hint_not_another_count():
    """Results depend on the BLAS thread count, so the default does not follow the load (a seeded
    run must repeat); a busy machine gets a line naming PYCAFFE_LITE_THREADS instead."""
    assert threads.busy_hint(2, cores=2, load=0.1) is None
    hint = threads.busy_hint(2, cores=2, load=1.0)
    assert hint is not None and "PYCAFFE_LITE_THREADS=1" in hint and "load average 1.0" in hint
    assert "PYCAFFE_LITE_THREADS=1" in (threads.busy_hint(8, cores=8, load=30.0) or "")
    assert threads.busy_hint(4, cores=16, load=3.0) is None  # enough cores free for the threads


def test_the_default_is_the_same_whatever_the_load(monkeypatch):
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    idle = threads.default_threads(env={})
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (50.0, 50.0, 50.0))
    assert threads.default_threads(env={}) == idle == min(threads.MAX_THREADS, threads.available_cores())


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


def test_the_first_cpu_solver_logs_the_busy_hint(monkeypatch, caplog):
    """At import no log is set up, so the busy-machine line waits for the first CPU solver."""
    import logging

    import pycaffe_lite as caffe
    from pycaffe_lite.proto.protoio import parse_text
    from pycaffe_lite.schema import caffe_pb2

    monkeypatch.setattr(threads, "_hint", "BLAS uses 2 threads while other processes keep about 2 of the 2 cores busy")
    sp = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy="fixed", max_iter=1, display=0, snapshot_after_train=False)
    sp.net_param.CopyFrom(parse_text(
        'layer { name: "in" type: "Input" top: "x" top: "y" input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 1 } } }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p" inner_product_param { num_output: 1 } }\n'
        'layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }\n', caffe_pb2.NetParameter()))
    caffe.set_mode_cpu()
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        caffe.get_solver(sp, progress=False)
        caffe.get_solver(sp, progress=False)
    assert caplog.text.count("BLAS uses 2 threads") == 1
    assert threads.take_hint() is None
