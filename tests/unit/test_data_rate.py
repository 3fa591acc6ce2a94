"""The data layers' rate in the training log (``solvers/data_rate.py``): a line per data layer at
each display, from the layers' own counters."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from pycaffe_lite.data.db import LMDBWriter
from pycaffe_lite.proto import caffe_pb2
from pycaffe_lite.solvers.data_rate import DataRate, rate_line

NET = """
name: "tiny"
layer { name: "data" type: "Data" top: "data" top: "label"
        data_param { source: "%(db)s" batch_size: 4 backend: LMDB workers: 0 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""

LINE = re.compile(r"data layer 'data': ([\d,]+) img/s, waited ([\d.e+-]+) ms/iter \((\d+)%\)")


def test_rate_line_numbers():
    line = rate_line("data", (2, 8, 0.5), (12, 48, 0.7), 2.0)
    assert line == "data layer 'data': 20 img/s, waited 20 ms/iter (10%)"
    assert rate_line("d", (2, 8, 0.1), (12, 2568, 0.1), 0.1) == "data layer 'd': 25,600 img/s, waited 0 ms/iter (0%)"
    assert rate_line("data", (3, 12, 0.0), (3, 12, 0.0), 1.0) is None  # nothing served
    assert rate_line("data", (0, 0, 0.0), (1, 4, 0.0), 0.0) is None  # no time


class _Counting:
    def __init__(self) -> None:
        self.stats = (0, 0, 0.0)

    def data_stats(self):
        return self.stats


def test_data_rate_follows_the_counters_between_displays():
    a, b, other = _Counting(), _Counting(), object()
    rate = DataRate([a, other, b], ["a", "conv", "b"])
    assert [name for name, _ in rate.layers] == ["a", "b"]
    a.stats = (5, 40, 0.25)
    assert rate.lines(1.0) == ["data layer 'a': 40 img/s, waited 50 ms/iter (25%)"]  # b served nothing
    a.stats, b.stats = (10, 80, 0.25), (2, 2, 0.5)
    assert rate.lines(2.0) == ["data layer 'a': 20 img/s, waited 0 ms/iter (0%)",
                               "data layer 'b': 1 img/s, waited 250 ms/iter (25%)"]


def test_training_log_reports_the_data_rate(tmp_path, caplog):
    pytest.importorskip("lmdb")
    from pycaffe_lite.solvers.sgd_solvers import get_solver

    rng = np.random.default_rng(5)
    with LMDBWriter(tmp_path / "db") as w:
        for i in range(20):
            d = caffe_pb2.Datum(channels=1, height=4, width=4, label=i % 3,
                                data=rng.integers(0, 256, 16, dtype=np.uint8).tobytes())
            w.put(b"%08d" % i, d.SerializeToString())
    (tmp_path / "net.prototxt").write_text(NET % {"db": tmp_path / "db"})
    sp = caffe_pb2.SolverParameter(net=str(tmp_path / "net.prototxt"), base_lr=0.01, lr_policy="fixed",
                                   max_iter=9, display=4, snapshot_prefix=str(tmp_path / "t"), random_seed=1)
    solver = get_solver(sp, progress=False)
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        solver.solve()
    solver.net.layers[0].close()
    text = [r.getMessage() for r in caplog.records]
    found = [LINE.search(t) for t in text]
    rates = [m for m in found if m]
    assert len(rates) == 3  # displays at iterations 0, 4 and 8
    iteration_lines = [k for k, t in enumerate(text) if t.startswith("Iteration ") and "iter/s" in t]
    data_lines = [k for k, m in enumerate(found) if m]
    assert [k + 1 for k in iteration_lines] == data_lines  # each right after its display line
    for m in rates:
        assert float(m.group(1).replace(",", "")) > 0
        assert 0 <= float(m.group(2)) < 60_000
        assert 0 <= int(m.group(3)) <= 100
    # the wait is part of the wall time of the interval: images/s * ms per iteration / batch <= 1000
    for m in rates:
        per_s = float(m.group(1).replace(",", ""))
        assert per_s / 4 * float(m.group(2)) <= 1000 * 1.01
