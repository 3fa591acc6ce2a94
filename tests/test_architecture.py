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
               ("infogain_loss", "softmax_loss"), ("rnn", "recurrent"), ("lstm", "recurrent")}
    modules = {p.stem for p in (ROOT / "layers").glob("*.py")}
    found = set()
    for path in (ROOT / "layers").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in modules - bases:
                found.add((path.stem, node.module))
    assert found <= allowed, found - allowed
