#!/usr/bin/env python3
"""Compile every CUDA kernel file with nvcc, for float and double, as the GPU backend would.

Each ``.cu`` file is wrapped exactly as :class:`pycaffe_lite.gpu.backend.KernelModule` hands it to
PyCUDA's ``SourceModule``: the backend ``PRELUDE`` (``Dtype`` and ``CUDA_KERNEL_LOOP``) followed by
the file, all inside ``extern "C" { ... }``, with the file's own folder and ``pycaffe_lite/gpu`` on
the include path. A ``#line`` directive makes nvcc report errors against the original file.

Usage::

    python tools/check_kernels.py                   # pycaffe_lite/**/*.cu and layers/*.cu
    python tools/check_kernels.py --arch sm_80
    python tools/check_kernels.py --paths layers/relu.cu some/dir

Exit status: 0 when everything compiles, 1 when any compilation fails, 2 when nvcc or the files
cannot be found. Needs no GPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from pycaffe_lite.gpu.backend import PRELUDE  # noqa: E402  (needs the repo on sys.path)

GPU_DIR = REPO_ROOT / "pycaffe_lite" / "gpu"
DTYPES = ("float", "double")


@dataclass
class Result:
    path: Path
    ctype: str
    ok: bool
    message: str


def default_files() -> list[Path]:
    """Every kernel file of the package: ``pycaffe_lite/**/*.cu`` and ``layers/*.cu``."""
    files = set((REPO_ROOT / "pycaffe_lite").rglob("*.cu")) | set((REPO_ROOT / "layers").glob("*.cu"))
    return sorted(files)


def collect(paths: list[str]) -> list[Path]:
    """Expand files and folders (searched recursively for ``*.cu``) into a sorted list."""
    files: set[Path] = set()
    for p in paths:
        path = Path(p).resolve()
        if path.is_dir():
            files |= set(path.rglob("*.cu"))
        elif path.is_file():
            files.add(path)
        else:
            raise FileNotFoundError(f"check_kernels: no such file or folder: {p}")
    return sorted(files)


def wrapped_source(path: Path, ctype: str) -> str:
    """What ``SourceModule`` compiles: extern "C" { PRELUDE + file }."""
    source = path.read_text()
    line_path = str(path).replace("\\", "/").replace('"', '\\"')
    body = PRELUDE.format(ctype=ctype) + f'#line 1 "{line_path}"\n' + source
    return 'extern "C" {\n' + body + "\n}\n"


def compile_one(nvcc: str, arch: str, path: Path, ctype: str, workdir: Path, extra: list[str]) -> Result:
    stem = f"{path.stem}_{abs(hash(str(path))) % 10**8}_{ctype}"
    src = workdir / f"{stem}.cu"
    try:
        src.write_text(wrapped_source(path, ctype))
    except OSError as exc:
        return Result(path, ctype, False, f"cannot read {path}: {exc}")
    cmd = [
        nvcc, "--cubin", f"-arch={arch}", "-O3",
        f"-I{path.parent}", f"-I{GPU_DIR}",
        *extra, "-o", str(workdir / f"{stem}.cubin"), str(src),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    message = (proc.stderr + proc.stdout).strip()
    return Result(path, ctype, proc.returncode == 0, message)


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_90", help="nvcc -arch value (default sm_90)")
    parser.add_argument("--paths", nargs="+", metavar="PATH",
                        help=".cu files or folders to check (default: every kernel file of the repo)")
    parser.add_argument("--jobs", "-j", type=int, default=2, help="parallel nvcc processes (default 2)")
    parser.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"), help="nvcc executable")
    parser.add_argument("--dtype", choices=DTYPES, action="append",
                        help="element type(s) to compile for (default: float and double)")
    parser.add_argument("--nvcc-flag", action="append", default=[], help="extra nvcc flag (repeatable)")
    args = parser.parse_args(argv)

    nvcc = shutil.which(args.nvcc)
    if nvcc is None:
        print(f"check_kernels: nvcc not found ('{args.nvcc}'); install the CUDA toolkit or set NVCC",
              file=sys.stderr)
        return 2
    try:
        files = collect(args.paths) if args.paths else default_files()
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not files:
        print("check_kernels: no .cu files found", file=sys.stderr)
        return 2
    ctypes = tuple(args.dtype) if args.dtype else DTYPES
    extra = list(args.nvcc_flag) + os.environ.get("PYCAFFE_LITE_NVCC_FLAGS", "").split()

    with tempfile.TemporaryDirectory(prefix="check_kernels_") as tmp:
        jobs = [(f, c) for f in files for c in ctypes]
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(lambda job: compile_one(nvcc, args.arch, job[0], job[1], Path(tmp), extra),
                                    jobs))

    failures = [r for r in results if not r.ok]
    for r in results:
        status = "ok  " if r.ok else "FAIL"
        print(f"{status} {rel(r.path)} [Dtype={r.ctype}, {args.arch}]")
    for r in failures:
        print(f"\n=== {rel(r.path)} failed for Dtype={r.ctype} ({args.arch}) ===\n{r.message}", file=sys.stderr)
    print(f"\n{len(results) - len(failures)} of {len(results)} compilations succeeded "
          f"({len(files)} file(s) x {len(ctypes)} dtype(s))")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
