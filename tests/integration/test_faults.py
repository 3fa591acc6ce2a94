"""Faults lose nothing: exact resume (data positions in the snapshot), snapshot pairs complete or
absent, leftovers of killed runs cleaned, disk-full errors naming the file, modes per umask,
truncated LMDBs refused before any read, and solver values checked."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.data import db, mnist
from pycaffe_lite.errors import DataError
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.solvers import snapshot
from pycaffe_lite.solvers.lr_policy import SolverConfigError
from pycaffe_lite.solvers.sgd_solvers import get_solver

NET = """
name: "tiny"
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN }
  data_param { source: "%(db)s" batch_size: 7 backend: LMDB }
  transform_param { scale: 0.00390625 mirror: true crop_size: 24 } }
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TEST }
  data_param { source: "%(db)s" batch_size: 5 backend: LMDB }
  transform_param { scale: 0.00390625 crop_size: 24 } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 3 kernel_size: 5 stride: 2 weight_filler { type: "xavier" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.fixture(scope="module")
def lmdb_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("db")
    images, labels = mnist.load_split(mnist.SHIPPED_DIR, "test")
    mnist.write_lmdb(images[:45], labels[:45], d / "db")  # 45 records: batches of 7 wrap unevenly
    return d / "db"


def make_solver(tmp_path: Path, db_path: Path, max_iter: int, snap: int = 0):
    tmp_path.mkdir(parents=True, exist_ok=True)
    net = tmp_path / "net.prototxt"
    net.write_text(NET % {"db": db_path})
    sp = caffe_pb2.SolverParameter()
    sp.net = str(net)
    sp.base_lr, sp.momentum, sp.weight_decay, sp.lr_policy = 0.05, 0.9, 0.001, "fixed"
    sp.max_iter, sp.snapshot, sp.snapshot_prefix = max_iter, snap, str(tmp_path / "snap" / "t")
    sp.test_iter.append(3)
    sp.test_interval, sp.random_seed, sp.display = 4, 11, 0
    caffe.set_mode_cpu()
    return get_solver(sp, progress=False)


def close(solver):
    for net in (solver.net, *solver.test_nets):
        for layer in net.layers:
            if hasattr(layer, "close"):
                layer.close()


def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, lmdb_path):
    a = make_solver(tmp_path / "a", lmdb_path, 13)
    a.solve()
    want = {k: [b.data.copy() for b in v] for k, v in a.net.params.items()}
    close(a)
    b = make_solver(tmp_path / "b", lmdb_path, 6, snap=6)
    b.solve()
    state = caffe_pb2.SolverState.FromString((tmp_path / "b" / "snap" / "t_iter_6.solverstate").read_bytes())
    assert [(s.net, s.layer) for s in state.data_state] == [("train", "d"), ("test0", "d")]
    assert state.data_state[0].position == (6 * 7) % 45 and state.rng_state
    close(b)
    c = make_solver(tmp_path / "b", lmdb_path, 13)
    c.solve(str(tmp_path / "b" / "snap" / "t_iter_6.solverstate"))
    for name, blobs in want.items():
        for w, got in zip(blobs, c.net.params[name]):
            np.testing.assert_array_equal(got.data, w)  # bit for bit
    close(c)


def test_snapshot_files_follow_umask_and_pair_is_journaled(tmp_path, lmdb_path):
    old = os.umask(0o022)
    try:
        s = make_solver(tmp_path, lmdb_path, 1)
        s.step(1)
        model, state = s.snapshot()
        close(s)
    finally:
        os.umask(old)
    assert os.stat(model).st_mode & 0o777 == 0o644 and os.stat(state).st_mode & 0o777 == 0o644
    assert sorted(p.name for p in Path(model).parent.iterdir()) == ["t_iter_1.caffemodel", "t_iter_1.solverstate"]
    out = tmp_path / "lmdb_mode"
    old = os.umask(0o022)
    try:
        mnist.write_lmdb(np.zeros((2, 4, 4), np.uint8), np.zeros(2, np.uint8), out)
    finally:
        os.umask(old)
    assert os.stat(out).st_mode & 0o777 == 0o755


def test_leftovers_of_killed_runs_are_removed_at_start(tmp_path, lmdb_path):
    snap = tmp_path / "snap"
    snap.mkdir()
    # a temporary file of a dead process, one of a live process, and a pair killed between renames
    dead = snap / ".t_iter_5.solverstate.999999999.abcd1234.tmp"
    live = snap / f".t_iter_5.caffemodel.{os.getppid()}.abcd1234.tmp"
    for p in (dead, live):
        p.write_bytes(b"x" * 100)
    (snap / "t_iter_5.caffemodel").write_bytes(b"half a pair")  # renamed; its solverstate is still dead.tmp
    (snap / ".t_iter_5.pending").write_text(f"t_iter_5.caffemodel .t_iter_5.caffemodel.999999999.0.tmp\n"
                                            f"t_iter_5.solverstate {dead.name}\n")
    (snap / "t_iter_3.caffemodel").write_bytes(b"a")  # complete pair: kept
    (snap / "t_iter_3.solverstate").write_bytes(b"b")
    s = make_solver(tmp_path, lmdb_path, 1)
    close(s)
    assert sorted(p.name for p in snap.iterdir()) == sorted([live.name, "t_iter_3.caffemodel", "t_iter_3.solverstate"])


def test_kill_between_renames_leaves_no_half_pair(tmp_path, monkeypatch):
    calls = []
    real = os.replace

    def dying_replace(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise KeyboardInterrupt  # stands for SIGKILL: nothing after this line runs
        real(a, b)

    monkeypatch.setattr(snapshot.os, "replace", dying_replace)
    monkeypatch.setattr(snapshot.os, "getpid", lambda: 999999999)  # the writer is dead at clean-up
    with pytest.raises(KeyboardInterrupt):
        snapshot.write_pair(tmp_path / "p_iter_2.caffemodel", b"m", tmp_path / "p_iter_2.solverstate", b"s")
    monkeypatch.undo()
    assert (tmp_path / "p_iter_2.caffemodel").exists() and (tmp_path / ".p_iter_2.pending").exists()
    snapshot.clean_leftovers(tmp_path / "p")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EACCES])
def test_disk_full_names_file_and_keeps_previous_snapshot(tmp_path, lmdb_path, monkeypatch, err):
    s = make_solver(tmp_path, lmdb_path, 3)
    s.step(1)
    s.snapshot()
    s.step(1)
    real = snapshot.write_temp

    def full(final, data):
        if final.suffix == ".solverstate":
            raise OSError(err, os.strerror(err))
        return real(final, data)

    monkeypatch.setattr(snapshot, "write_temp", full)
    with pytest.raises(snapshot.SnapshotError, match=r"t_iter_2.solverstate: cannot write the snapshot: "
                                                      + os.strerror(err)):
        s.snapshot()
    close(s)
    names = sorted(p.name for p in (tmp_path / "snap").iterdir())
    assert names == ["t_iter_1.caffemodel", "t_iter_1.solverstate"]


def test_truncated_lmdb_is_an_error_before_any_read(tmp_path):
    images = np.random.default_rng(0).integers(0, 255, (400, 28, 28), dtype=np.uint8)
    mnist.write_lmdb(images, np.zeros(400, np.uint8), tmp_path / "db")
    data = tmp_path / "db" / "data.mdb"
    with open(data, "r+b") as fh:
        fh.truncate(8192)
    with pytest.raises(DataError, match=r"db: truncated LMDB database: data.mdb holds 8192 bytes"):
        db.open_cursor(tmp_path / "db")


@pytest.mark.parametrize("field, value, message", [
    ("base_lr", -0.01, "base_lr: must be >= 0"),
    ("base_lr", float("nan"), "base_lr: must be a finite number"),
    ("base_lr", 1e9, "base_lr: 1e\\+09 is far too large"),
    ("momentum", -0.5, "momentum: must be in \\[0, 1\\)"),
    ("momentum", 1.0, "momentum: must be in \\[0, 1\\)"),
    ("weight_decay", -1.0, "weight_decay: must be >= 0"),
    ("gamma", float("inf"), "gamma: must be a finite number"),
    ("lr_policy", "linear", "lr_policy: unknown policy 'linear'"),
    ("max_iter", -3, "max_iter: must be >= 0"),
])
def test_bad_solver_values(tmp_path, lmdb_path, field, value, message):
    net = tmp_path / "net.prototxt"
    net.write_text(NET % {"db": lmdb_path})
    fields = {"net": f'"{net}"', "base_lr": "0.01", "lr_policy": '"fixed"'}
    fields[field] = f'"{value}"' if isinstance(value, str) else repr(value)
    text = "".join(f"{k}: {v}\n" for k, v in fields.items())
    path = tmp_path / "solver.prototxt"
    path.write_text(text)
    with pytest.raises(SolverConfigError, match=f"solver.prototxt: {message}"):
        get_solver(str(path), progress=False)


def test_nonfinite_loss_stops_naming_iteration_and_layer(tmp_path, lmdb_path):
    from pycaffe_lite.solvers.checks import NonFiniteLossError

    s = make_solver(tmp_path, lmdb_path, 5)
    s.net.params["conv"][0].data[0, 0, 0, 0] = np.inf
    with pytest.raises(NonFiniteLossError, match="iteration 0: the loss is nan; first non-finite output: layer 'conv'"):
        s.step(2)
    s.stop_on_nonfinite_loss = False  # BVLC: carry on
    s.step(2)
    assert s.iter == 2  # (the failing iteration was not counted)
    close(s)


def test_layer_values_checked_before_allocation(tmp_path):
    from pycaffe_lite.errors import CaffeError

    def net(layer):
        p = tmp_path / "n.prototxt"
        p.write_text('input: "data" input_shape { dim: 2 dim: 3 dim: 8 dim: 8 }\n' + layer)
        return caffe.Net(str(p), caffe.TEST)

    with pytest.raises(CaffeError, match="layer 'ip' .*num_output must be >= 1, got 0"):
        net('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 0 } }')
    with pytest.raises(CaffeError, match=r"layer 'ip' \(InnerProduct\): the 4000000000x192 weights would need"):
        net('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
            'inner_product_param { num_output: 4000000000 } }')
    with pytest.raises(CaffeError, match=r"layer 'pool' \(Pooling\): kernel 2x2, stride 2000000000x.*PiB .* more than the"):
        net('layer { name: "pool" type: "Pooling" bottom: "data" top: "p" '
            'pooling_param { kernel_size: 2 stride: 2000000000 pool: MAX } }')
    with pytest.raises(CaffeError, match=r"layer 'ip' \(InnerProduct\): unknown filler type 'gaussiann'"):
        net('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
            'inner_product_param { num_output: 3 weight_filler { type: "gaussiann" } } }')
    n = net('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
            'inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }')
    assert n.params["ip"][0].data.dtype == np.float32 and 0.05 < n.params["ip"][0].data.std() < 0.2


def test_atomic_write_removes_temporaries_of_dead_writers(tmp_path):
    """A killed writer's temporary (named with its pid) goes at the next write of that file; a
    live writer's (this process, or pid 1) stays."""
    import subprocess

    from pycaffe_lite.proto import protoio

    dead = subprocess.Popen(["true"])  # its pid names no live process once it has been waited for
    dead.wait()
    target = tmp_path / "w.caffemodel"
    stale = tmp_path / f".w.caffemodel.{dead.pid}.abc123.tmp"
    alive = tmp_path / ".w.caffemodel.1.abc123.tmp"
    other = tmp_path / f".x.caffemodel.{dead.pid}.abc123.tmp"
    for f in (stale, alive, other):
        f.write_bytes(b"partial")
    old = os.umask(0o027)
    try:
        protoio.atomic_write_bytes(target, b"data")
    finally:
        os.umask(old)
    assert target.read_bytes() == b"data"
    assert target.stat().st_mode & 0o777 == 0o640  # created under the umask, as open() would
    assert not stale.exists() and alive.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, alive.name, other.name])
