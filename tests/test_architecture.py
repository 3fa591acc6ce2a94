"""The package's shape: no import cycles (tools/check_imports.py) and layer modules that import only
family bases and Caffe's hierarchy. (.ci/run also runs tools/check_kernels.py --calls.)"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_cycles():
    assert _tool("check_imports").find_cycles() == []


def test_layer_modules_import_only_family_bases_and_caffes_hierarchy():
    bases = {"neuron_layer", "loss_layer", "view_layer"}
    allowed = {("deconvolution", "convolution"), ("scale", "bias"), ("softmax_loss", "softmax"),
               ("infogain_loss", "softmax_loss")}
    modules = {p.stem for p in (ROOT / "layers").glob("*.py")}
    found = set()
    for path in (ROOT / "layers").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in modules - bases:
                found.add((path.stem, node.module))
    assert found <= allowed, found - allowed


def _package_imports(folder: Path) -> dict[str, set[str]]:
    """Module file -> the pycaffe_lite modules it imports (any level: lazy and type-only imports
    count), relative imports resolved."""
    out: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        package = "pycaffe_lite." + ".".join(path.relative_to(ROOT / "pycaffe_lite").parent.parts)
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] == "pycaffe_lite")
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "pycaffe_lite":
                    continue
                if node.module is None or target in ("pycaffe_lite.conv", "pycaffe_lite.gpu"):  # from . import x
                    found.update(f"{target}.{a.name}" for a in node.names)
                else:
                    found.add(target)
        out[path.name] = found
    return out


def _outside(imports: dict[str, set[str]], allowed: tuple[str, ...]) -> dict[str, set[str]]:
    def ok(module: str) -> bool:
        return any(module == a or module.startswith(a + ".") for a in allowed)
    return {f: bad for f, mods in imports.items() if (bad := {m for m in mods if not ok(m)})}


def test_conv_imports_only_the_gpu_runtime_and_leaves():
    """conv/ (the convolution family) sits on gpu/: of the package it imports only conv.*, gpu.*,
    errors and version (autotune files record the code version)."""
    imports = _package_imports(ROOT / "pycaffe_lite" / "conv")
    assert "engines.py" in imports and any("pycaffe_lite.gpu.backend" in m for m in imports.values())
    allowed = ("pycaffe_lite.conv", "pycaffe_lite.gpu", "pycaffe_lite.errors", "pycaffe_lite.version")
    assert _outside(imports, allowed) == {}


def test_gpu_imports_nothing_of_the_package_but_errors():
    imports = _package_imports(ROOT / "pycaffe_lite" / "gpu")
    assert any("pycaffe_lite.errors" in m for m in imports.values())
    assert _outside(imports, ("pycaffe_lite.gpu", "pycaffe_lite.errors")) == {}
