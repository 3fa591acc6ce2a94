"""The convolution autotune's choices on disk, so a deployment does not re-tune at start-up.

A JSON file (``FORMAT_VERSION`` 1)::

    {"format": "pycaffe-lite conv autotune", "format_version": 1, "code": "0.1.0+3f2a...",
     "entries": [{"device": {"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]},
                  "problem": {"num": 32, "channels": 64, "height": 56, "width": 56, "num_output": 64,
                              "group": 1, "kernel": [3, 3], "pad": [1, 1], "stride": [1, 1],
                              "dilation": [1, 1], "dtype": "<f4"},
                  "bias": true, "candidates": ["gemm", "implicit-64x128", ...], "tf32": false,
                  "choice": {"forward": "winograd", "backward_data": "winograd", "backward_weight": "gemm"},
                  "timings": [["forward", "gemm", 0.41], ...]}]}

An entry applies only to the same device model (name and compute capability), problem (every
:class:`ConvProblem` field), bias, candidate set (the engines that support the problem among those
the layer's ``engine`` field allows) and TF32 mode. ``code`` names the code that measured it: the
package version and a digest of the GPU sources (:func:`code_version`); a file of another format
version or other code is stale: reading it warns and yields nothing, writing replaces it.
:func:`write` merges with the entries already in the file (ours win on equal keys) and goes
through a temporary file renamed over the target, so a crash never leaves a truncated file.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import operator
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CaffeError
from ..version import __version__
from .problem import ConvProblem

FORMAT = "pycaffe-lite conv autotune"
FORMAT_VERSION = 2  # 2: entries record the timing method (graph or wall)
ENV = "PYCAFFE_LITE_AUTOTUNE_CACHE"  # a file loaded at the first choice and saved after new tunings

Device = tuple[str, tuple[int, int]]  # (name, compute capability)
Key = tuple[ConvProblem, bool, tuple[str, ...], bool, Device, str]  # problem, bias, candidates, TF32, device, timing
Picks = tuple[str, str, str]  # the engine for forward, backward_data, backward_weight
Timings = tuple[tuple[str, str, float], ...]  # (pass, engine, ms)

log = logging.getLogger("pycaffe_lite")
_FIELDS = tuple(f.name for f in dataclasses.fields(ConvProblem) if f.compare)


class AutotuneFileError(CaffeError):
    """An autotune file that cannot be read, or is not one."""


@functools.cache
def code_version() -> str:
    """The package version and a digest of the engines' and the GPU runtime's sources (conv/ and gpu/)."""
    digest = hashlib.sha256()
    here = Path(__file__).parent
    for path in sorted([*here.iterdir(), *(here.parent / "gpu").iterdir()]):
        if path.suffix in (".py", ".cu", ".cuh"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:16]}"


def _entry(key: Key, picks: Picks, timings: Timings) -> dict[str, Any]:
    prob, bias, candidates, tf32, (name, capability), timing = key
    return {"device": {"name": name, "capability": list(capability)},
            "problem": {f: getattr(prob, f) for f in _FIELDS}, "bias": bias, "candidates": list(candidates),
            "tf32": tf32, "timing": timing, "choice": dict(zip(("forward", "backward_data", "backward_weight"), picks)),
            "timings": [list(t) for t in timings]}


def _value(field: str, v: Any) -> int | str | tuple[int, int]:
    """A problem field from JSON: the dtype string, an (h, w) pair, or an int (TypeError/ValueError else)."""
    if field == "dtype":
        return np.dtype(v).str
    if isinstance(v, list):
        h, w = v
        return operator.index(h), operator.index(w)
    return operator.index(v)


def _parse(e: dict[str, Any]) -> tuple[Key, Picks, Timings]:
    """The entry's key, picks and timings; KeyError, TypeError or ValueError when malformed."""
    fields = e["problem"]
    if set(fields) != set(_FIELDS):
        raise ValueError(f"problem fields {sorted(fields)}")
    values: dict[str, Any] = {f: _value(f, v) for f, v in fields.items()}
    prob = ConvProblem(**values)
    dev = e["device"]
    key = (prob, bool(e["bias"]), tuple(map(str, e["candidates"])), bool(e["tf32"]),
           (str(dev["name"]), (int(dev["capability"][0]), int(dev["capability"][1]))), str(e["timing"]))
    c = e["choice"]
    picks = (str(c["forward"]), str(c["backward_data"]), str(c["backward_weight"]))
    timings = tuple((str(p), str(n), float(ms)) for p, n, ms in e["timings"])
    return key, picks, timings


def _same_key(e: dict[str, Any]) -> str:
    return json.dumps({k: e.get(k) for k in ("device", "problem", "bias", "candidates", "tf32", "timing")}, sort_keys=True)


def _read_doc(path: str | os.PathLike) -> dict[str, Any] | None:
    """The file's JSON object (None when the file does not exist); AutotuneFileError when it is
    not an autotune file."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AutotuneFileError(f"{path}: cannot read the autotune file: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), list):
        raise AutotuneFileError(f"{path}: not a pycaffe-lite autotune file (no \"format\": \"{FORMAT}\")")
    return doc


def _stale(doc: dict[str, Any]) -> str | None:
    """Why the file's entries do not apply to this code, or None when they do."""
    if doc.get("format_version") != FORMAT_VERSION:
        return f"format version {doc.get('format_version')}, this code reads {FORMAT_VERSION}"
    if doc.get("code") != code_version():
        return f"measured by pycaffe-lite {doc.get('code')}, this is {code_version()}"
    return None


def read(path: str | os.PathLike) -> list[tuple[Key, Picks, Timings]]:
    """The entries of the autotune file ``path``: none when it does not exist or is stale (with a
    warning); malformed entries are skipped with a warning. AutotuneFileError when the file cannot be
    read or is not an autotune file."""
    doc = _read_doc(path)
    if doc is None:
        return []
    why = _stale(doc)
    if why:
        log.warning("%s: ignoring the autotune file (%s); convolutions are tuned anew", path, why)
        return []
    out, bad = [], 0
    for e in doc["entries"]:
        try:
            out.append(_parse(e))
        except (KeyError, TypeError, ValueError, IndexError):
            bad += 1
    if bad:
        log.warning("%s: ignoring %d malformed autotune entr%s", path, bad, "y" if bad == 1 else "ies")
    return out


def write(path: str | os.PathLike, entries: Mapping[Key, tuple[Picks, Timings]]) -> int:
    """Save ``entries`` (key -> (picks, timings)) to ``path``, merged with the current entries of the
    file there (ours replace those of equal keys; a stale file is replaced). Returns the number of
    entries written. AutotuneFileError, leaving the file alone, when ``path`` holds something that
    is not an autotune file."""
    ours = [_entry(k, *v) for k, v in entries.items()]
    doc = _read_doc(path)
    kept: list[dict[str, Any]] = []
    if doc is not None:
        why = _stale(doc)
        if why:
            log.warning("%s: replacing the stale autotune file (%s)", path, why)
        else:
            mine = {_same_key(e) for e in ours}
            kept = [e for e in doc["entries"] if isinstance(e, dict) and _same_key(e) not in mine]
    out = {"format": FORMAT, "format_version": FORMAT_VERSION, "code": code_version(), "entries": kept + ours}
    n = len(kept) + len(ours)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode) if doc is not None else 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return n
