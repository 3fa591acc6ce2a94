"""Prove an export: run it in ONNX Runtime (CPU) and compare every Caffe top that survives as an
ONNX value with pycaffe-lite's own forward, blob by blob.

The reference is the net's CPU forward with the executor's layer fusions off, so that every
intermediate value of an in-place chain is observed after its own layer. A blob passes when
``max |onnx - caffe| <= tol * max |caffe|`` (``tol`` 1e-5). With fp16 weights the reference runs on
the weight blobs rounded to float16, as the export stores them (vectors stay float32), so the same
1e-5 applies; with fp16 and folded BatchNorms the folded kernels are rounded after folding, and the
tolerance is 2e-3.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from .. import common
from .. import io as caffe_io
from ..optional import require
from .export import BlobRow, Exported
from .graph import CheckError, fp16_stored

TOL_FP32 = 1e-5
TOL_FP16_FOLDED = 2e-3


@dataclass
class CheckRow:
    row: BlobRow
    shape: tuple[int, ...] | None = None
    scale: float = 0.0  # max |caffe value|
    max_abs: float = 0.0
    rel: float = 0.0
    verdict: str = ""  # "ok", "MISMATCH", "alias", "left out"


@dataclass
class CheckResult:
    rows: list[CheckRow]
    tol: float
    inputs: dict[str, np.ndarray]

    @property
    def failures(self) -> list[CheckRow]:
        return [r for r in self.rows if r.verdict == "MISMATCH"]

    @property
    def ok(self) -> bool:
        return not self.failures

    def table(self) -> str:
        head = ("layer", "type", "top", "onnx value", "shape", "max|caffe|", "max abs diff", "rel diff", "")
        lines = [head]
        for r in self.rows:
            shape = "x".join(map(str, r.shape)) if r.shape is not None else "-"
            if r.verdict in ("ok", "MISMATCH", "ok (all 0)"):
                nums = (f"{r.scale:.4g}", f"{r.max_abs:.3g}", f"{r.rel:.3g}")
            else:
                nums = ("-", "-", "-")
            lines.append((r.row.layer, r.row.type, r.row.top, r.row.value or "-", shape, *nums, r.verdict))
        widths = [max(len(str(line[k])) for line in lines) for k in range(len(head))]
        out = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
        zeros = [r for r in self.rows if r.verdict == "ok (all 0)"]
        compared = [r for r in self.rows if r.verdict in ("ok", "MISMATCH")] + zeros
        worst = max((r.rel for r in compared), default=0.0)
        verdict = (f"PASS: {len(compared)} blobs agree within {self.tol:g} of their range (worst {worst:.3g})"
                   if self.ok else
                   f"FAIL: {len(self.failures)} of {len(compared)} blobs differ by more than {self.tol:g} of "
                   f"their range; first diverging layer '{self.failures[0].row.layer}' ({self.failures[0].row.type})")
        if zeros:
            verdict += (f"\nWARNING: {len(zeros)} blobs are all 0 in both (no weights loaded?): "
                        "the check proves little for them")
        return "\n".join(out + [verdict])


def _rng_inputs(net, exported: Exported, seed: int) -> dict[str, np.ndarray]:
    """Standard-normal inputs; an input that an Embed layer reads gets valid integer indices."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape in exported.inputs.items():
        embed_dim = _embed_input_dim(net, name)
        if embed_dim:
            feeds[name] = rng.integers(0, embed_dim, size=shape).astype(np.float32)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _embed_input_dim(net, name: str) -> int:
    """input_dim of an Embed layer reading blob ``name`` (through Split layers), else 0."""
    names = {name}
    for i, layer in enumerate(net.layers):
        if not names & set(net.bottom_names_of(i)):
            continue
        if layer.type == "Split":
            names |= set(net.top_names_of(i))
        elif layer.type == "Embed":
            return int(layer.layer_param.embed_param.input_dim)
    return 0


def caffe_values(net, feeds: Mapping[str, np.ndarray]) -> dict[tuple[int, int], np.ndarray]:
    """Every top of every layer right after that layer's CPU forward, fusions off."""
    captured: dict[tuple[int, int], np.ndarray] = {}
    feeding = {i for i in range(len(net.layers))  # the input and data layers (no bottoms)
               if not net.bottom_names_of(i) and set(net.top_names_of(i)) & set(feeds)}

    def after(i: int) -> None:
        for j, (name, blob) in enumerate(zip(net.top_names_of(i), net.top_vecs[i])):
            if i in feeding and name in feeds:
                blob.mutable_cpu_data()[...] = feeds[name]
            captured[(i, j)] = np.array(blob.cpu_data(), dtype=np.float32, copy=True)

    ex = net.executor
    fusions, mode = ex.fusions, common.mode()
    hooks = ex.hooks["after_forward"]
    ex.fusions = {}
    hooks.append(after)
    try:
        common.set_mode_cpu()
        for name, arr in feeds.items():
            net.blobs[name].mutable_cpu_data()[...] = arr
        net.forward_prefilled()
    finally:
        hooks.remove(after)
        ex.fusions = fusions
        if mode is not common.Mode.CPU:
            common.set_mode_gpu()
    return captured


@contextlib.contextmanager
def _fp16_weights(net) -> Iterator[None]:
    """The net's weight blobs rounded to float16 as the export stores them (:func:`fp16_stored`)."""
    blobs = [b for layer in net.layers for b in layer.blobs if fp16_stored(b.shape)]
    saved = [np.array(b.cpu_data(), copy=True) for b in blobs]
    try:
        for b in blobs:
            b.mutable_cpu_data()[...] = b.cpu_data().astype(np.float16).astype(b.cpu_data().dtype)
        yield
    finally:
        for b, s in zip(blobs, saved):
            b.mutable_cpu_data()[...] = s


def onnx_values(exported: Exported, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the model in ONNX Runtime (CPU) with every compared value added as a graph output."""

    ort = require("onnxruntime", feature="checking an ONNX export", extra="onnx")
    model = onnx.ModelProto()
    model.CopyFrom(exported.model)
    have = {o.name for o in model.graph.output} | {i.name for i in model.graph.input}
    extra = []
    for r in exported.rows:
        if r.value is not None and r.value not in have:
            have.add(r.value)
            extra.append(r.value)
    model.graph.output.extend(onnx.helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, None) for v in extra)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    results = sess.run(names, {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in feeds.items()
                               if k in exported.inputs})
    values = dict(zip(names, results))
    values.update({k: np.asarray(v, np.float32) for k, v in feeds.items()})
    return values


def check(net, exported: Exported, inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0,
          tol: float | None = None) -> CheckResult:
    """Compare ``exported`` (built from ``net`` at its current shapes) with the net's forward on
    ``inputs`` (default: random) and return the per-blob table; :func:`verify` raises on mismatch."""
    feeds = dict(inputs) if inputs is not None else _rng_inputs(net, exported, seed)
    for name, shape in exported.inputs.items():
        if name not in feeds:
            raise CheckError(f"check input: no array for graph input '{name}'")
        if tuple(feeds[name].shape) != shape:
            raise CheckError(f"check input '{name}': shape {tuple(feeds[name].shape)}, the export expects {shape}")
    tol = tol if tol is not None else (TOL_FP16_FOLDED if exported.fp16 and exported.folded else TOL_FP32)
    if exported.fp16:
        with _fp16_weights(net):
            ref = caffe_values(net, feeds)
    else:
        ref = caffe_values(net, feeds)
    got = onnx_values(exported, feeds)
    rows = []
    seen: dict[str, str] = {}
    for r in exported.rows:
        cr = CheckRow(r)
        if r.value is None:
            cr.verdict = r.note or "left out"
            rows.append(cr)
            continue
        a = ref[(r.index, r.top_index)]
        cr.shape = tuple(a.shape)
        b = got.get(r.value)
        if b is None:
            cr.verdict = "MISMATCH"
            cr.max_abs = cr.rel = float("inf")
        else:
            _compare(cr, a, b, tol)
        if r.value in seen and cr.verdict == "ok":
            cr.verdict = "ok (alias)"
        seen.setdefault(r.value, r.top)
        rows.append(cr)
    return CheckResult(rows, tol, feeds)


def _compare(cr: CheckRow, a: np.ndarray, b: np.ndarray, tol: float) -> None:
    if a.shape != b.shape:
        cr.verdict = "MISMATCH"
        cr.max_abs = cr.rel = float("inf")
        cr.row.note = f"shape {b.shape} in ONNX"
        return
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a != nan_b).any():
        cr.verdict = "MISMATCH"
        cr.max_abs = cr.rel = float("nan")
        return
    fa, fb = np.where(nan_a, 0, a).astype(np.float64), np.where(nan_b, 0, b).astype(np.float64)
    cr.scale = float(np.abs(fa).max()) if fa.size else 0.0
    cr.max_abs = float(np.abs(fa - fb).max()) if fa.size else 0.0
    cr.rel = cr.max_abs / cr.scale if cr.scale > 0 else cr.max_abs
    if cr.scale == 0 and cr.max_abs == 0:
        cr.verdict = "ok (all 0)"  # agrees, but proves little (no weights loaded?)
        return
    cr.verdict = "ok" if cr.max_abs <= tol * cr.scale else "MISMATCH"


def verify(result: CheckResult) -> None:
    """Raise :class:`CheckError` naming the first diverging layer when the check failed."""
    if result.ok:
        return
    f = result.failures[0]
    raise CheckError(
        f"ONNX Runtime disagrees with pycaffe-lite: first diverging layer '{f.row.layer}' ({f.row.type}), "
        f"top '{f.row.top}' (ONNX value '{f.row.value}'): max abs diff {f.max_abs:.3g} = {f.rel:.3g} of the "
        f"blob's range {f.scale:.4g} (tolerance {result.tol:g}); {len(result.failures)} blob(s) differ"
    )


def load_check_input(path: str | os.PathLike, shape: tuple[int, ...]) -> np.ndarray:
    """An input array of ``shape`` from a ``.npy`` file (the shape, or one item of it, repeated
    over the batch) or an image (resized to H x W, channels BGR in 0..255 as Caffe's
    ImageData/OpenCV reads them, no mean subtracted; repeated over the batch)."""
    path = str(path)
    if path.endswith(".npy"):
        arr = np.load(path).astype(np.float32)
        if arr.shape == shape:
            return arr
        if arr.shape == shape[1:] or (arr.ndim == len(shape) and arr.shape[0] == 1 and arr.shape[1:] == shape[1:]):
            return np.broadcast_to(arr.reshape((1,) + shape[1:]), shape).copy()
        raise CheckError(f"check input {path}: shape {arr.shape} does not fit the net input {shape}")

    if len(shape) != 4 or shape[1] not in (1, 3):
        raise CheckError(f"check input {path}: an image needs an input of shape (N, 1 or 3, H, W), not {shape}")
    im = caffe_io.load_image(path, color=shape[1] == 3)  # H x W x C, RGB in [0, 1]
    im = caffe_io.resize(im, shape[2], shape[3])
    chw = np.transpose(im, (2, 0, 1))[::-1] * 255.0  # BGR, 0..255
    return np.broadcast_to(chw[None].astype(np.float32), shape).copy()
