"""``pycaffe-lite bvlc-layout DIR`` / ``caffe bvlc-layout DIR``: BVLC's build paths in a checkout run
pycaffe-lite's commands. The layout is idempotent, never overwrites a file it did not write (unless
--force, which keeps it as <name>.bvlc), and BVLC-style shell scripts (tests/integration/bvlc_scripts,
written for these tests) run unchanged: create_mnist.sh, train_lenet.sh, create_mnist_siamese.sh."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite.commands import bvlc_layout, caffe_cli
from pycaffe_lite.errors import CaffeError

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).with_name("bvlc_scripts")


def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "caffe"
    for folder in ("examples/mnist", "examples/siamese", "data/mnist"):
        (root / folder).mkdir(parents=True)
    (root / "Makefile").write_text("# a BVLC checkout stand-in\n")
    return root


def test_layout_is_idempotent_and_complete(tmp_path, capsys):
    root = checkout(tmp_path)
    done = bvlc_layout.make_layout(root)
    paths = {p.relative_to(root).as_posix() for p, _ in done}
    for must in ("build/tools/caffe", "build/tools/caffe.bin", "build/tools/convert_imageset",
                 "build/tools/compute_image_mean", "build/examples/mnist/convert_mnist_data.bin",
                 "build/examples/cifar10/convert_cifar_data.bin",
                 "build/examples/siamese/convert_mnist_siamese_data.bin"):
        assert must in paths
        assert os.access(root / must, os.X_OK)
    assert {what for _, what in done} == {"created"}
    before = {p: p.read_text() for p, _ in done}
    assert {what for _, what in bvlc_layout.make_layout(root)} == {"up to date"}
    assert all(p.read_text() == text for p, text in before.items())
    # the caffe front end takes the action too
    assert caffe_cli.run(["bvlc-layout", str(root)]) == 0
    assert "up to date" in capsys.readouterr().out


def test_shim_runs_our_caffe(tmp_path):
    root = checkout(tmp_path)
    bvlc_layout.make_layout(root)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no PYTHONPATH: the script finds the package
    r = subprocess.run([str(root / "build/tools/caffe"), "--version"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and "pycaffe-lite" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([str(root / "build/examples/mnist/convert_mnist_data.bin"), "-help"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0 and "backend" in r.stdout, r.stdout + r.stderr


def test_real_binaries_are_refused_unless_force(tmp_path):
    root = checkout(tmp_path)
    tools = root / "build/tools"
    tools.mkdir(parents=True)
    (tools / "caffe.bin").write_bytes(b"\x7fELF binary of BVLC")
    (tools / "caffe").symlink_to("caffe.bin")
    with pytest.raises(CaffeError, match=r"build/tools/caffe exists and is not a pycaffe-lite script.*2 such"):
        bvlc_layout.make_layout(root)
    assert not (tools / "convert_imageset").exists()  # nothing written before the refusal
    assert caffe_cli.run(["bvlc-layout", str(root)]) == 1
    done = dict(bvlc_layout.make_layout(root, force=True))
    assert done[tools / "caffe"] == "kept the old file as caffe.bvlc"
    assert (tools / "caffe.bin.bvlc").read_bytes() == b"\x7fELF binary of BVLC"
    assert os.readlink(tools / "caffe.bvlc") == "caffe.bin.bvlc"  # the link follows its target
    assert bvlc_layout.is_shim(tools / "caffe") and bvlc_layout.is_shim(tools / "caffe.bin")
    with pytest.raises(CaffeError, match="is not a folder"):
        bvlc_layout.make_layout(root / "missing")


def write_idx(folder: Path, prefix: str, n: int, rng: np.random.Generator) -> None:
    images = rng.integers(0, 256, (n, 8, 8), dtype=np.uint8)
    labels = np.arange(n, dtype=np.uint8) % 10
    (folder / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 8, 8) + images.tobytes())
    (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels.tobytes())


def bash(root: Path, script: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "OMP_NUM_THREADS": "1", "GLOG_logtostderr": "1"}
    r = subprocess.run(["sh", script], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


@pytest.mark.slow
def test_bvlc_style_mnist_scripts_run_unchanged(tmp_path):
    root = checkout(tmp_path)
    rng = np.random.default_rng(0)
    write_idx(root / "data/mnist", "train", 12, rng)
    write_idx(root / "data/mnist", "t10k", 4, rng)
    for name in ("create_mnist.sh", "train_lenet.sh", "lenet_solver.prototxt", "lenet_train_test.prototxt"):
        shutil.copy(SCRIPTS / name, root / "examples/mnist" / name)
    r = subprocess.run([sys.executable, "-m", "pycaffe_lite", "bvlc-layout", str(root)], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert r.returncode == 0, r.stderr
    out = bash(root, "./examples/mnist/create_mnist.sh")
    assert "Done." in out.stdout
    assert (root / "examples/mnist/mnist_train_lmdb/data.mdb").exists()
    out = bash(root, "./examples/mnist/train_lenet.sh")
    assert (root / "examples/mnist/lenet_iter_2.caffemodel").exists()
    assert (root / "examples/mnist/lenet_iter_2.solverstate").exists()
    assert "Iteration 2" in out.stderr or "Iteration 2" in out.stdout


@pytest.mark.slow
def test_bvlc_style_siamese_script_runs_unchanged(tmp_path):
    pytest.importorskip("plyvel", reason="LevelDB (BVLC's siamese default) needs plyvel")
    root = checkout(tmp_path)
    rng = np.random.default_rng(1)
    write_idx(root / "data/mnist", "train", 6, rng)
    write_idx(root / "data/mnist", "t10k", 4, rng)
    shutil.copy(SCRIPTS / "create_mnist_siamese.sh", root / "examples/siamese/create_mnist_siamese.sh")
    assert caffe_cli.run(["bvlc-layout", str(root)]) == 0
    bash(root, "./examples/siamese/create_mnist_siamese.sh")
    for split in ("train", "test"):
        assert (root / f"examples/siamese/mnist_siamese_{split}_leveldb/CURRENT").exists()
