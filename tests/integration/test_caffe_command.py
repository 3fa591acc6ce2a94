"""The ``caffe`` command: gflags syntax, BVLC's global flags accepted with a warning, glog's flags and
log files (names, header, line format, what BVLC's parse_log.py matches), and the four actions."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pycaffe_lite import glog
from pycaffe_lite.commands import caffe_cli
from pycaffe_lite.commands.gflags import Flag, FlagError, parse

REPO = Path(__file__).resolve().parents[2]

FLAGS = (Flag("solver", str, ""), Flag("iterations", int, 50), Flag("gray", bool, False),
         Flag("scale", float, 1.0))


# -- gflags ----------------------------------------------------------------------------------
def test_gflags_spellings():
    for argv in (["-solver", "s.prototxt"], ["-solver=s.prototxt"], ["--solver", "s.prototxt"],
                 ["--solver=s.prototxt"]):
        assert parse(argv, FLAGS, env={}).solver == "s.prototxt"
    p = parse(["-iterations", "7", "-scale=0.5", "-gray", "pos1", "pos2"], FLAGS, env={})
    assert (p.iterations, p.scale, p.gray, p.positional) == (7, 0.5, True, ["pos1", "pos2"])
    assert parse(["-nogray"], FLAGS, env={}).gray is False
    for text, value in (("false", False), ("0", False), ("no", False), ("true", True), ("1", True), ("y", True)):
        assert parse([f"-gray={text}"], FLAGS, env={}).gray is value
    # positionals anywhere, '--' ends the flags
    p = parse(["a", "-iterations", "3", "b", "--", "-gray"], FLAGS, env={})
    assert p.positional == ["a", "b", "-gray"] and p.gray is False and p.given == {"iterations"}
    # defaults, and defaults from the environment
    assert parse([], FLAGS, env={}).iterations == 50
    assert parse([], FLAGS, env={"GLOG_iterations": "9"}).iterations == 50  # not a glog flag
    assert parse([], FLAGS, env={"GLOG_minloglevel": "2"}).minloglevel == 2
    assert parse([], FLAGS, env={"GLOG_logtostderr": "1"}).logtostderr is True
    with pytest.raises(FlagError, match=r"\$GLOG_minloglevel: illegal value 'x'"):
        parse([], FLAGS, env={"GLOG_minloglevel": "x"})


def test_gflags_errors_and_foreign_flags():
    with pytest.raises(FlagError, match="unknown command line flag 'nope'"):
        parse(["-nope", "1"], FLAGS, env={})
    with pytest.raises(FlagError, match="illegal value 'x' specified for int32 flag 'iterations'"):
        parse(["-iterations=x"], FLAGS, env={})
    with pytest.raises(FlagError, match="illegal value 'maybe' specified for bool flag 'gray'"):
        parse(["-gray=maybe"], FLAGS, env={})
    with pytest.raises(FlagError, match="'solver' is missing its argument"):
        parse(["-solver"], FLAGS, env={})
    with pytest.raises(FlagError, match="unknown command line flag 'nosolver'"):
        parse(["-nosolver"], FLAGS, env={})
    # another command's flag: accepted (its value consumed) with a warning
    p = parse(["-weights", "w.caffemodel", "x"], FLAGS, foreign=[Flag("weights", str, "")], command="caffe time",
              env={})
    assert p.positional == ["x"] and "weights" not in p.values
    assert p.warnings == ["caffe time: flag -weights is not used by this command; ignored"]


def test_gflags_flagfile(tmp_path):
    inner = tmp_path / "inner.flags"
    inner.write_text("--gray\n")
    outer = tmp_path / "outer.flags"
    outer.write_text(f"# a comment\n--solver=from_file.prototxt\n-iterations=4\nnot-a-flag-line\n"
                     f"--flagfile={inner}\n")
    p = parse([f"-flagfile={outer}", "-iterations", "5"], FLAGS, env={})
    assert (p.solver, p.iterations, p.gray) == ("from_file.prototxt", 5, True)  # later flags win
    with pytest.raises(FlagError, match="cannot read"):
        parse([f"--flagfile={tmp_path / 'missing'}"], FLAGS, env={})


# -- the command -----------------------------------------------------------------------------
NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 }
                           data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" include { phase: TEST } }
"""
SOLVER = """net: "net.prototxt"
test_iter: 1
test_interval: 2
base_lr: 0.1
lr_policy: "fixed"
max_iter: 4
display: 1
snapshot: 4
snapshot_prefix: "snap"
"""


@pytest.fixture
def job(tmp_path, monkeypatch):
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(SOLVER)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    glog.close_log_files()
    glog.init_log()


def test_train_with_log_dir_writes_glog_files(job, capsys):
    rc = caffe_cli.run(["train", "-solver", "solver.prototxt", "-log_dir", "logs", "-iterations", "3",
                        "--alsologtostderr=false"])
    assert rc == 0
    logs = job / "logs"
    host, pid = socket.gethostname(), os.getpid()
    infos = [p for p in logs.iterdir() if ".log.INFO." in p.name]
    assert len(infos) == 1
    name = infos[0].name
    assert re.fullmatch(rf"caffe\.{re.escape(host)}\.[^.]+\.log\.INFO\.\d{{8}}-\d{{6}}\.{pid}", name), name
    assert os.readlink(logs / "caffe.INFO") == name
    # the warning about -iterations went to the WARNING file too
    assert os.readlink(logs / "caffe.WARNING").startswith(f"caffe.{host}.")
    text = (logs / "caffe.INFO").read_text().splitlines()
    assert text[0].startswith("Log file created at: ") and text[1] == f"Running on machine: {host}"
    assert text[2] == "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg"
    line = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] ")
    assert all(line.match(t) for t in text[3:]), [t for t in text[3:] if not line.match(t)][:3]
    body = "\n".join(text)
    assert "flag -iterations is not used by this command" in body
    # what tools/extra/parse_log.py and extract_seconds.py look for
    assert re.search(r"\] Solving tiny", body)
    assert len(re.findall(r"Iteration (\d+), lr = 0.1", body)) == 4
    assert len(re.findall(r"Train net output #0: loss = [\d.eE+-]+", body)) == 4
    assert len(re.findall(r"Test net output #1: acc = [\d.eE+-]+", body)) == 3
    assert (job / "snap_iter_4.caffemodel").is_file() and (job / "snap_iter_4.solverstate").is_file()
    # -alsologtostderr=false: only ERROR and up (stderrthreshold 2) on stderr
    assert "Iteration" not in capsys.readouterr().err


def test_train_resume_test_and_time(job, capsys):
    # flags may come before the action too (gflags takes them out first)
    assert caffe_cli.run(["-minloglevel=1", "train", "-solver=solver.prototxt"]) == 0
    (job / "solver.prototxt").write_text(SOLVER.replace("max_iter: 4", "max_iter: 6"))
    assert caffe_cli.run(["train", "--solver", "solver.prototxt", "--snapshot", "snap_iter_4.solverstate",
                          "-minloglevel", "1"]) == 0
    assert (job / "snap_iter_6.caffemodel").is_file()
    capsys.readouterr()
    assert caffe_cli.run(["test", "-model", "net.prototxt", "-weights", "snap_iter_6.caffemodel",
                          "-iterations", "2", "-log_dir", "tlogs"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^acc = [\d.]+$", out, re.M) and re.search(r"^loss = [\d.]+ \(\* 1 = [\d.]+ loss\)$", out, re.M)
    logged = (job / "tlogs" / "caffe.INFO").read_text()  # and in the log, as BVLC's caffe test
    assert re.search(r"\] acc = [\d.]+$", logged, re.M) and re.search(r"\] Batch 1, loss = ", logged)
    # BVLC's docs time a model with -weights: accepted with a warning
    assert caffe_cli.run(["time", "-model", "net.prototxt", "-weights", "snap_iter_6.caffemodel",
                          "-iterations", "2", "-phase", "TEST"]) == 0
    captured = capsys.readouterr()
    assert "flag -weights is not used by this command; ignored" in captured.err
    assert "Average Forward pass" in captured.out


def test_command_line_errors(job, capsys):
    assert caffe_cli.run([]) == 1 and "usage: caffe <command> <args>" in capsys.readouterr().err
    assert caffe_cli.run(["brew"]) == 1 and "unknown action: brew" in capsys.readouterr().err
    assert caffe_cli.run(["train", "-solverr", "x"]) == 1
    assert "unknown command line flag 'solverr'" in capsys.readouterr().err
    assert caffe_cli.run(["train"]) == 1 and "Need a solver definition to train." in capsys.readouterr().err
    assert caffe_cli.run(["train", "-solver", "solver.prototxt", "-weights", "a", "-snapshot", "b"]) == 1
    assert "not both" in capsys.readouterr().err
    assert caffe_cli.run(["test", "-model", "net.prototxt"]) == 1
    assert "Need model weights to score." in capsys.readouterr().err
    assert caffe_cli.run(["time", "-model", "net.prototxt", "-phase", "VAL"]) == 1
    assert 'phase must be "TRAIN" or "TEST"' in capsys.readouterr().err
    assert caffe_cli.run(["train", "-solver", "missing.prototxt"]) == 1
    assert "missing.prototxt" in capsys.readouterr().err
    assert caffe_cli.run(["train", "-help"]) == 0 and "-solver" in capsys.readouterr().out
    assert caffe_cli.run(["device_query"]) == 1 and "Need a device ID" in capsys.readouterr().err
    assert caffe_cli.run(["-version"]) == 0 and "caffe version" in capsys.readouterr().out
    assert caffe_cli.run(["train", "-solver", "solver.prototxt", "-sigint_effect", "explode"]) == 1
    assert 'Invalid signal effect "explode"' in capsys.readouterr().err


def test_minloglevel_and_logtostderr(job, capsys):
    assert caffe_cli.run(["train", "-solver", "solver.prototxt", "-minloglevel=2", "-log_dir=logs",
                          "-logtostderr"]) == 0
    assert "Iteration" not in capsys.readouterr().err
    assert not (job / "logs").exists() or not any((job / "logs").iterdir())  # -logtostderr: no files


@pytest.mark.slow
def test_console_script_subprocess(job):
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "pycaffe_lite.commands.caffe_cli", "train", "-solver", "solver.prototxt"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Optimization Done." in r.stderr  # caffe logs INFO to stderr by default (alsologtostderr)
