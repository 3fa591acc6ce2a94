"""Report import cycles among pycaffe-lite's modules (imports at any level: lazy ones and those
inside ``if TYPE_CHECKING:`` blocks count too, since a type-only import is still a dependency).

    python tools/check_imports.py        # exit 1 and list each cycle, if any

The built-in layers folder ``layers/`` is read under the package name it is installed as.
"""

from __future__ import annotations

import ast
import configparser
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs() -> dict[str, Path]:
    """Installed package name -> source folder, from setup.cfg (package_dir mappings honoured)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    mapping = {}
    for line in cfg["options"].get("package_dir", "").strip().splitlines():
        name, _, folder = line.partition("=")
        mapping[name.strip()] = ROOT / folder.strip()
    out = {}
    for name in cfg["options"]["packages"].split():
        out[name] = mapping.get(name, ROOT / name.replace(".", "/"))
    return out


def modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in package_dirs().items():
        for path in folder.glob("*.py"):
            mods[pkg if path.stem == "__init__" else f"{pkg}.{path.stem}"] = path
    return mods


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                add(sub if sub in known else mod)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def find_cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (each is a cycle)."""
    mods = modules()
    known = set(mods)
    graph = {m: sorted(imports_of(m, p, known)) for m, p in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for m in sorted(graph):
        if m not in index:
            strong(m)
    return out


def main() -> int:
    cycles = find_cycles()
    for comp in cycles:
        print("import cycle among: " + ", ".join(comp))
    print(f"{len(cycles)} import cycle(s)")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
