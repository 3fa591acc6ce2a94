"""tools/check_kernels.py: every kernel file compiles for float and double; a broken one fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "check_kernels.py"

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # CI runs tools/check_kernels.py itself before pytest -m "not slow"
def test_every_kernel_file_compiles():
    proc = run_tool()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the lead's shared kernels are always among the files checked, for both element types
    assert "pycaffe_lite/gpu/math_functions.cu [Dtype=float" in proc.stdout
    assert "pycaffe_lite/gpu/math_functions.cu [Dtype=double" in proc.stdout


@pytest.mark.slow
def test_broken_kernel_fails_with_file_and_message(tmp_path):
    good = tmp_path / "good.cu"
    good.write_text("__global__ void ok_kernel(const int n, Dtype* y) {\n"
                    "  CUDA_KERNEL_LOOP(i, n) { y[i] = Dtype(2); }\n}\n")
    bad = tmp_path / "broken.cu"
    bad.write_text("__global__ void bad_kernel(const int n, Dtype* y) {\n"
                   "  CUDA_KERNEL_LOOP(i, n) { y[i] = no_such_identifier; }\n}\n")
    proc = run_tool("--paths", str(tmp_path), "--dtype", "float", "--dtype", "double")
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "FAIL" in out and "broken.cu" in out
    assert "no_such_identifier" in out  # nvcc's message is shown
    assert f"{bad}(2)" in out  # reported against the original file and line
    assert "ok   " in out and "good.cu" in out
    assert "2 of 4 compilations succeeded" in out


@pytest.mark.slow
def test_templates_are_rejected_like_sourcemodule(tmp_path):
    """SourceModule wraps files in extern "C", so a template must fail here too."""
    bad = tmp_path / "templ.cu"
    bad.write_text("template <typename T> __device__ T twice(T v) { return v + v; }\n")
    proc = run_tool("--paths", str(bad), "--dtype", "float")
    assert proc.returncode == 1, proc.stdout + proc.stderr


@pytest.mark.slow
def test_missing_path_is_a_clear_error(tmp_path):
    proc = run_tool("--paths", str(tmp_path / "nope.cu"))
    assert proc.returncode == 2
    assert "nope.cu" in proc.stderr


@pytest.mark.slow
def test_arch_option_is_passed_to_nvcc(tmp_path):
    good = tmp_path / "good.cu"
    good.write_text("__global__ void k(const int n, Dtype* y) { CUDA_KERNEL_LOOP(i, n) { y[i] = 0; } }\n")
    proc = run_tool("--paths", str(good), "--arch", "sm_80", "--dtype", "double")
    assert proc.returncode == 0, proc.stderr
    assert "[Dtype=double, sm_80]" in proc.stdout
    bad_arch = run_tool("--paths", str(good), "--arch", "sm_not_an_arch", "--dtype", "float")
    assert bad_arch.returncode == 1


def test_half_and_bfloat16_compile_with_a_float_math_type(tmp_path):
    """--dtype half / bfloat16: Dtype is __half / __nv_bfloat16, Mtype float, to_m/from_m convert,
    and the shared block sum (block_sum.cuh) sums in Mtype; float and double compile the same file."""
    k = tmp_path / "mixed.cu"
    k.write_text('#include "block_sum.cuh"\n'
                 "__global__ void scale_sum(const int n, const Dtype* x, Dtype* y, float* out) {\n"
                 "  Mtype s = 0, s2 = 0;\n"
                 "  CUDA_KERNEL_LOOP(i, n) { const Mtype v = to_m(x[i]); y[i] = from_m(v * Mtype(2)); s += v; s2 += v * v; }\n"
                 "  block_sum2(s, s2);\n"
                 "  if (threadIdx.x == 0) out[blockIdx.x] = s + s2;\n}\n")
    proc = run_tool("--paths", str(k), *[a for t in ("float", "double", "half", "bfloat16") for a in ("--dtype", t)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[Dtype=half, sm_90]" in proc.stdout and "[Dtype=bfloat16, sm_90]" in proc.stdout
    assert "4 of 4 compilations succeeded" in proc.stdout
    # a half kernel that sums in Dtype through the float block sum is refused
    bad = tmp_path / "dtype_sum.cu"
    bad.write_text('#include "block_sum.cuh"\n'
                   "__global__ void dsum(const int n, const Dtype* x, Dtype* out) {\n"
                   "  Dtype s = x[0], s2 = x[0];\n  block_sum2(s, s2);\n  out[0] = s;\n}\n")
    proc = run_tool("--paths", str(bad), "--dtype", "float", "--dtype", "half")
    assert proc.returncode == 1 and "1 of 2 compilations succeeded" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow  # about 5 minutes on two cores: 2 compilations per kernel file
def test_every_kernel_file_compiles_for_half_and_bfloat16():
    """Every .cu of the package (pycaffe_lite/**, layers/) builds with Dtype __half and __nv_bfloat16
    (Mtype float), as tools/check_kernels.py --dtype half --dtype bfloat16 compiles it."""
    files = sorted(set((REPO / "pycaffe_lite").rglob("*.cu")) | set((REPO / "layers").glob("*.cu")))
    proc = subprocess.run([sys.executable, str(TOOL), "--dtype", "half", "--dtype", "bfloat16"],
                          capture_output=True, text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    failed = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert proc.returncode == 0 and not failed, "\n".join(failed) or out
    hopper = [f for f in files if "__CUDA_ARCH_FEAT_SM90_ALL" in f.read_text()]  # also compiled for sm_90a
    assert hopper  # conv/wgmma.cu
    total = 2 * (len(files) + len(hopper))
    assert f"{total} of {total} compilations succeeded" in out
    for f in files:
        name = f.relative_to(REPO).as_posix()
        assert f"{name} [Dtype=half, sm_90]" in out and f"{name} [Dtype=bfloat16, sm_90]" in out, name
    for f in hopper:
        name = f.relative_to(REPO).as_posix()
        assert f"{name} [Dtype=half, sm_90a]" in out and f"{name} [Dtype=bfloat16, sm_90a]" in out, name


@pytest.mark.slow
def test_architecture_specific_code_is_compiled_for_its_architecture(tmp_path):
    """A file guarded by __CUDA_ARCH_FEAT_SM90_ALL (wgmma.cu) is compiled for sm_90a as well, where the
    guarded code is seen: an error there fails only that compilation."""
    body = ("__global__ void k(const int n, Dtype* y) {\n#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"
            "  asm volatile(\"wgmma.fence.sync.aligned;\\n\" ::: \"memory\");\n  {bad}\n#endif\n"
            "  CUDA_KERNEL_LOOP(i, n) { y[i] = 0; }\n}\n")
    good = tmp_path / "good.cu"
    good.write_text(body.replace("{bad}", ""))
    proc = run_tool("--paths", str(good), "--dtype", "float")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[Dtype=float, sm_90]" in proc.stdout and "[Dtype=float, sm_90a]" in proc.stdout
    bad = tmp_path / "bad.cu"
    bad.write_text(body.replace("{bad}", "no_such_identifier;"))
    proc = run_tool("--paths", str(bad), "--dtype", "float")
    assert proc.returncode == 1
    assert "ok   " in proc.stdout and "FAIL" in proc.stdout  # sm_90 skips the guarded code; sm_90a does not
    assert "failed for Dtype=float (sm_90a)" in proc.stderr
