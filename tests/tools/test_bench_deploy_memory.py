"""benchmarks/deploy_memory.py --plan and --train-plan without a GPU: the CPU count of a deploy net's
shared-data plan and of a training iteration's plan."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_train_plan_counts_less_with_forward_only_data_in_the_gradient_slots():
    spec = importlib.util.spec_from_file_location("bench_deploy_memory", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    line = mod.train_plan("resnet50", 2, "fp16")
    found = re.search(r"fp16 b2 training iteration:\s+(\d+) MiB before,\s+(\d+) MiB after \(blobs data\+diff (\d+) "
                      r"MiB alone, (\d+) with shared diffs, (\d+) with (\d+) forward-only data blobs of (\d+) MiB.*"
                      r"params (\d+), history (\d+), masters (\d+) MiB", line)
    assert found, line
    before, after, alone, diffs, both, blobs, forward_only, params, history, masters = map(int, found.groups())
    assert after < before and both < diffs < alone and blobs == 20  # ResNet-50's 16 + 4 SUM inputs
    assert before - after <= forward_only + 1 and masters > params > 0 and history > 0
    assert abs(before - (diffs + params + history + masters)) <= 2  # (each rounded to MiB)
