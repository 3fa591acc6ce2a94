"""benchmarks/zoo_ab.py on the CPU: one net, one mode, this checkout against itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_checkout_against_itself(tmp_path):
    out = tmp_path / "ab.md"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "zoo_ab.py"), "--before", str(ROOT), "--cpu",
                           "--nets", "squeezenet1_1", "--modes", "pycaffe", "--batch", "1", "--iters", "1",
                           "--warmup", "0", "--latency-iters", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    row = [r for r in out.read_text().splitlines() if r.startswith("| pycaffe | squeezenet1_1 |")]
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    before, after = float(cells[2]), float(cells[3])
    assert before > 0 and after > 0 and cells[4].endswith("x")
    # the ratio is of the unrounded times; the cells hold them to 0.005 ms and the ratio to 0.0005
    slack = 0.005 / before + 0.005 * after / before**2 + 0.0005
    assert abs(float(cells[4][:-1]) - after / before) <= slack, (cells, slack)
