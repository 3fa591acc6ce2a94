"""The main job in half precision (docs/precision.md, issue 34's accuracy rows): LeNet trained with
Caffe's recipe on the full MNIST through ``examples/mnist/train_lenet.py --precision`` in fp32,
fp16 and bf16 on the GPU ends within 0.2 percentage points of the fp32 accuracy; on the CPU, a
short run in fp16 and bf16 stores LeNet in half and learns."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "mnist" / "train_lenet.py"
STORED = {"fp16": "float16", "bf16": "bfloat16"}
SUMMARY = re.compile(r"LeNet: (\d+) iterations in ([\d.]+) s \(([\d.]+) it/s\) on (.+?); "
                     r"final test accuracy ([\d.]+) on (\d+) images")


def train_lenet(precision: str, out: Path, mnist_dir: Path, *extra: str, timeout: float = 1500) -> tuple[float, str]:
    """Run the main job in ``precision``; (final test accuracy, its stdout)."""
    cmd = [sys.executable, str(SCRIPT), "--data", str(mnist_dir), "--precision", precision, "--out", str(out),
           "--no-progress", "--seed", "1", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=out.parent)
    assert proc.returncode == 0, (precision, proc.stderr[-3000:])
    m = SUMMARY.search(proc.stdout)
    assert m, proc.stdout[-2000:]
    assert m.group(4).endswith(f", {precision}")
    if precision in STORED:
        assert f"Precision: {precision} (weights and blobs stored as {STORED[precision]}, float32 master weights)" \
            in proc.stdout
    return float(m.group(5)), proc.stdout


@pytest.mark.slow  # ~25 s on two cores: half runs on the host's float32 views
def test_lenet_trains_in_half_on_the_cpu(mnist_dir, tmp_path):
    """60 iterations on 6,000 digits in each precision: half storage announced, accuracy well above
    chance and within a few points of fp32's (a short run: the GPU test below holds the 0.2 rule)."""
    acc = {}
    for precision in ("fp32", "fp16", "bf16"):
        acc[precision], _ = train_lenet(precision, tmp_path / precision, mnist_dir, "--iters", "60",
                                        "--test-interval", "60", "--train-limit", "6000", "--test-limit", "500",
                                        timeout=600)
    assert acc["fp32"] > 0.8, acc
    assert abs(acc["fp16"] - acc["fp32"]) < 0.05 and abs(acc["bf16"] - acc["fp32"]) < 0.05, acc


@pytest.mark.gpu
@pytest.mark.slow  # three full runs of the main job (10,000 iterations each)
def test_lenet_full_mnist_half_within_0_2_points_of_fp32(mnist_dir, tmp_path):
    """Caffe's LeNet recipe (10,000 iterations of batch 64, the solver's seed 1) on all 60,000
    training images, tested once at the end on all 10,000 test images, on GPU 0: fp16 and bf16
    each within 0.2 percentage points of fp32 (20 of 10,000 images)."""
    acc, lines = {}, []
    for precision in ("fp32", "fp16", "bf16"):
        acc[precision], stdout = train_lenet(precision, tmp_path / precision, mnist_dir, "--gpu", "0",
                                             "--test-interval", "10000")
        lines.append(SUMMARY.search(stdout).group(0))  # type: ignore[union-attr]
    print("\n".join(lines))  # (pytest -s shows the three runs' times and accuracies)
    assert acc["fp32"] >= 0.985, acc  # the recipe's accuracy (99.1 % on GPUs, see examples/mnist/README.md)
    for half in ("fp16", "bf16"):
        assert abs(acc[half] - acc["fp32"]) <= 0.002, (half, acc)
