"""benchmarks/deploy_memory.py --plan without a GPU: the CPU count of a deploy net's shared-data plan."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "deploy_memory.py"


def test_plan_counts_less_memory_shared_than_alone():
    spec = importlib.util.spec_from_file_location("bench_deploy_memory", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    line = mod.plan("squeezenet1_1", 2)
    found = re.search(r"blob data:\s+(\d+) MiB alone,\s+(\d+) MiB shared \((\d+) slots for (\d+) of (\d+)", line)
    assert found, line
    alone, shared, slots, planned, memories = map(int, found.groups())
    assert 0 < shared < alone and slots >= 1 and 1 < planned <= memories
