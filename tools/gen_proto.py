#!/usr/bin/env python3
"""Regenerate ``pycaffe_lite/schema/caffe_pb2.py`` (and its type stub ``caffe_pb2.pyi``, which
mypy reads) from ``proto/caffe.proto``.

Usage::

    pip install "grpcio-tools>=1.74,<1.77"   # bundles protoc 31.x
    python tools/gen_proto.py

The generated module embeds a runtime-version check equal to the protoc
version that produced it, so protoc must not be newer than the oldest
protobuf runtime we support (``protobuf>=6.31``).  The script refuses to
write gencode newer than that.  Output is written to a temporary file in the
target directory and then atomically renamed into place.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = REPO_ROOT / "proto"
PROTO_FILE = PROTO_DIR / "caffe.proto"
OUT_FILE = REPO_ROOT / "pycaffe_lite" / "schema" / "caffe_pb2.py"

# Oldest protobuf runtime declared in setup.cfg; gencode must not be newer.
MIN_RUNTIME: tuple[int, int] = (6, 31)

_VERSION_RE = re.compile(
    r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*"
    r"(\d+),\s*(\d+),\s*(\d+),"
)


def gencode_version(source: str) -> tuple[int, int, int] | None:
    """Return the (major, minor, patch) runtime version a generated module demands."""
    match = _VERSION_RE.search(source)
    if match is None:
        return None
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def run_protoc(out_dir: Path) -> Path:
    """Run grpc_tools' bundled protoc on caffe.proto, writing caffe_pb2.py into out_dir."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "grpcio-tools is required: pip install 'grpcio-tools>=1.74,<1.77'"
        ) from exc
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(PROTO_FILE),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {PROTO_FILE}")
    return out_dir / "caffe_pb2.py"


def generate(out_file: Path = OUT_FILE, *, allow_newer: bool = False) -> tuple[int, int, int]:
    """Generate out_file from caffe.proto; return the gencode's runtime version."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gen_proto_") as tmp:
        generated = run_protoc(Path(tmp))
        source = generated.read_text(encoding="utf-8")
        stub = generated.with_suffix(".pyi").read_text(encoding="utf-8")
    version = gencode_version(source)
    if version is None:
        raise SystemExit("could not find the runtime version check in the generated code")
    if version[:2] > MIN_RUNTIME and not allow_newer:
        raise SystemExit(
            f"protoc emits gencode for protobuf {'.'.join(map(str, version))}, newer than the "
            f"oldest supported runtime {MIN_RUNTIME[0]}.{MIN_RUNTIME[1]}; install an older "
            "grpcio-tools (e.g. 'grpcio-tools>=1.74,<1.77', protoc 31.x)"
        )
    for text, target in ((source, out_file), (stub, out_file.with_suffix(".pyi"))):
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp_name, 0o666 & ~umask)  # mkstemp makes 0600 files
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    return version


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=OUT_FILE, help="output path (default: %(default)s)"
    )
    parser.add_argument(
        "--allow-newer",
        action="store_true",
        help="write gencode even if it requires a runtime newer than protobuf 6.31",
    )
    ns = parser.parse_args(argv)
    version = generate(ns.out, allow_newer=ns.allow_newer)
    print(f"wrote {ns.out} (gencode for protobuf runtime >= {'.'.join(map(str, version))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
