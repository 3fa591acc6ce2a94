"""The pycaffe-lite command line: train/test/time/device_query, resume, signals, user errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite import commands
from pycaffe_lite.commands import cli
from pycaffe_lite.schema import caffe_pb2

REPO = Path(__file__).resolve().parents[2]

NET = """name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "h"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 }
                        bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }
layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "out" loss_weight: 1
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("net.prototxt").write_text(NET)
    return tmp_path


def write_solver(name="solver.prototxt", **fields):
    base = dict(net='"net.prototxt"', base_lr=0.01, lr_policy='"fixed"', momentum=0.9, max_iter=4,
                display=1, snapshot_prefix='"snap/tiny"', random_seed=3, test_iter=2, test_interval=2)
    base.update(fields)
    Path(name).write_text("\n".join(f"{k}: {v}" for k, v in base.items() if v is not None) + "\n")
    return name


def read_model(path) -> caffe_pb2.NetParameter:
    m = caffe_pb2.NetParameter()
    m.ParseFromString(Path(path).read_bytes())
    return m


def blobs_of(model):
    return {lp.name: [np.array(b.data) for b in lp.blobs] for lp in model.layer if lp.blobs}


def test_commands_are_discovered():
    names = [m.NAME for m in commands.discover()]
    for n in ("device_query", "test", "time", "train"):
        assert n in names
    for m in commands.discover():
        assert isinstance(m.HELP, str) and callable(m.add_arguments) and callable(m.run)


def test_train_writes_snapshots_and_logs(workdir, capsys):
    rc = cli.main(["train", "--solver", write_solver(), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert Path("snap/tiny_iter_4.caffemodel").exists() and Path("snap/tiny_iter_4.solverstate").exists()
    assert "Iteration 2, Testing net (#0)" in err and "Optimization Done." in err
    assert "Iteration 1, lr = 0.01" in err and "Train net output #0: out = " in err


def test_train_resume_equals_straight_run(workdir, capsys):
    assert cli.main(["train", "-solver", write_solver(), "--no-progress"]) == 0
    straight = blobs_of(read_model("snap/tiny_iter_4.caffemodel"))
    s2 = write_solver("half.prototxt", max_iter=2, snapshot_prefix='"half/t"')
    assert cli.main(["train", "--solver", s2, "--no-progress"]) == 0
    s3 = write_solver("rest.prototxt", snapshot_prefix='"half/t"')
    assert cli.main(["train", "--solver=" + s3, "-snapshot=half/t_iter_2.solverstate", "--no-progress"]) == 0
    resumed = blobs_of(read_model("half/t_iter_4.caffemodel"))
    assert straight.keys() == resumed.keys()
    for k in straight:
        for a, b in zip(straight[k], resumed[k]):
            np.testing.assert_array_equal(a, b)


def test_train_weights_finetune(workdir, capsys):
    assert cli.main(["train", "--solver", write_solver(max_iter=2), "--no-progress"]) == 0
    s = write_solver("ft.prototxt", max_iter=0, snapshot_prefix='"ft/x"', random_seed=99, test_interval=0)
    assert cli.main(["train", "--solver", s, "--weights", "snap/tiny_iter_2.caffemodel", "--no-progress"]) == 0
    a = blobs_of(read_model("snap/tiny_iter_2.caffemodel"))
    b = blobs_of(read_model("ft/x_iter_0.caffemodel"))
    for k in a:
        for x, y in zip(a[k], b[k]):
            np.testing.assert_array_equal(x, y)
    rc = cli.main(["train", "--solver", s, "--weights", "w.caffemodel", "--snapshot", "s.solverstate"])
    assert rc == 2  # mutually exclusive


def test_test_command_averages_outputs(workdir, capsys):
    assert cli.main(["train", "--solver", write_solver(max_iter=2), "--no-progress"]) == 0
    capsys.readouterr()
    rc = cli.main(["test", "--model", "net.prototxt", "--weights", "snap/tiny_iter_2.caffemodel", "--iterations", "3"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    w = blobs_of(read_model("snap/tiny_iter_2.caffemodel"))
    x = np.zeros((2, 3))  # Input blobs start at zero
    h = np.maximum(x @ w["ip1"][0].reshape(4, 3).T + w["ip1"][1], 0)
    y = (h @ w["ip2"][0].reshape(2, 4).T + w["ip2"][1]).ravel()
    lines = out.strip().splitlines()
    assert len(lines) == 4
    for line, v in zip(lines, y):
        name, rest = line.split(" = ", 1)
        assert name == "out"
        assert float(rest.split()[0]) == pytest.approx(float(v), rel=1e-5)
        assert "(* 1 = " in rest
    assert "Batch 2, out = " in err and "Loss: " in err


def test_time_command(workdir, capsys):
    rc = cli.main(["time", "--model", "net.prototxt", "--iterations", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    for layer in ("ip1", "relu", "ip2"):
        assert any(line.strip().startswith(f"{layer}\tforward: ") for line in out.splitlines())
        assert any(line.strip().startswith(f"{layer}\tbackward: ") for line in out.splitlines())
    assert "Average Forward pass" in out and "Average Backward pass" in out and "Total Time" in out
    assert cli.main(["time", "--model", "net.prototxt", "--iterations", "1", "--phase", "TEST"]) == 0


def test_device_query_without_gpu(capsys):
    from conftest import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present")
    rc = cli.main(["device_query"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "device_query: error: no GPU to query" in err and "Traceback" not in err


@pytest.mark.gpu
def test_device_query_with_gpu(capsys):
    assert cli.main(["device_query", "--gpu", "0"]) == 0
    out = capsys.readouterr().out
    assert "Name: " in out and "Compute capability: " in out and "Total global memory: " in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--solver", "missing.prototxt"], "missing.prototxt: solver file not found"),
        (["train", "--solver", "badsolver.prototxt"], "badsolver.prototxt:2:"),
        (["train", "--solver", "good.prototxt", "--snapshot", "none.solverstate"], "none.solverstate"),
        (["train", "--solver", "good.prototxt", "--weights", "none.caffemodel"], "none.caffemodel"),
        (["train", "--solver", "good.prototxt", "--gpu", "0,0"], "listed twice"),
        (["test", "--model", "net.prototxt", "--weights", "none.caffemodel"], "none.caffemodel: weights file not found"),
        (["test", "--model", "nonet.prototxt", "--weights", "x"], "nonet.prototxt: model file not found"),
        (["time", "--model", "bad.prototxt"], "bad.prototxt:2:"),
    ],
)
def test_user_errors_are_one_line(workdir, capsys, argv, message):
    Path("bad.prototxt").write_text('name: "x"\nlayer { name: "a" type: }\n')
    Path("badsolver.prototxt").write_text('base_lr: 0.1\nmax_iter: ten\n')
    write_solver("good.prototxt")
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 1
    assert message in err and "Traceback" not in err
    assert f"pycaffe-lite {argv[0]}: error: " in err


def test_usage_errors(capsys):
    assert cli.main([]) == 2
    assert cli.main(["train"]) == 2  # --solver is required
    assert cli.main(["nonsense"]) == 2
    assert cli.main(["--help"]) == 0
    assert "train" in capsys.readouterr().out


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.slow
def test_python_dash_m(workdir):
    r = subprocess.run([sys.executable, "-m", "pycaffe_lite", "--help"], capture_output=True, text=True,
                       env=_env(), timeout=60)
    assert r.returncode == 0 and "device_query" in r.stdout


@pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="POSIX signals")
@pytest.mark.slow
def test_sigint_writes_snapshot_then_exits(workdir):
    solver = write_solver(max_iter=10**7, display=0, test_interval=0, snapshot_prefix='"int/t"')
    # (the toy net's loss is unbounded below: --allow-nonfinite keeps a long run going)
    proc = subprocess.Popen([sys.executable, "-m", "pycaffe_lite", "train", "--solver", solver, "--allow-nonfinite"],
                            stderr=subprocess.PIPE, text=True, env=_env())
    try:
        for line in proc.stderr:
            if "Starting Optimization" in line:
                break
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert rc == 0, rest
    assert "SIGINT received" in rest and "Optimization stopped early." in rest
    states = list(Path("int").glob("t_iter_*.solverstate"))
    assert len(states) == 1
    it = int(states[0].stem.split("_iter_")[1])
    assert it > 0 and Path(f"int/t_iter_{it}.caffemodel").exists()
    state = caffe_pb2.SolverState()
    state.ParseFromString(states[0].read_bytes())
    assert state.iter == it


def test_solver_mode_gpu_in_file_without_gpu(workdir, capsys):
    from conftest import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present")
    # the file's GPU mode without a GPU: trained on the CPU, with one warning line saying so
    rc = cli.main(["train", "--solver", write_solver(solver_mode="GPU", device_id=0, max_iter=1), "--no-progress"])
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("W")]
    assert rc == 0 and "Traceback" not in err and len(warnings) == 1
    assert "solver_mode: GPU" in warnings[0] and "training on the CPU" in warnings[0] and "--cpu" in warnings[0]
    # --gpu N asked for: an error
    rc = cli.main(["train", "--solver", write_solver(max_iter=1), "--gpu", "0", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and "train: error: " in err and "Traceback" not in err
    # --cpu overrides the file's GPU mode
    gpu_solver = write_solver(solver_mode="GPU", device_id=0, max_iter=1)
    assert cli.main(["train", "--solver", gpu_solver, "--cpu", "--no-progress"]) == 0
    # CPU in the file, or no solver_mode at all, trains on the CPU
    assert cli.main(["train", "--solver", write_solver(solver_mode="CPU", max_iter=1), "--no-progress"]) == 0


def test_discovery_finds_commands_without_warnings(caplog):
    """The front ends and helpers that live beside the commands (cli, caffe_cli, gflags, digits) are no
    command modules and are not reported as broken ones."""
    from pycaffe_lite import commands

    with caplog.at_level("WARNING", logger="pycaffe_lite"):
        names = [m.NAME for m in commands.discover()]
    assert not caplog.records and {"train", "test", "time", "export_onnx"} & set(names) >= {"train", "test", "time"}
