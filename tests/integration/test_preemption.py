"""Preemption and shared prefixes: SIGTERM snapshots and ends a run (resumable), one training run
per snapshot_prefix (a lock file, stale locks of dead runs taken over), a prefix under a file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycaffe_lite.commands import cli
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.solvers.lr_policy import SolverConfigError
from pycaffe_lite.solvers.snapshot import PrefixLock, SnapshotLockError

REPO = Path(__file__).resolve().parents[2]

NET = """name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "h"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "out" loss_weight: 1
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
"""

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals and pids")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("net.prototxt").write_text(NET)
    return tmp_path


def write_solver(name="solver.prototxt", **fields):
    base = dict(net='"net.prototxt"', base_lr=1e-6, lr_policy='"fixed"', momentum=0.9, max_iter=10**7,
                display=0, snapshot_prefix='"run/t"', random_seed=3)
    base.update(fields)
    Path(name).write_text("\n".join(f"{k}: {v}" for k, v in base.items()) + "\n")
    return name


def _env():
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")


def start_training(solver, *extra):
    proc = subprocess.Popen([sys.executable, "-m", "pycaffe_lite", "train", "--solver", solver, "--allow-nonfinite",
                             *extra], stderr=subprocess.PIPE, text=True, env=_env())
    assert proc.stderr is not None
    for line in proc.stderr:
        if "Starting Optimization" in line:
            break
    time.sleep(0.3)
    return proc


def finish(proc, sig):
    try:
        proc.send_signal(sig)
        rest = proc.stderr.read()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    return rc, rest


@pytest.mark.slow
def test_sigterm_snapshots_then_ends_and_second_run_is_locked_out(workdir, capsys):
    solver = write_solver()
    proc = start_training(solver)
    # a second run with the same snapshot_prefix stops at once with a clear error
    rc2 = cli.main(["train", "--solver", write_solver("second.prototxt", max_iter=3), "--no-progress"])
    err = capsys.readouterr().err
    assert rc2 == 1 and "run/t.lock" in err and "in use by another training run" in err, err
    assert f"process {proc.pid}" in err and "Traceback" not in err
    rc, rest = finish(proc, signal.SIGTERM)
    assert rc == 0, rest
    assert "SIGTERM received: stopping after this iteration (a snapshot is written first)" in rest
    states = list(Path("run").glob("t_iter_*.solverstate"))
    assert len(states) == 1, rest
    it = int(states[0].stem.split("_iter_")[1])
    assert it > 0 and Path(f"run/t_iter_{it}.caffemodel").exists()
    assert not Path("run/t.lock").exists()  # released at the end of the run
    # resumable: two more iterations from the snapshot
    resume = write_solver("resume.prototxt", max_iter=it + 2)
    assert cli.main(["train", "--solver", resume, "--snapshot", str(states[0]), "--no-progress"]) == 0
    state = caffe_pb2.SolverState.FromString(Path(f"run/t_iter_{it + 2}.solverstate").read_bytes())
    assert state.iter == it + 2


@pytest.mark.slow
def test_sigterm_effect_exit_and_none(workdir):
    proc = start_training(write_solver(snapshot_prefix='"ex/t"'), "--sigterm_effect", "exit")
    rc, _ = finish(proc, signal.SIGTERM)
    assert rc == -signal.SIGTERM and not list(Path("ex").glob("*.solverstate"))
    proc = start_training(write_solver(snapshot_prefix='"no/t"'), "-sigterm_effect=none")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert proc.poll() is None  # ignored
    rc, rest = finish(proc, signal.SIGINT)
    assert rc == 0 and "SIGINT received" in rest


def test_stale_lock_of_a_dead_run_is_taken_over(workdir, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    Path("run").mkdir()
    Path("run/t.lock").write_text(f"{dead.pid} 1\n")
    assert cli.main(["train", "--solver", write_solver(max_iter=2), "--no-progress"]) == 0
    assert Path("run/t_iter_2.caffemodel").exists() and not Path("run/t.lock").exists()
    # a live owner (this test's parent process stands in for another run) is respected
    Path("run/t.lock").write_text(f"{os.getppid()}\n")
    with pytest.raises(SnapshotLockError, match="in use by another training run"):
        PrefixLock("run/t").acquire()
    # the same process may hold it for several solvers
    Path("run/t.lock").unlink()
    a = PrefixLock("run/t").acquire()
    b = PrefixLock("run/t").acquire()
    b.release()
    assert Path("run/t.lock").exists()
    a.release()
    assert not Path("run/t.lock").exists()


def test_snapshot_prefix_under_a_file_is_a_config_error(workdir):
    from pycaffe_lite.solvers.sgd_solvers import solver_class

    Path("blocker").write_text("I am a file")
    write_solver(snapshot_prefix='"blocker/sub/t"', max_iter=1)
    with pytest.raises(SolverConfigError, match="blocker is a file, not a folder"):
        solver_class("SGD")("solver.prototxt")
    rc = cli.main(["train", "--solver", "solver.prototxt", "--no-progress"])
    assert rc == 1


def test_train_weights_that_are_not_files(workdir, capsys):
    solver = write_solver(max_iter=1)
    os.mkfifo("pipe")
    for path, words in (("pipe", "a FIFO"), (".", "a folder"), ("/dev/zero", "a character device")):
        if not os.path.exists(path):
            continue
        assert cli.main(["train", "--solver", solver, "--weights", path, "--no-progress"]) == 1
        err = capsys.readouterr().err
        assert f"is {words}" in err and "not found" not in err and "Traceback" not in err


def test_write_pair_into_a_folder_that_is_a_file_is_a_snapshot_error(tmp_path):
    """(Its error handler used to raise NotADirectoryError itself while cleaning up.)"""
    from pycaffe_lite.solvers.snapshot import SnapshotError, write_pair

    (tmp_path / "snaps").write_text("a file where the folder should be")
    with pytest.raises(SnapshotError, match=r"snaps: cannot write the snapshot: .*earlier snapshots are kept"):
        write_pair(tmp_path / "snaps" / "m.caffemodel", b"m", tmp_path / "snaps" / "m.solverstate", b"s")


def test_lock_that_cannot_be_created_only_warns(workdir, caplog, monkeypatch):
    """A prefix in a folder that cannot be written: training that never snapshots still runs."""
    import logging

    real_open = os.open

    def refuse(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        lock = PrefixLock("run/t").acquire()
    assert not lock.held and "training without a snapshot lock" in caplog.text
    lock.release()
