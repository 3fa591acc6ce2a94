"""``pycaffe-lite train --gpu 0,1`` end to end on the CPU: a test shim (cpu_ranks/sitecustomize.py)
runs the ranks in CPU mode and averages gradients through the rendezvous instead of NCCL. Checks
the launcher, the rendezvous, data sharding, root-only snapshots, Ctrl-C and a killed rank."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite.parallel import nccl
from pycaffe_lite.schema import caffe_pb2

pytest.importorskip("lmdb")
pytestmark = pytest.mark.skipif(not nccl.available(), reason="the launcher needs NCCL to be installed")

SHIM = Path(__file__).resolve().parent / "cpu_ranks"
B = 4

NET = """name: "tiny"
layer { name: "data" type: "Data" top: "data" top: "label" transform_param { scale: 0.00390625 }
        data_param { source: "%(source)s" batch_size: %(batch)d backend: LMDB } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 8 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def env() -> dict:
    return {**os.environ, "PYCAFFE_LITE_TEST_CPU_RANKS": "1",
            "PYTHONPATH": os.pathsep.join([str(SHIM), os.environ.get("PYTHONPATH", "")])}


def make_solver(folder: Path, name: str, batch: int, max_iter: int) -> Path:
    from pycaffe_lite.data.db import LMDBWriter

    source = folder / "lmdb"
    if not source.exists():
        rng = np.random.default_rng(5)
        with LMDBWriter(source) as w:
            for i in range(48):
                img = rng.integers(0, 256, size=(1, 2, 3), dtype=np.uint8)
                w.put(b"%08d" % i, caffe_pb2.Datum(channels=1, height=2, width=3, data=img.tobytes(),
                                                   label=i % 3).SerializeToString())
    net = folder / f"{name}_net.prototxt"
    net.write_text(NET % {"source": source, "batch": batch})
    solver = folder / f"{name}_solver.prototxt"
    solver.write_text(f'net: "{net}" base_lr: 0.1 momentum: 0.9 weight_decay: 0.001 lr_policy: "fixed" '
                      f'max_iter: {max_iter} display: 10 snapshot_prefix: "{folder / name}" random_seed: 3\n')
    return solver


def cmd(solver: Path, gpus: str) -> list[str]:
    return [sys.executable, "-m", "pycaffe_lite", "train", "--solver", str(solver), "--gpu", gpus, "--no-progress"]


def weights(path: Path) -> list[np.ndarray]:
    net = caffe_pb2.NetParameter()
    net.ParseFromString(path.read_bytes())
    return [np.array(b.data) for layer in net.layer for b in layer.blobs]


def test_two_cpu_ranks_at_b_equal_one_process_at_2b(tmp_path):
    one = subprocess.run(cmd(make_solver(tmp_path, "one", 2 * B, 12), "0"), env=env(), capture_output=True,
                         text=True, timeout=120)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run(cmd(make_solver(tmp_path, "two", B, 12), "0,1"), env=env(), capture_output=True,
                         text=True, timeout=120)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "rank 1: GPU 1, pid" in two.stderr
    for a, b in zip(weights(tmp_path / "one_iter_12.caffemodel"), weights(tmp_path / "two_iter_12.caffemodel")):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert sorted(p.name for p in tmp_path.glob("two_*.caffemodel")) == ["two_iter_12.caffemodel"]


class _Run:
    def __init__(self, solver: Path) -> None:
        self.proc = subprocess.Popen(cmd(solver, "0,1"), env=env(), stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            for line in list(self.lines):
                if m := re.search(pattern, line):
                    return m
            time.sleep(0.02)
        self.proc.kill()
        raise AssertionError(f"no {pattern!r} in:\n{''.join(self.lines)[-3000:]}")


def test_ctrl_c_stops_both_ranks_with_one_snapshot(tmp_path):
    run = _Run(make_solver(tmp_path, "long", B, 10**7))
    run.wait_for(r"Iteration 20\b")
    run.proc.send_signal(signal.SIGINT)
    assert run.proc.wait(60) == 0, "".join(run.lines)[-3000:]
    models = list(tmp_path.glob("long_iter_*.caffemodel"))
    assert len(models) == 1 and len(list(tmp_path.glob("long_iter_*.solverstate"))) == 1
    assert int(re.search(r"_iter_(\d+)", models[0].name).group(1)) % 10 == 0


def test_sigterm_snapshots_once_and_stops_both_ranks(tmp_path):
    """Preemption: SIGTERM to the launcher reaches every rank; they agree on one iteration, rank 0
    writes the one snapshot, all exit 0, and the snapshot resumes."""
    run = _Run(make_solver(tmp_path, "term", B, 10**7))
    run.wait_for(r"Iteration 20\b")
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(60) == 0, "".join(run.lines)[-3000:]
    states = list(tmp_path.glob("term_iter_*.solverstate"))
    assert len(states) == 1 and len(list(tmp_path.glob("term_iter_*.caffemodel"))) == 1
    assert "SIGTERM received" in "".join(run.lines)
    it = int(re.search(r"_iter_(\d+)", states[0].name).group(1))
    resume = make_solver(tmp_path, "term", B, it + 2)
    done = subprocess.run([*cmd(resume, "0,1"), "--snapshot", str(states[0])], env=env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / f"term_iter_{it + 2}.caffemodel").exists()


def test_killed_rank_stops_the_run_naming_it(tmp_path):
    run = _Run(make_solver(tmp_path, "killed", B, 10**7))
    pid = int(run.wait_for(r"rank 1: GPU 1, pid (\d+)").group(1))
    run.wait_for(r"Iteration 20\b")
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    assert run.proc.wait(60) == 1
    assert time.monotonic() - start < 20
    text = "".join(run.lines)
    assert "rank 1 (GPU 1) was killed by SIGKILL" in text and "rank 0 exited with status 3" in text, text[-3000:]


CAFFE_SHIM = '''import sys, types
import pycaffe_lite
caffe = types.ModuleType("caffe")
caffe.__dict__.update(pycaffe_lite.__dict__)
caffe.set_mode_gpu = pycaffe_lite.set_mode_cpu


class NCCL:
    """No communication: the script's calls only (each rank trains on its own share)."""

    new_uid = staticmethod(pycaffe_lite.NCCL.new_uid)

    def __init__(self, solver, uid):
        assert isinstance(uid, bytes) and len(uid) == 128 and pycaffe_lite.solver_count() == 2

    def bcast(self):
        pass

    def on_start(self):
        pass

    def on_gradients_ready(self):
        pass

    def __call__(self, layer):
        pass


caffe.NCCL = NCCL
sys.modules["caffe"] = caffe
'''


@pytest.mark.parametrize("timing", [False, True])
def test_bvlc_style_script_calls_on_cpu(tmp_path, timing):
    """The pycaffe calls of BVLC's python/train.py (our copy), with NCCL stubbed and GPU mode
    mapped to CPU: hooks, callbacks, Timers, solver count/rank, root-only snapshots."""
    (tmp_path / "caffe.py").write_text(CAFFE_SHIM)
    solver = make_solver(tmp_path, "api", B, 20)
    with open(solver, "a") as f:
        f.write("snapshot: 20\n")
    script = Path(__file__).resolve().parent / "bvlc_style_train.py"
    done = subprocess.run([sys.executable, str(script), "--solver", str(solver), "--gpus", "0", "1"]
                          + (["--timing"] if timing else []), capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stderr[-3000:]
    assert [p.name for p in tmp_path.glob("api_iter_*.caffemodel")] == ["api_iter_20.caffemodel"]
    if timing:
        assert "backward 1 ip1:" in done.stderr and "all-reduce:" in done.stderr
