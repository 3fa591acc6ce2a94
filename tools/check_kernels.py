#!/usr/bin/env python3
"""Compile every CUDA kernel file with nvcc, for float and double (or half, bfloat16), as the GPU backend would; with
``--calls``, check instead (no nvcc needed) that every Python call site names an existing kernel.

Each ``.cu`` file is wrapped exactly as :class:`pycaffe_lite.gpu.backend.KernelModule` hands it to
PyCUDA's ``SourceModule``: the backend ``prelude`` (``Dtype``, ``Mtype``, ``to_m``/``from_m``, ``CUDA_KERNEL_LOOP``) followed by
the file, all inside ``extern "C" { ... }``, with the file's own folder and ``pycaffe_lite/gpu`` on
the include path. A ``#line`` directive makes nvcc report errors against the original file.

The call-site check reads the Python sources (AST) for ``backend.kernel(PATH, NAME, dtype)``,
``backend.module(PATH, dtype).get(NAME)`` (also through a variable holding the module) and module
helpers that forward a parameter as NAME (``def _k(name, dtype): return backend.kernel(KERNELS,
name, dtype)``, called as ``_k("set_kernel", dt)``). PATH is a module constant or expression
``Path(__file__).with_suffix(".cu")``, ``.with_name("x.cu")`` or ``.parent / "x.cu"``; NAME a string
literal or an f-string whose fields are module constants (strings or tuples/lists/sets of strings),
loop variables over such, or anything else (then at least one kernel must match). The kernels of
PATH come from :func:`pycaffe_lite.gpu.signatures.parse_signatures`. Reported: unknown kernel names,
unknown .cu files, and leftover argument-type strings (a 4th argument to ``backend.kernel``).

Usage::

    python tools/check_kernels.py                   # pycaffe_lite/**/*.cu and layers/*.cu
    python tools/check_kernels.py --arch sm_80
    python tools/check_kernels.py --dtype half   # one storage type (default: float, double, half, bfloat16)
    python tools/check_kernels.py --paths layers/relu.cu some/dir
    python tools/check_kernels.py --calls           # pycaffe_lite/**/*.py and layers/*.py
    python tools/check_kernels.py --calls --paths layers/relu.py

Exit status: 0 when everything compiles (every call site checks out), 1 when any compilation (call
site) fails, 2 when nvcc or the files cannot be found. Needs no GPU.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
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

import numpy as np  # noqa: E402

from pycaffe_lite.gpu.backend import prelude  # noqa: E402  (needs the repo on sys.path)
from pycaffe_lite.gpu.signatures import parse_signatures  # noqa: E402

GPU_DIR = REPO_ROOT / "pycaffe_lite" / "gpu"
# --dtype name -> the storage dtype the backend compiles for (bfloat16: uint16 bit patterns)
STORAGE = {"float": np.float32, "double": np.float64, "half": np.float16, "bfloat16": np.uint16}
DTYPES = ("float", "double", "half", "bfloat16")  # the default: every storage type the backend compiles for


@dataclass
class Result:
    path: Path
    ctype: str
    ok: bool
    message: str
    arch: str


def default_files() -> list[Path]:
    """Every kernel file of the package: ``pycaffe_lite/**/*.cu`` and ``layers/*.cu``."""
    files = set((REPO_ROOT / "pycaffe_lite").rglob("*.cu")) | set((REPO_ROOT / "layers").glob("*.cu"))
    return sorted(files)


def collect(paths: list[str], pattern: str = "*.cu") -> list[Path]:
    """Expand files and folders (searched recursively for ``pattern``) into a sorted list."""
    files: set[Path] = set()
    for p in paths:
        path = Path(p).resolve()
        if path.is_dir():
            files |= set(path.rglob(pattern))
        elif path.is_file():
            files.add(path)
        else:
            raise FileNotFoundError(f"check_kernels: no such file or folder: {p}")
    return sorted(files)


def wrapped_source(path: Path, ctype: str) -> str:
    """What ``SourceModule`` compiles: extern "C" { prelude + file } (``ctype``: a key of STORAGE)."""
    source = path.read_text()
    line_path = str(path).replace("\\", "/").replace('"', '\\"')
    body = prelude(STORAGE[ctype]) + f'#line 1 "{line_path}"\n' + source
    return 'extern "C" {\n' + body + "\n}\n"


# Code guarded by one of these macros compiles only for its architecture (the backend compiles such
# files with that ``arch``, as conv/wgmma.py does): a file that uses one is compiled for it too.
ARCH_FEATURES = {"__CUDA_ARCH_FEAT_SM90_ALL": "sm_90a"}


def arches(path: Path, arch: str) -> list[str]:
    """``arch``, then the architecture of each ARCH_FEATURES macro ``path`` uses (unreadable: ``arch``)."""
    try:
        text = path.read_text()
    except OSError:
        return [arch]
    return [arch] + [a for macro, a in ARCH_FEATURES.items() if macro in text and a != arch]


def compile_one(nvcc: str, arch: str, path: Path, ctype: str, workdir: Path, extra: list[str]) -> Result:
    stem = f"{path.stem}_{abs(hash(str(path))) % 10**8}_{ctype}_{arch}"
    src = workdir / f"{stem}.cu"
    try:
        src.write_text(wrapped_source(path, ctype))
    except OSError as exc:
        return Result(path, ctype, False, f"cannot read {path}: {exc}", arch)
    cmd = [
        nvcc, "--cubin", f"-arch={arch}", "-O3",
        f"-I{path.parent}", f"-I{GPU_DIR}",
        *extra, "-o", str(workdir / f"{stem}.cubin"), str(src),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    message = (proc.stderr + proc.stdout).strip()
    return Result(path, ctype, proc.returncode == 0, message, arch)


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


# -- call sites (pure Python) ------------------------------------------------------------------
@dataclass
class Finding:
    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{rel(self.path)}:{self.line}: {self.message}"


@dataclass
class Wrapper:
    """A module function that forwards parameter ``name_index`` as the kernel name of ``cu``."""

    cu: Path | None
    name_index: int
    name_param: str
    argtypes_index: int | None  # parameter forwarded as backend.kernel's 4th argument


def default_py_files() -> list[Path]:
    return sorted(set((REPO_ROOT / "pycaffe_lite").rglob("*.py")) | set((REPO_ROOT / "layers").glob("*.py")))


def _is_file_dunder(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Path"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id == "__file__")


def _str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _module_path(module: str, level: int, here: Path) -> Path | None:
    """Where ``from <level dots><module> import ...`` in ``here`` points (a folder, or a file without .py)."""
    if level:
        base = here.parent
        for _ in range(level - 1):
            base = base.parent
    elif module == "pycaffe_lite.layers" or module.startswith("pycaffe_lite.layers."):
        base, module = REPO_ROOT / "layers", module[len("pycaffe_lite.layers"):].lstrip(".")
    elif module == "pycaffe_lite" or module.startswith("pycaffe_lite."):
        base = REPO_ROOT
    else:
        return None
    return base.joinpath(*module.split(".")) if module else base


_CU_CONSTANTS: dict[Path, dict[str, Path]] = {}


def _module_cu_constants(path: Path) -> dict[str, Path]:
    """Module-level names of ``path`` bound to a .cu path expression."""
    if path not in _CU_CONSTANTS:
        consts: dict[str, Path] = {}
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.Assign):
                cu = _cu_path(node.value, path, consts)
                for t in node.targets:
                    if isinstance(t, ast.Name) and cu is not None:
                        consts[t.id] = cu
        _CU_CONSTANTS[path] = consts
    return _CU_CONSTANTS[path]


def _cu_path(node: ast.AST, here: Path, consts: dict[str, Path]) -> Path | None:
    """The .cu file a path expression names, when it is one of the known patterns."""
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return consts.get(f"{node.value.id}.{node.attr}")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_file_dunder(node.func.value):
        arg = _str(node.args[0]) if len(node.args) == 1 else None
        if arg is not None and node.func.attr == "with_suffix":
            return here.with_suffix(arg)
        if arg is not None and node.func.attr == "with_name":
            return here.with_name(arg)
    if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.left, ast.Attribute)
            and node.left.attr == "parent" and _is_file_dunder(node.left.value) and _str(node.right)):
        return here.parent / str(_str(node.right))
    return None


def _is_backend_call(node: ast.AST, attr: str) -> bool:
    """``backend.<attr>(...)`` (or ``<attr>(...)`` imported from the backend)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr == attr and isinstance(f.value, ast.Name) and f.value.id == "backend"
    return isinstance(f, ast.Name) and f.id == attr


def _string_values(node: ast.AST, strings: dict[str, list[str]]) -> list[str] | None:
    """The strings a constant expression can be (a literal, a tuple/list/set of them, a dict's keys)."""
    if isinstance(node, ast.Name):
        return strings.get(node.id)
    if _str(node) is not None:
        return [str(_str(node))]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        vals = [_str(e) for e in node.elts]
        return [v for v in vals if v is not None] if all(v is not None for v in vals) else None
    if isinstance(node, ast.Dict):
        keys = [_str(k) for k in node.keys if k is not None]
        return [k for k in keys if k is not None] if all(k is not None for k in keys) else None
    return None


def _name_patterns(node: ast.AST, strings: dict[str, list[str]]) -> tuple[list[str], bool] | None:
    """(kernel names, exact) for a literal or an f-string; names are regexes when not exact."""
    if _str(node) is not None:
        return [str(_str(node))], True
    if not isinstance(node, ast.JoinedStr):
        return None
    parts: list[list[str]] = [[""]]
    exact = True
    for piece in node.values:
        if isinstance(piece, ast.Constant):
            options = [re.escape(str(piece.value))]
        else:
            assert isinstance(piece, ast.FormattedValue)
            known = _string_values(piece.value, strings)
            if known is None:
                exact, options = False, [".+"]
            else:
                options = [re.escape(k) for k in known]
        parts = [[p + o for p in parts[0] for o in options]]
    names = parts[0]
    return (names, False) if not exact else ([re.sub(r"\\(.)", r"\1", n) for n in names], True)


class _CallScanner:
    def __init__(self, path: Path, tree: ast.Module) -> None:
        self.path = path
        self.findings: list[Finding] = []
        self.checked = 0
        self.cu: dict[str, Path] = {}
        self.strings: dict[str, list[str]] = {}
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        cu = _cu_path(node.value, path, self.cu)
                        if cu is not None:
                            self.cu[t.id] = cu
                        vals = _string_values(node.value, self.strings)
                        if vals is not None:
                            self.strings[t.id] = vals
        self._imports(tree)
        self.wrappers = {fn.name: w for fn in tree.body if isinstance(fn, ast.FunctionDef)
                         and (w := self._wrapper(fn)) is not None}
        self.tree = tree

    def _imports(self, tree: ast.Module) -> None:
        """``from . import mod`` (then ``mod.KERNELS``) and ``from .mod import KERNELS [as X]``."""
        for node in tree.body:
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _module_path(node.module or "", node.level, self.path)
            for alias in node.names:
                as_name = alias.asname or alias.name
                sub = base / f"{alias.name}.py" if base is not None else None
                if sub is not None and sub.is_file():
                    for const, cu in _module_cu_constants(sub).items():
                        self.cu[f"{as_name}.{const}"] = cu
                elif base is not None and base.with_suffix(".py").is_file():
                    found = _module_cu_constants(base.with_suffix(".py")).get(alias.name)
                    if found is not None:
                        self.cu[as_name] = found

    def _wrapper(self, fn: ast.FunctionDef) -> Wrapper | None:
        params = [a.arg for a in fn.args.args]
        for node in ast.walk(fn):
            if _is_backend_call(node, "kernel") and len(node.args) >= 2:  # type: ignore[attr-defined]
                args = node.args  # type: ignore[attr-defined]
                if isinstance(args[1], ast.Name) and args[1].id in params:
                    extra = args[3] if len(args) > 3 else None
                    return Wrapper(_cu_path(args[0], self.path, self.cu), params.index(args[1].id), args[1].id,
                                   params.index(extra.id) if isinstance(extra, ast.Name) and extra.id in params
                                   else None)
        return None

    def report(self, node: ast.AST, message: str) -> None:
        self.findings.append(Finding(self.path, getattr(node, "lineno", 0), message))

    def check_name(self, node: ast.AST, cu: Path | None, name_node: ast.AST, strings: dict[str, list[str]],
                   what: str) -> None:
        patterns = _name_patterns(name_node, strings)
        if patterns is None:
            return  # a name computed at run time: nothing to check statically
        if cu is None:
            self.report(node, f"{what}: cannot tell which .cu file ({ast.unparse(node)[:80]})")
            return
        if not cu.is_file():
            self.report(node, f"{what}: kernel file {rel(cu)} does not exist")
            return
        self.checked += 1
        kernels = parse_signatures(cu.read_text())
        names, exact = patterns
        known = ", ".join(sorted(kernels)) or "none"
        if exact:
            for name in names:
                if name not in kernels:
                    self.report(node, f"kernel '{name}' is not in {rel(cu)} (its kernels: {known})")
        elif not any(re.fullmatch(p, k) for p in names for k in kernels):
            self.report(node, f"no kernel of {rel(cu)} matches {ast.unparse(name_node)} (its kernels: {known})")

    def scan(self) -> None:
        self._scan(self.tree, dict(self.strings), {})

    def _scan(self, node: ast.AST, strings: dict[str, list[str]], modules: dict[str, Path | None]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            strings, modules = dict(strings), {}
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            vals = _string_values(node.iter, strings)
            if vals is not None:
                strings = {**strings, node.target.id: vals}
        if isinstance(node, ast.Assign) and _is_backend_call(node.value, "module") and node.value.args:  # type: ignore[attr-defined]
            for t in node.targets:
                if isinstance(t, ast.Name):
                    modules[t.id] = _cu_path(node.value.args[0], self.path, self.cu)  # type: ignore[attr-defined]
        if isinstance(node, ast.Call):
            self._call(node, strings, modules)
        for child in ast.iter_child_nodes(node):
            self._scan(child, strings, modules)

    def _call(self, node: ast.Call, strings: dict[str, list[str]], modules: dict[str, Path | None]) -> None:
        f = node.func
        if _is_backend_call(node, "kernel") and len(node.args) >= 2:
            if len(node.args) > 3 or any(k.arg == "argtypes" for k in node.keywords):
                self.report(node, "leftover argument-type string: backend.kernel takes (path, name, dtype); "
                            "kinds come from the __global__ signature")
            name = node.args[1]
            if not (isinstance(name, ast.Name) and self._in_wrapper_param(name)):
                self.check_name(node, _cu_path(node.args[0], self.path, self.cu), name, strings, "backend.kernel")
        elif isinstance(f, ast.Attribute) and f.attr == "get" and len(node.args) == 1:
            target = f.value
            if _is_backend_call(target, "module") and target.args:  # type: ignore[attr-defined]
                self.check_name(node, _cu_path(target.args[0], self.path, self.cu), node.args[0],  # type: ignore[attr-defined]
                                strings, "backend.module")
            elif isinstance(target, ast.Name) and target.id in modules:
                self.check_name(node, modules[target.id], node.args[0], strings, "backend.module")
        elif isinstance(f, ast.Name) and f.id in self.wrappers:
            w = self.wrappers[f.id]
            if len(node.args) > w.name_index:
                self.check_name(node, w.cu, node.args[w.name_index], strings, f.id)
            if w.argtypes_index is not None and len(node.args) > w.argtypes_index:
                self.report(node, f"leftover argument-type string passed through {f.id}() to backend.kernel")

    def _in_wrapper_param(self, name: ast.Name) -> bool:
        return any(w.name_param == name.id for w in self.wrappers.values())


def check_calls(files: list[Path]) -> tuple[list[Finding], int]:
    """Findings over ``files`` and how many call sites were checked."""
    findings: list[Finding] = []
    checked = 0
    for path in files:
        try:
            tree = ast.parse(path.read_text(), str(path))
        except SyntaxError as exc:
            findings.append(Finding(path, exc.lineno or 0, f"cannot parse: {exc.msg}"))
            continue
        scanner = _CallScanner(path, tree)
        scanner.scan()
        findings += scanner.findings
        checked += scanner.checked
    return findings, checked


def main_calls(paths: list[str] | None) -> int:
    try:
        files = collect(paths, "*.py") if paths else default_py_files()
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    findings, checked = check_calls(files)
    for f in findings:
        print(f)
    print(f"\n{checked} kernel call site(s) checked in {len(files)} file(s); {len(findings)} problem(s)")
    return 1 if findings else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_90", help="nvcc -arch value (default sm_90)")
    parser.add_argument("--paths", nargs="+", metavar="PATH",
                        help=".cu (with --calls: .py) files or folders to check (default: the whole repo)")
    parser.add_argument("--jobs", "-j", type=int, default=2, help="parallel nvcc processes (default 2)")
    parser.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"), help="nvcc executable")
    parser.add_argument("--dtype", choices=tuple(STORAGE), action="append",
                        help="storage type(s) to compile for (default: float and double; half and bfloat16 "
                        "compute in float)")
    parser.add_argument("--nvcc-flag", action="append", default=[], help="extra nvcc flag (repeatable)")
    parser.add_argument("--calls", action="store_true",
                        help="check Python call sites against the kernels' signatures instead (no nvcc)")
    args = parser.parse_args(argv)
    if args.calls:
        return main_calls(args.paths)

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
        jobs = [(f, c, a) for f in files for a in arches(f, args.arch) for c in ctypes]
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(lambda job: compile_one(nvcc, job[2], job[0], job[1], Path(tmp), extra), jobs))

    failures = [r for r in results if not r.ok]
    for r in results:
        status = "ok  " if r.ok else "FAIL"
        print(f"{status} {rel(r.path)} [Dtype={r.ctype}, {r.arch}]")
    for r in failures:
        print(f"\n=== {rel(r.path)} failed for Dtype={r.ctype} ({r.arch}) ===\n{r.message}", file=sys.stderr)
    extra_arch = len(results) - len(files) * len(ctypes)
    print(f"\n{len(results) - len(failures)} of {len(results)} compilations succeeded "
          f"({len(files)} file(s) x {len(ctypes)} dtype(s)"
          + (f", {extra_arch // len(ctypes)} also for its architecture-specific code" if extra_arch else "") + ")")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
