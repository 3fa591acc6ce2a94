"""benchmarks/bandwidth.py on the CPU: every case builds and runs its passes at shrunken shapes (timing needs a GPU)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bandwidth.py"
FORK_TYPES = {"Permute", "Normalize", "Interp", "Upsample", "ReLU6", "ShuffleChannel", "Axpy", "BN", "Reverse",
              "Transpose"}


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_bandwidth", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve string annotations through the module
    spec.loader.exec_module(mod)
    return mod


def _type(case) -> str:
    return case.text.split('"')[1]


def test_case_names_unique_and_every_fork_layer_covered(bench):
    names = [c.name for c in bench.cases()]
    assert len(names) == len(set(names))
    assert FORK_TYPES <= {_type(c) for c in bench.fork_cases()}
    for case in bench.cases():
        assert case.bwd_elems > 0 and case.fwd_elems >= 0 and len(case.name) <= 64, case.name


def test_segnet_mask_points_into_each_window(bench):
    values, mask = bench.segnet_mask(np.random.default_rng(1), [(2, 3, 4, 5), (2, 3, 4, 5)])
    m = mask.astype(np.int64)
    rows, cols = m // 10, m % 10
    assert values.shape == mask.shape == (2, 3, 4, 5)
    assert np.all(rows // 2 == np.arange(4)[:, None]) and np.all(cols // 2 == np.arange(5)[None, :])


def _small(case):
    """The case at small shapes: each axis cut to 3 (size-1 axes kept); Interp to a small output."""
    shapes = [tuple(min(d, 3) for d in s) for s in case.bottoms]
    text = case.text.replace("height: 473 width: 473", "height: 7 width: 7").replace("height: 60 width: 60",
                                                                                     "height: 5 width: 5")
    if _type(case) == "ShuffleChannel":
        shapes = [(s[0], 6, *s[2:]) for s in shapes]
    return dataclasses.replace(case, bottoms=shapes, text=text)


def test_every_fork_case_runs_forward_and_backward_on_cpu(bench):
    import pycaffe_lite as caffe

    caffe.set_mode_cpu()
    calls = []

    def timer(fn):
        fn()
        calls.append(1)
        return 1.0

    for case in bench.fork_cases():
        fwd, bwd = bench.run_case(_small(case), timer)
        assert bwd == 1.0 and (fwd == 1.0) == bool(case.fwd_elems), case.name
    assert len(calls) == 2 * len(bench.fork_cases())


def test_same_traffic_copy(bench, monkeypatch):
    assert bench.same_traffic_copy_bytes(2 * 1000) == 4000  # Permute: 2n elements moved = a copy of n floats
    assert bench.same_traffic_copy_bytes(3) == 4  # rounded down to whole floats, at least one
    assert bench.same_traffic_copy_bytes(0.5) == 4
    sizes = []
    monkeypatch.setattr(bench, "copy_bandwidth", lambda timer, nbytes: sizes.append(nbytes) or 1.0 * nbytes)
    rates = bench.CopyRates(timer=None)
    assert rates(8) == 8.0 and rates(8) == 8.0 and rates(12) == 12.0
    assert sizes == [8, 12]  # measured once per size
