"""The package's shape: no import cycles (tools/check_imports.py) and layer modules that import only
family bases and Caffe's hierarchy. (.ci/run also runs tools/check_kernels.py --calls.)"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_no_import_cycles():
    assert _tool("check_imports").find_cycles() == []


@pytest.mark.slow
def test_layer_modules_import_only_family_bases_and_caffes_hierarchy():
    bases = {"neuron_layer", "loss_layer", "view_layer"}
    allowed = {("deconvolution", "convolution"), ("scale", "bias"), ("softmax_loss", "softmax"),
               ("infogain_loss", "softmax_loss"),
               # the forks' depthwise types are Convolutions; Pooling's general (N-D, STOCHASTIC) path beside it
               ("depthwise_convolution", "convolution"), ("convolution_depthwise", "depthwise_convolution"),
               ("pooling", "pooling_nd"),
               ("rnn", "recurrent"), ("lstm", "recurrent")}  # BVLC's RecurrentLayer family
    modules = {p.stem for p in (ROOT / "layers").glob("*.py")}
    found = set()
    for path in (ROOT / "layers").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in modules - bases:
                found.add((path.stem, node.module))
    assert found <= allowed, found - allowed


# -- the floor plan: which wing may import which (docs/architecture.md has the same table) ----------
CORE = {"errors", "config", "common", "blob", "synced_memory", "layer", "fillers", "memcheck", "optional", "durable",
        "version", "glog", "net_graph", "bbox", "precision", "threads"}  # bbox: the SSD box maths and kernels
MAY_IMPORT = {  # wing -> what of the package it may import besides itself (every wing: the schema)
    "schema": {"errors"},  # generated caffe_pb2 and the blob value formats: the lowest floor
    "gpu": {"errors", "config"},
    "conv": {"errors", "config", "version", "gpu"},
    "proto": {"errors", "optional", "durable", "net_graph"},
    "data": CORE | {"gpu", "proto"},
    "testing": CORE | {"gpu", "proto"},
    "runtime": CORE | {"python_layer", "gpu", "conv", "proto"},
    "layers": CORE | {"python_layer", "io", "net_spec", "gpu", "conv", "proto", "data"},  # net_spec: caffe.layers.X
    "solvers": CORE | {"net", "net_builder", "gpu", "proto", "data", "runtime"},  # drives the executor
    "parallel": CORE | {"net", "gpu", "proto", "solvers"},
    "onnx": CORE | {"io", "proto"},  # walks a built Net it is given; never imports net or the runtime
}
EXCEPTIONS = {  # (module, import) the table does not allow, each with its reason
    # BVLC's RecurrentLayer builds and runs an unrolled net of its own (a NetGraph, never pycaffe's Net)
    ("pycaffe_lite.layers.recurrent", "pycaffe_lite.net_builder"),
    ("pycaffe_lite.layers.recurrent", "pycaffe_lite.runtime.executor"),
}
WINGS = {"schema", "gpu", "conv", "proto", "data", "testing", "runtime", "layers", "solvers", "parallel", "commands", "onnx"}


@functools.cache
def _import_graph() -> dict[str, set[str]]:
    tool = _tool("check_imports")
    mods = tool.modules()
    return {name: tool.imports_of(name, path, set(mods)) for name, path in mods.items()}


def _place(module: str) -> str:
    """``pycaffe_lite.conv.engines`` -> ``conv``; ``pycaffe_lite.net`` -> ``net``; the package -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.slow
def test_each_wing_imports_only_what_the_floor_plan_allows():
    wrong = set()
    for name, targets in _import_graph().items():
        wing = _place(name)
        if wing not in MAY_IMPORT or (len(name.split(".")) == 2 and wing in WINGS and wing != "layers"):
            continue  # the root's modules and a wing's __init__ are not wings' members
        for target in targets:
            if _place(target) not in MAY_IMPORT[wing] | {wing, "", "schema"} and (name, target) not in EXCEPTIONS:
                wrong.add(f"{name} -> {target}")
    assert not wrong, sorted(wrong)


# -- the root's modules: Caffe's core at the bottom, the builder above it, pycaffe's face on top -------
FACE = {"net", "io", "draw", "net_spec", "params", "classifier", "detector", "coord_map", "python_layer", "vectors",
        "timer", "threads", "__main__"}
ROOT_MAY_IMPORT = {
    **{m: CORE | {"gpu", "python_layer", "schema"} for m in CORE},  # never the file readers (proto/)
    "net_builder": CORE | {"proto", "schema", "conv"},  # builds a NetGraph (conv: the CPU scratch a net holds)
    **{m: CORE | FACE | {"net_builder", "schema", "gpu", "conv", "proto", "runtime", "layers", "onnx", "data"}
       for m in FACE},
}
ROOT_MAY_IMPORT["__main__"] = {"commands"}


def test_every_root_module_is_placed_on_the_floor_plan():
    root = {p.stem for p in (ROOT / "pycaffe_lite").glob("*.py")} - {"__init__"}
    assert root == set(ROOT_MAY_IMPORT), sorted(root ^ set(ROOT_MAY_IMPORT))


@pytest.mark.slow
def test_root_modules_import_only_what_their_floor_allows():
    """Core modules import core, the device runtime and the schema (never the file readers in
    proto/); the builder adds the file readers; pycaffe's face may use everything below the solvers."""
    wrong = set()
    for name, targets in _import_graph().items():
        parts = name.split(".")
        if parts[0] != "pycaffe_lite" or len(parts) != 2 or parts[1] not in ROOT_MAY_IMPORT:
            continue
        wrong |= {f"{name} -> {t}" for t in targets if _place(t) not in ROOT_MAY_IMPORT[parts[1]] | {""}}
    assert not wrong, sorted(wrong)


@pytest.mark.slow
def test_nothing_below_solvers_imports_them():
    below = {"gpu", "conv", "proto", "data", "testing", "runtime", "layers"} | CORE | {"net"}
    wrong = {f"{n} -> {t}" for n, ts in _import_graph().items() for t in ts
             if _place(t) == "solvers" and _place(n) in below}
    assert not wrong, sorted(wrong)


def test_the_runtime_reads_the_net_graph_not_nets_private_names():
    """Executor, fusions, memory plans, weight files, snapshots and solvers take a NetGraph (public
    fields); pycaffe's underscore names on Net are for users' scripts."""
    found = []
    for wing in ("runtime", "proto", "solvers", "parallel", "data", "conv"):
        for path in (ROOT / "pycaffe_lite" / wing).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                        and isinstance(node.value, ast.Name | ast.Attribute)
                        and (node.value.id if isinstance(node.value, ast.Name) else node.value.attr) in ("net", "graph")):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert not found, found


def test_the_package_root_holds_at_most_30_modules():
    root = [p.name for p in (ROOT / "pycaffe_lite").glob("*.py")]
    assert len(root) <= 30, sorted(root)


@pytest.mark.slow
def test_a_plain_clone_imports_from_source(tmp_path):
    """``PYTHONPATH=. python -c "import pycaffe_lite"`` in a clone that was never pip-installed: the
    package finds ``layers/`` beside it as ``pycaffe_lite.layers``."""
    for folder in ("pycaffe_lite", "layers"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import pycaffe_lite as c, pathlib; print(pathlib.Path(c.__file__).parent.parent, "
            "pathlib.Path(c.layers.__path__[0]).parent, len(c.layer_type_list()))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": "."}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    package_home, layers_home, types = out.stdout.split()
    assert Path(package_home) == Path(layers_home) == tmp_path and int(types) > 50


def test_the_runtime_matches_no_layer_by_its_type_string():
    """Fusions and memory plans ask layers what they are (Layer's declarations), so a renamed
    attribute or a fork's subclass cannot silently disable one."""
    found = []
    for path in (ROOT / "pycaffe_lite" / "runtime").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                    isinstance(side, ast.Attribute) and side.attr == "type" for side in (node.left, *node.comparators)):
                found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("vars", "getattr") \
                    and "layer" in ast.unparse(node.args[0]):  # reflection over a layer's attributes
                found.append(f"{path.name}:{node.lineno} {node.func.id}()")
    assert not found, found


def test_test_modules_have_unique_basenames():
    """The test folders are no packages (pytest's rootdir import mode), so two test files with one
    basename make the whole run fail to collect."""
    seen: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}
