"""One logging set-up: glog's line format, as BVLC's tools/extra/parse_log.py and
extract_seconds.py read it (their parsing re-implemented here, not copied), on a real training run."""

from __future__ import annotations

import datetime
import logging
import re
import threading

import pytest

from pycaffe_lite.commands import cli
from pycaffe_lite.glog import LOG, init_log, log
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.solvers.sgd_solvers import get_solver

# glog: severity, mmdd, hh:mm:ss.uuuuuu, thread id (right-aligned in 5), file:line] message
GLOG_LINE = re.compile(r"^([IWEF])(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) +(\d+) ([\w.]+):(\d+)\] (.*)$")
# What parse_log.py searches for (same patterns, written out here).
ITERATION = re.compile(r"Iteration (\d+)")
NET_OUTPUT = re.compile(r"(Train|Test) net output #(\d+): (\S+) = ([.\deE+-]+)")
LEARNING_RATE = re.compile(r"lr = ([-+]?[0-9]*\.?[0-9]+([eE]?[-+]?[0-9]+)?)")

NET = """
layer { name: "data" type: "DummyData" top: "x" top: "y"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 }
    data_filler { type: "gaussian" } data_filler { type: "gaussian" } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "y" top: "loss" }
"""


def glog_datetime(line: str, year: int) -> datetime.datetime:
    """extract_seconds.py's reading: split on blanks, month/day from the first word, the time
    (with microseconds after the last '.') from the second."""
    first, clock = line.strip().split()[:2]
    dot = clock.rfind(".")
    h, m, s = (int(v) for v in clock[:dot].split(":"))
    return datetime.datetime(year, int(first[1:3]), int(first[3:]), h, m, s, int(clock[dot + 1:]))


@pytest.fixture
def stderr_log(capsys):
    init_log(0)
    yield lambda: capsys.readouterr().err.splitlines()
    for h in list(LOG.handlers):
        LOG.removeHandler(h)
    LOG.setLevel(logging.NOTSET)


def test_line_format(stderr_log):
    log("hello")
    LOG.warning("careful %d", 3)
    (info, warn) = stderr_log()
    m = GLOG_LINE.match(info)
    assert m, info
    assert m.group(1) == "I" and m.group(9) == "test_glog.py" and m.group(11) == "hello"
    assert int(m.group(8)) == threading.get_native_id()
    assert GLOG_LINE.match(warn).group(1) == "W" and warn.endswith("] careful 3")
    now = datetime.datetime.now()
    when = glog_datetime(info, now.year)
    assert abs((now - when).total_seconds()) < 60
    assert re.search(r"\.\d{6} ", info)  # microseconds, as glog writes them


def test_levels_and_cli_share_the_one_handler(stderr_log, monkeypatch):
    init_log(1)
    LOG.info("hidden")
    LOG.error("shown")
    assert [line[0] for line in stderr_log()] == ["E"]
    monkeypatch.setenv("GLOG_minloglevel", "2")
    cli.configure_logging()
    cli.configure_logging(quiet=True)
    assert len(LOG.handlers) == 1 and LOG.level == logging.ERROR
    monkeypatch.setenv("GLOG_minloglevel", "0")
    cli.configure_logging(quiet=True)
    assert LOG.level == logging.WARNING
    with pytest.raises(ValueError, match="level"):
        init_log(7)


def test_training_log_parses_like_parse_log(stderr_log):
    param = parse_text(f'net_param {{ {NET} }} base_lr: 0.01 lr_policy: "fixed" display: 2 '
                       "test_iter: 1 test_interval: 2 max_iter: 4 random_seed: 1 snapshot_after_train: false", caffe_pb2.SolverParameter())
    solver = get_solver(param, progress=False)
    solver.solve()
    lines = stderr_log()
    assert lines and all(GLOG_LINE.match(line) for line in lines), lines[:3]
    year = datetime.datetime.now().year
    start = next(glog_datetime(line, year) for line in lines if "Solving" in line)
    train, test, iteration, lr = [], [], -1, float("nan")
    for line in lines:
        if m := ITERATION.search(line):
            iteration = int(m.group(1))
        if iteration < 0:
            continue
        seconds = (glog_datetime(line, year) - start).total_seconds()
        assert 0 <= seconds < 600
        if m := LEARNING_RATE.search(line):
            lr = float(m.group(1))
        if m := NET_OUTPUT.search(line):
            (train if m.group(1) == "Train" else test).append((iteration, m.group(3), float(m.group(4)), lr))
    assert [(it, name) for it, name, _, _ in train] == [(0, "loss"), (2, "loss")]
    assert [it for it, _, _, _ in test] == [0, 2, 4]
    assert all(value >= 0 for _, _, value, _ in train + test)
    assert train[1][3] == pytest.approx(0.01)  # 'lr = ' follows the outputs, as in Caffe's logs


@pytest.mark.slow
def test_solver_logs_glog_lines_when_stderr_is_not_a_terminal(tmp_path):
    """solver.solve() from a script whose stderr is a pipe prints Caffe's log (no bar, no set-up
    needed); a script that configured logging itself keeps its own set-up."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    (tmp_path / "net.prototxt").write_text(
        'layer { name: "d" type: "Input" top: "d" input_param { shape { dim: 2 dim: 3 } } }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "d" top: "y" loss_weight: 1 '
        'inner_product_param { num_output: 2 } }\n')
    (tmp_path / "solver.prototxt").write_text('net: "net.prototxt" base_lr: 0.1 lr_policy: "fixed" max_iter: 2 '
                                              'display: 1 snapshot_after_train: false\n')
    code = textwrap.dedent("""
        import logging, sys
        if sys.argv[1] == "configured":
            logging.basicConfig(level=logging.WARNING, format="CONFIGURED %(message)s")
        import pycaffe_lite as caffe
        caffe.get_solver("solver.prototxt").solve()
        """)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"}
    plain = subprocess.run([sys.executable, "-c", code, "plain"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120, env=env)
    assert plain.returncode == 0, plain.stderr
    lines = plain.stderr.splitlines()
    assert any(re.match(r"I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ solver\.py:\d+\] Iteration 1 .*loss = ", x) for x in lines)
    assert any(x.endswith("] Optimization Done.") for x in lines)
    configured = subprocess.run([sys.executable, "-c", code, "configured"], cwd=tmp_path, capture_output=True,
                                text=True, timeout=120, env=env)
    assert configured.returncode == 0 and "Optimization Done." not in configured.stderr
