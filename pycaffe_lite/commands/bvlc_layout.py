"""``pycaffe-lite bvlc-layout DIR [--force]`` (also ``caffe bvlc-layout DIR``): BVLC's build paths
in a BVLC checkout, pointing at pycaffe-lite's commands, so that BVLC's shell recipes run unchanged.

In ``DIR`` it writes ``build/tools/<tool>`` and ``build/tools/<tool>.bin`` for ``caffe`` and each of
BVLC's tools that pycaffe-lite implements (``convert_imageset``, ``compute_image_mean``,
``extract_features``, ``upgrade_*``), and the example converters that BVLC builds beside its
examples, ``build/examples/<example>/<tool>.bin`` (and without ``.bin``, CMake's name):
``mnist/convert_mnist_data``, ``cifar10/convert_cifar_data``, ``siamese/convert_mnist_siamese_data``.
Each is a small ``sh`` script that runs this Python interpreter on pycaffe-lite's ``caffe`` front
end (:func:`pycaffe_lite.commands.caffe_cli.run`) with the tool's name, so BVLC's command lines,
gflags syntax included, work as they do in BVLC.

Running it again rewrites its own scripts (they carry a marker line) and changes nothing else. A
file that is not one of them (a real BVLC binary, or a link to one) is refused with an error naming
it, unless ``--force``: then it is renamed to ``<name>.bvlc`` first, never deleted. Files are written
under a temporary name and renamed into place.
"""

from __future__ import annotations

import argparse
import os
import shlex
import stat
import sys
from pathlib import Path

from .. import durable
from ..errors import CaffeError
from . import flag

NAME = "bvlc-layout"
HELP = "make BVLC's build/tools and build/examples binaries in a BVLC checkout run pycaffe-lite's commands"

MARKER = "# pycaffe-lite bvlc-layout shim"
TOOLS = ("caffe", "compute_image_mean", "convert_imageset", "extract_features", "upgrade_net_proto_binary",
         "upgrade_net_proto_text", "upgrade_solver_proto_text")
EXAMPLES = (("mnist", "convert_mnist_data"), ("cifar10", "convert_cifar_data"),
            ("siamese", "convert_mnist_siamese_data"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="the BVLC checkout (its build/ is made or updated)")
    flag(parser, "force", action="store_true",
         help="replace files that are not pycaffe-lite's scripts, keeping each as <name>.bvlc")


def shims() -> list[tuple[Path, str]]:
    """(path relative to the checkout, program) of every script the layout holds."""
    out = []
    for tool in TOOLS:
        out += [(Path("build/tools") / tool, tool), (Path("build/tools") / f"{tool}.bin", tool)]
    for example, tool in EXAMPLES:
        base = Path("build/examples") / example
        out += [(base / f"{tool}.bin", tool), (base / tool, tool)]
    return out


def shim_text(program: str) -> str:
    """The ``sh`` script that runs ``program`` (``caffe`` or a tool) with the script's arguments."""
    package_root = Path(__file__).resolve().parents[2]  # where ``import pycaffe_lite`` finds this copy
    code = f"import sys; from pycaffe_lite.commands.caffe_cli import run; sys.exit(run(sys.argv[1:], {program!r}))"
    return (f"#!/bin/sh\n{MARKER}: BVLC's {program}, run by pycaffe-lite (pycaffe-lite bvlc-layout)\n"
            f"PYTHONPATH=\"${{PYTHONPATH:+$PYTHONPATH:}}\"{shlex.quote(str(package_root))}\n"
            f"export PYTHONPATH\n"
            f"exec {shlex.quote(sys.executable)} -c {shlex.quote(code)} \"$@\"\n")


def is_shim(path: Path) -> bool:
    """Whether ``path`` is a regular file written by this command."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(512)
    except OSError:
        return False
    return MARKER.encode() in head


def _write(path: Path, text: str) -> None:
    tmp = durable.write_temp(path, text.encode())
    try:
        tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    durable.fsync_dir(path.parent)


def make_layout(root: Path, force: bool = False) -> list[tuple[Path, str]]:
    """Write the scripts into the checkout ``root``; returns (path, what happened) per script.
    Raises CaffeError naming the first file that is not ours (without ``force``), before writing any."""
    if not root.is_dir():
        raise CaffeError(f"bvlc-layout: {root} is not a folder (give the BVLC checkout)")
    planned = [(root / rel, program) for rel, program in shims()]
    foreign = [p for p, _ in planned if (p.exists() or p.is_symlink()) and not is_shim(p)]
    if foreign and not force:
        raise CaffeError(f"bvlc-layout: {foreign[0]} exists and is not a pycaffe-lite script (a BVLC build?); "
                         f"{len(foreign)} such file(s) in all. Use --force to replace them (each is kept as "
                         "<name>.bvlc)")
    for p in foreign:
        backup = p.with_name(p.name + ".bvlc")
        if backup.exists() or backup.is_symlink():
            raise CaffeError(f"bvlc-layout: cannot keep {p} as {backup}: that name is taken")
    done = []
    for path, program in planned:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = shim_text(program)
        if path in foreign:
            backup = path.with_name(path.name + ".bvlc")
            target = os.readlink(path) if path.is_symlink() else None
            if target is not None and not os.path.isabs(target) and path.parent / target in foreign:
                os.symlink(target + ".bvlc", backup)  # a link to a file also kept: link to its new name
                path.unlink()
            else:
                os.replace(path, backup)
            what = f"kept the old file as {backup.name}"
        elif path.exists():
            if path.read_text() == text:
                done.append((path, "up to date"))
                continue
            what = "updated"
        else:
            what = "created"
        _write(path, text)
        done.append((path, what))
    return done


def run(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if not (root / "examples").is_dir() and not (root / "Makefile").exists():
        print(f"bvlc-layout: note: {root} has neither examples/ nor a Makefile; is it a BVLC checkout?",
              file=sys.stderr)
    for path, what in make_layout(root, args.force):
        print(f"{path}: {what}")
    return 0
