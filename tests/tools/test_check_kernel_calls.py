"""tools/check_kernels.py --calls: Python call sites name existing kernels (no nvcc needed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "check_kernels.py"

CU = """
#define TILE_KERNEL(N) __global__ void fwd_##N(const int n, Dtype* y) { CUDA_KERNEL_LOOP(i, n) { y[i] = N; } }
TILE_KERNEL(32)
TILE_KERNEL(64)
__global__ void scale_kernel(const int n, const Dtype a, Dtype* y) { CUDA_KERNEL_LOOP(i, n) { y[i] *= a; } }
"""


def run_calls(tmp_path: Path, source: str, name: str = "layer.py") -> subprocess.CompletedProcess:
    (tmp_path / "layer.cu").write_text(CU)
    (tmp_path / "shared.cu").write_text(CU)
    (tmp_path / name).write_text(textwrap.dedent(source))
    return subprocess.run([sys.executable, str(TOOL), "--calls", "--paths", str(tmp_path / name)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_good_call_sites_pass(tmp_path):
    proc = run_calls(tmp_path, """
        from pathlib import Path
        from pycaffe_lite.gpu import backend
        KERNELS = Path(__file__).with_suffix(".cu")
        OTHER = Path(__file__).with_name("shared.cu")
        TILES = ("32", "64")

        def _k(name, dtype):
            return backend.kernel(KERNELS, name, dtype)

        def forward(dt, tile, x):
            backend.kernel(KERNELS, "scale_kernel", dt)(4, 2.0, x)
            backend.kernel(OTHER, f"fwd_{tile}", dt)(4, x)
            for t in TILES:
                backend.kernel(Path(__file__).parent / "shared.cu", f"fwd_{t}", dt)(4, x)
            mod = backend.module(KERNELS, dt)
            mod.get("fwd_32")(4, x)
            backend.module(OTHER, dt).get("scale_kernel")
            _k("fwd_64", dt)(4, x)
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 kernel call site(s) checked" in proc.stdout


@pytest.mark.slow
def test_unknown_names_files_and_argtypes_are_reported(tmp_path):
    proc = run_calls(tmp_path, """
        from pathlib import Path
        from pycaffe_lite.gpu import backend
        KERNELS = Path(__file__).with_suffix(".cu")
        MISSING = Path(__file__).with_name("nope.cu")
        TILES = ("32", "128")

        def _k(name, dtype, argtypes):
            return backend.kernel(KERNELS, name, dtype, argtypes)

        def forward(dt, x, tile):
            backend.kernel(KERNELS, "scale_kernal", dt)(4, 2.0, x)
            backend.kernel(KERNELS, "scale_kernel", dt, "ifP")(4, 4, 2.0, x)
            backend.kernel(MISSING, "scale_kernel", dt)
            backend.module(KERNELS, dt).get("fwd_16")
            for t in TILES:
                backend.kernel(KERNELS, f"fwd_{t}", dt)
            backend.kernel(KERNELS, f"bwd_{tile}", dt)
            _k("fwd_32", dt, "iP")(4, 4, x)
    """)
    assert proc.returncode == 1
    out = proc.stdout
    assert "layer.py:12: kernel 'scale_kernal' is not in" in out and "its kernels: fwd_32, fwd_64, scale_kernel" in out
    assert "layer.py:13: leftover argument-type string" in out
    assert "layer.py:14: backend.kernel: kernel file" in out and "nope.cu does not exist" in out
    assert "layer.py:15: kernel 'fwd_16' is not in" in out
    assert "layer.py:17: kernel 'fwd_128' is not in" in out and "'fwd_32' is not" not in out
    assert "layer.py:18: no kernel of" in out and "bwd_" in out
    assert "layer.py:9: leftover argument-type string" in out  # inside the helper
    assert "layer.py:19: leftover argument-type string passed through _k()" in out
    assert "7 problem(s)" not in out and "8 problem(s)" in out


@pytest.mark.slow
def test_runs_without_nvcc(tmp_path):
    (tmp_path / "bin").mkdir()
    env = {"PATH": str(tmp_path / "bin"), "NVCC": "no-such-nvcc"}
    proc = subprocess.run([sys.executable, str(TOOL), "--calls", "--paths", str(REPO / "layers" / "relu.py")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert "call site(s) checked" in proc.stdout, proc.stderr
