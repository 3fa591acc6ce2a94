"""Multi-GPU training on two GPUs (marked ``multigpu``: skipped without two GPUs, PyCUDA and NCCL).

All-reduce correctness; a 2-GPU run at batch B per GPU equals a 1-GPU run at batch 2B over the
same samples (layer-wise buckets with CUDA graphs, one all-reduce, graphs off); snapshot and
resume; Ctrl-C writes one snapshot; a killed rank stops the run with an error naming it; our copy
of BVLC's python/train.py runs with ``caffe`` resolving to pycaffe_lite. Every wait is bounded.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
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

from pycaffe_lite.schema import caffe_pb2

HERE = Path(__file__).resolve().parent
B = 8  # batch per GPU


@functools.cache
def unavailable() -> str | None:
    from pycaffe_lite.parallel import nccl

    if not nccl.available():
        return "NCCL not found (pip install nvidia-nccl-cu13)"
    try:
        import pycuda.driver as cuda

        cuda.init()
        count = cuda.Device.count()
    except Exception as exc:  # no PyCUDA or no driver
        return f"no CUDA ({exc})"
    return None if count >= 2 else f"needs 2 GPUs, found {count}"


pytestmark = [pytest.mark.multigpu, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]


# -- all-reduce ----------------------------------------------------------------------------------
def _collective_rank(uid, rank, out):
    try:
        from pycaffe_lite import common
        from pycaffe_lite.gpu import backend
        from pycaffe_lite.parallel import nccl

        common.set_device(rank)
        common.set_mode_gpu()
        comm = nccl.Communicator(uid, 2, rank)
        stream = backend.stream().handle
        x = (np.arange(1000, dtype=np.float32) + 1) * (rank + 1)
        y = np.full(7, 10.0 * (rank + 1))
        px, py = backend.alloc(x.nbytes), backend.alloc(y.nbytes)
        backend.memcpy_htod(int(px), x)
        backend.memcpy_htod(int(py), y)
        with comm.group():
            comm.all_reduce(int(px), x.size, np.float32, stream, nccl.SUM)
            comm.all_reduce(int(py), y.size, np.float64, stream, nccl.AVG)
        gx, gy = np.empty_like(x), np.empty_like(y)
        backend.memcpy_dtoh(gx, int(px))
        backend.memcpy_dtoh(gy, int(py))
        z = np.full(5, float(rank + 3), np.float32)
        pz = backend.alloc(z.nbytes)
        backend.memcpy_htod(int(pz), z)
        comm.broadcast(int(pz), z.size, np.float32, stream, root=1)
        gz = np.empty_like(z)
        backend.memcpy_dtoh(gz, int(pz))
        comm.destroy()
        out.put((rank, gx, gy, gz))
    except BaseException as exc:  # reported to the test, which must not hang
        out.put((rank, repr(exc), None, None))


def test_all_reduce_and_broadcast():
    from pycaffe_lite.parallel import nccl

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    uid = nccl.new_unique_id()
    procs = [ctx.Process(target=_collective_rank, args=(uid, r, out), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        results = sorted((out.get(timeout=120) for _ in procs), key=lambda r: r[0])
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    for rank, gx, gy, gz in results:
        assert not isinstance(gx, str), f"rank {rank}: {gx}"
        np.testing.assert_array_equal(gx, (np.arange(1000, dtype=np.float32) + 1) * 3)
        np.testing.assert_allclose(gy, 15.0)
        np.testing.assert_array_equal(gz, 4.0)


# -- training runs -------------------------------------------------------------------------------
NET = """name: "tiny"
layer { name: "data" type: "Data" top: "data" top: "label" transform_param { scale: 0.00390625 }
        data_param { source: "%(source)s" batch_size: %(batch)d backend: LMDB } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 32 weight_filler { type: "xavier" } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

SOLVER = """net: "%(net)s" base_lr: 0.05 momentum: 0.9 weight_decay: 0.0005 lr_policy: "step" gamma: 0.5
stepsize: 10 max_iter: %(max_iter)d display: 10 snapshot_prefix: "%(prefix)s" random_seed: 1
layer_wise_reduce: %(layer_wise)s %(extra)s
"""


def make_source(folder: Path, records: int) -> Path:
    from pycaffe_lite.data.db import LMDBWriter

    path = folder / f"lmdb{records}"
    if path.exists():
        return path
    rng = np.random.default_rng(11)
    with LMDBWriter(path) as w:
        for i in range(records):
            img = rng.integers(0, 256, size=(1, 8, 8), dtype=np.uint8)
            d = caffe_pb2.Datum(channels=1, height=8, width=8, data=img.tobytes(), label=int(i % 10))
            w.put(b"%08d" % i, d.SerializeToString())
    return path


def make_solver(folder: Path, name: str, batch: int, max_iter: int = 20, layer_wise: bool = True,
                records: int = 160, extra: str = "") -> Path:
    source = make_source(folder, records)
    net = folder / f"{name}_net.prototxt"
    net.write_text(NET % {"source": source, "batch": batch})
    solver = folder / f"{name}_solver.prototxt"
    solver.write_text(SOLVER % {"net": net, "max_iter": max_iter, "prefix": folder / name,
                                "layer_wise": str(layer_wise).lower(), "extra": extra})
    return solver


def cli(solver: Path, *flags: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pycaffe_lite", "train", "--solver", str(solver), "--no-progress", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def weights(path: Path) -> dict[str, list[np.ndarray]]:
    net = caffe_pb2.NetParameter()
    net.ParseFromString(path.read_bytes())
    return {layer.name: [np.array(b.data, np.float64) for b in layer.blobs] for layer in net.layer if layer.blobs}


def assert_same_weights(a: Path, b: Path, rtol=2e-4, atol=2e-6) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and wa
    for name in wa:
        for x, y in zip(wa[name], wb[name]):
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=name)


@pytest.fixture(scope="module")
def one_gpu_reference(tmp_path_factory):
    """A 1-GPU run at batch 2B, 20 iterations."""
    folder = tmp_path_factory.mktemp("ref")
    cli(make_solver(folder, "one", 2 * B), "--gpu", "0")
    return folder / "one_iter_20.caffemodel"


@pytest.mark.parametrize("layer_wise, env", [
    (True, {"PYCAFFE_LITE_BUCKET_MB": "0.001"}),  # several buckets, reduced during backward, in CUDA graphs
    (False, {}),  # one all-reduce before the update
    (True, {"PYCAFFE_LITE_CUDA_GRAPHS": "0"}),  # no graphs
], ids=["layer-wise", "one-reduce", "no-graphs"])
def test_two_gpus_at_b_equal_one_gpu_at_2b(tmp_path, one_gpu_reference, layer_wise, env):
    solver = make_solver(tmp_path, "two", B, layer_wise=layer_wise)
    done = cli(solver, "--gpu", "0,1", env=env)
    assert_same_weights(tmp_path / "two_iter_20.caffemodel", one_gpu_reference)
    assert "CUDA graph capture not possible" not in done.stderr  # the iteration, reductions included, replays
    assert sorted(p.name for p in tmp_path.glob("*.caffemodel")) == ["two_iter_20.caffemodel"]  # rank 0 only
    if layer_wise and "PYCAFFE_LITE_BUCKET_MB" in env:
        assert re.search(r"2 ranks, [2-9] gradient buckets reduced during backward", done.stderr), done.stderr[-3000:]


@pytest.mark.parametrize("type_name", ["FLOAT16", "BFLOAT16"])
def test_half_gradients_reduce_in_half(tmp_path, type_name):
    """An fp16/bf16 net on 2 GPUs at batch B (gradients all-reduced in the half type, fp32 masters)
    ends near the same net on 1 GPU at 2B: the snapshots' float32 masters agree within the half
    format's rounding of 20 iterations of gradients."""
    fields = (f"default_forward_type: {type_name} default_backward_type: {type_name} "
              "default_forward_math: FLOAT default_backward_math: FLOAT")
    for name, batch, gpus in (("one", 2 * B, "0"), ("two", B, "0,1")):
        solver = make_solver(tmp_path, name, batch)
        net = Path(str(solver).replace("_solver", "_net"))
        net.write_text(net.read_text().replace('name: "tiny"', f'name: "tiny" {fields}'))
        cli(solver, "--gpu", gpus)
    assert_same_weights(tmp_path / "two_iter_20.caffemodel", tmp_path / "one_iter_20.caffemodel",
                        rtol=3e-2, atol=3e-3 if type_name == "FLOAT16" else 2e-2)


def test_snapshot_and_resume(tmp_path):
    """With 2B records each rank reads the same batch every iteration, so a resumed run must match
    an uninterrupted one (the data position does not depend on the iteration)."""
    straight = make_solver(tmp_path, "straight", B, max_iter=20, records=2 * B)
    cli(straight, "--gpu", "0,1")
    half = make_solver(tmp_path, "half", B, max_iter=10, records=2 * B)
    cli(half, "--gpu", "0,1")
    resumed = make_solver(tmp_path, "half", B, max_iter=20, records=2 * B)
    cli(resumed, "--gpu", "0,1", "--snapshot", str(tmp_path / "half_iter_10.solverstate"))
    assert_same_weights(tmp_path / "half_iter_20.caffemodel", tmp_path / "straight_iter_20.caffemodel", rtol=1e-5,
                        atol=1e-7)


class _Run:
    """A long 2-GPU run whose stderr is collected by a thread."""

    def __init__(self, solver: Path) -> None:
        cmd = [sys.executable, "-m", "pycaffe_lite", "train", "--solver", str(solver), "--no-progress", "--gpu", "0,1"]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.proc.kill()
        raise AssertionError(f"no line matching {pattern!r}:\n{''.join(self.lines)[-4000:]}")

    def finish(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"still running after {timeout} s:\n{''.join(self.lines)[-4000:]}") from None


def test_ctrl_c_stops_every_rank_and_writes_one_snapshot(tmp_path):
    run = _Run(make_solver(tmp_path, "long", B, max_iter=10**6))
    run.wait_for(r"Iteration 20\b")
    run.proc.send_signal(signal.SIGINT)
    assert run.finish(60) == 0, "".join(run.lines)[-4000:]
    models = sorted(tmp_path.glob("long_iter_*.caffemodel"))
    states = sorted(tmp_path.glob("long_iter_*.solverstate"))
    assert len(models) == 1 and len(states) == 1, models
    assert int(re.search(r"_iter_(\d+)", models[0].name).group(1)) % 10 == 0  # ranks agree every 10 iterations


def test_killed_rank_stops_the_others_with_an_error_naming_it(tmp_path):
    run = _Run(make_solver(tmp_path, "killed", B, max_iter=10**6))
    pid = int(run.wait_for(r"rank 1: GPU 1, pid (\d+)").group(1))
    run.wait_for(r"Iteration 20\b")
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    assert run.finish(60) == 1
    assert time.monotonic() - start < 30
    text = "".join(run.lines)
    assert "rank 1 (GPU 1) was killed by SIGKILL" in text, text[-4000:]


@pytest.mark.parametrize("timing", [False, True])
def test_bvlc_style_train_script(tmp_path, one_gpu_reference, timing):
    """Our copy of BVLC's python/train.py logic, with ``caffe`` resolving to pycaffe_lite; set
    BVLC_TRAIN_PY to the original script to run that instead."""
    (tmp_path / "caffe.py").write_text("import sys\nimport pycaffe_lite\nsys.modules[__name__] = pycaffe_lite\n")
    solver = make_solver(tmp_path, "api", B, extra="snapshot: 20")
    script = os.environ.get("BVLC_TRAIN_PY") or str(HERE / "bvlc_style_train.py")
    cmd = [sys.executable, script, "--solver", str(solver), "--gpus", "0", "1"] + (["--timing"] if timing else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert_same_weights(tmp_path / "api_iter_20.caffemodel", one_gpu_reference)
