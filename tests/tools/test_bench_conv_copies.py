"""benchmarks/conv_copies.py on the CPU: every case's copy is launched through a fake backend that
checks the arguments against the kernels' signatures (timing needs a GPU)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite.gpu import backend, signatures

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "conv_copies.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_conv_copies", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def launches(monkeypatch):
    log: list = []

    class FakeKernel:
        def __init__(self, path, name):
            self.name = name
            self.sig = signatures.parse_signatures(Path(path).read_text())[name]

        def __call__(self, *args, **launch):
            signatures.check_args(self.sig, args, self.name)
            log.append(self.name)

        def launch(self, grid, block, *args, shared=0):
            self(*args)

    monkeypatch.setattr(backend, "kernel", lambda path, name, dtype: FakeKernel(path, name))
    return log


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_every_case_launches_its_copy(bench, launches, precision):
    dtype = bench.PRECISIONS[precision]
    todo = bench.cases(2, dtype)
    assert len({c.name for c in todo}) == len(todo)
    for case in todo:
        assert 0 < case.moved <= case.src_elems + case.dst_elems, case.name
        before = len(launches)
        case.run(256, 1 << 20)
        assert len(launches) == before + 1, case.name
        assert launches[-1].startswith(case.name.split()[0]), (case.name, launches[-1])
    families = {name.rsplit("_", 1)[0] if name[-1] == "b" else name for name in launches}
    half = np.dtype(dtype).itemsize == 2
    assert families == {"copy_planes", "subsample_planes", "upsample_planes", "swap_leading_axes"} | (
        {"t16n_to_nhwc"} if half else set())
