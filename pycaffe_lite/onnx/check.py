"""Prove an export: run it in ONNX Runtime (CPU) and compare every Caffe top that survives as an
ONNX value with pycaffe-lite's own forward, blob by blob.

The reference is the net's CPU forward with the executor's layer fusions off, so that every
intermediate value of an in-place chain is observed after its own layer. A blob passes when
``max |onnx - caffe| <= tol * max |caffe|`` (``tol`` 1e-5). With fp16 weights the reference runs on
the weight blobs rounded to float16, as the export stores them (vectors stay float32), so the same
1e-5 applies; with fp16 and folded BatchNorms the folded kernels are rounded after folding, and the
tolerance is 2e-3. A net storing its values in fp16 or bfloat16 (docs/precision.md) is compared
through their float32 values (the export holds the half weights' values exactly, or as float16
with ``--fp16``) with 4 units of its format's roundoff (:data:`TOL_HALF`: 2**-9 fp16, 2**-6
bfloat16), since it rounds every top it stores and ONNX does not. A reference blob holding inf or
NaN proves nothing either way: its row is ``inconclusive``, and so is the whole check when such a
blob comes before any mismatch.

Memory: the check streams. The compared values are split into chunks of about
:data:`CHUNK_BYTES`; per chunk ONNX Runtime runs once with just that chunk's values as outputs,
then the Caffe forward runs once and each top is compared right after its layer, in place (no
copy of the net's blobs is kept). A small net is one chunk: one run of each. A model whose weights
exceed :data:`INLINE_BYTES` is handed to ONNX Runtime through external data files (the file the
export wrote, or a temporary folder), never as one serialized protobuf (which cannot exceed 2 GB).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from .. import io as caffe_io
from ..blob import store_math, to_math
from .export import Exported
from .graph import CheckError, fp16_stored
from .runs import INLINE_BYTES, CheckRow, OrtRunner, caffe_forward, compare_value, needs_external_data

__all__ = ["INLINE_BYTES", "CheckRow", "CheckResult", "InconclusiveCheck", "OrtRunner", "caffe_forward",
           "check", "load_check_input", "needs_external_data", "random_feeds", "verify"]

TOL_FP32 = 1e-5
TOL_FP16_FOLDED = 2e-3
#: A net that stores values in half (docs/precision.md) rounds every top it stores, which the
#: float32 ONNX graph does not: its default tolerance is 4 units of roundoff of the format
#: (fp16 2**-11, bfloat16 2**-8; bfloat16 is held as uint16 bit patterns on the host).
TOL_HALF = {np.dtype(np.float16): 4 * 2.0 ** -11, np.dtype(np.uint16): 4 * 2.0 ** -8}
CHUNK_BYTES = 256 * 2**20  # ONNX Runtime values fetched per run (one value may exceed it alone)
# Layers whose forward depends on the previous forward: the check runs the net once (one chunk).
STATEFUL_TYPES = frozenset({"RNN", "LSTM", "Python"})


class InconclusiveCheck(CheckError):
    """The reference (pycaffe-lite's forward) holds inf or NaN before any blob differs: the check
    can neither pass nor fail the export."""


@dataclass
class CheckResult:
    rows: list[CheckRow]
    tol: float
    inputs: dict[str, np.ndarray]

    @property
    def failures(self) -> list[CheckRow]:
        return [r for r in self.rows if r.verdict == "MISMATCH"]

    @property
    def inconclusive(self) -> list[CheckRow]:
        return [r for r in self.rows if r.verdict == "inconclusive"]

    @property
    def status(self) -> str:
        """"PASS", "FAIL" (the first blob that is not ok differs) or "INCONCLUSIVE" (the first such
        blob is non-finite in the reference; later mismatches may follow from its inf/NaN)."""
        for r in self.rows:
            if r.verdict == "MISMATCH":
                return "FAIL"
            if r.verdict == "inconclusive":
                return "INCONCLUSIVE"
        return "PASS"

    @property
    def ok(self) -> bool:
        return self.status == "PASS"

    def table(self) -> str:
        head = ("layer", "type", "top", "onnx value", "shape", "max|caffe|", "max abs diff", "rel diff", "")
        lines = [head]
        for r in self.rows:
            shape = "x".join(map(str, r.shape)) if r.shape is not None else "-"
            if r.verdict in ("ok", "MISMATCH", "ok (all 0)", "ok (alias)", "ok (layer)"):
                nums = (f"{r.scale:.4g}", f"{r.max_abs:.3g}", f"{r.rel:.3g}")
            else:
                nums = ("-", "-", "-")
            verdict = f"{r.verdict} ({r.detail})" if r.detail else r.verdict
            lines.append((r.row.layer, r.row.type, r.row.top, r.row.value or "-", shape, *nums, verdict))
        widths = [max(len(str(line[k])) for line in lines) for k in range(len(head))]
        out = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
        zeros = [r for r in self.rows if r.verdict == "ok (all 0)"]
        layer = [r for r in self.rows if r.verdict == "ok (layer)"]
        compared = [r for r in self.rows if r.verdict in ("ok", "ok (alias)", "MISMATCH", "ok (all 0)")]
        worst = max((r.rel for r in compared if r.verdict != "MISMATCH"), default=0.0)
        status = self.status
        if status == "PASS":
            verdict = f"PASS: {len(compared)} blobs agree within {self.tol:g} of their range (worst {worst:.3g})"
            if layer:
                drift = max(r.rel for r in layer)
                alone = max(float(r.detail.split()[-1]) for r in layer)
                verdict += (f"; {len(layer)} more agree within it layer by layer (their layer's nodes on our "
                            f"values of its bottoms: worst {alone:.3g}; carried end to end up to {drift:.3g})")
        elif status == "FAIL":
            f = self.failures[0]
            verdict = (f"FAIL: {len(self.failures)} of {len(compared) + len(layer)} blobs differ by more than {self.tol:g} of "
                       f"their range; first diverging layer '{f.row.layer}' ({f.row.type})")
        else:
            f = self.inconclusive[0]
            verdict = (f"INCONCLUSIVE: {len(self.inconclusive)} reference blobs hold inf or NaN, the first "
                       f"'{f.row.top}' of layer '{f.row.layer}' ({f.row.type}: {f.detail}); {len(self.failures)} "
                       "compared blobs differ (load trained weights with --weights, or check another input)")
        if zeros:
            verdict += (f"\nWARNING: {len(zeros)} blobs are all 0 in both (no weights loaded?): "
                        "the check proves little for them")
        return "\n".join(out + [verdict])


def _rng_inputs(net, exported: Exported, seed: int) -> dict[str, np.ndarray]:
    """Standard-normal inputs; an input that an Embed layer reads gets valid integer indices."""
    return random_feeds(net, exported.inputs, seed)


def random_feeds(net, shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """{input: standard-normal array of its shape}; an input that an Embed layer reads gets valid
    integer indices instead."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape in shapes.items():
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


@contextlib.contextmanager
def _fp16_weights(net, on: bool) -> Iterator[None]:
    """The net's weight blobs rounded to float16 as the export stores them (:func:`fp16_stored`;
    half params through their values: bfloat16 ones are bit patterns)."""
    blobs = [b for layer in net.layers for b in layer.blobs if fp16_stored(b.shape)] if on else []
    saved = [np.array(b.cpu_data(), copy=True) for b in blobs]
    try:
        for b in blobs:
            store_math(b.mutable_cpu_data(), to_math(b.cpu_data()).astype(np.float16).astype(np.float32))
        yield
    finally:
        for b, s in zip(blobs, saved):
            b.mutable_cpu_data()[...] = s


def half_tolerance(net) -> float:
    """:data:`TOL_HALF` of the widest half format among the net's blobs and params (0: none)."""
    dtypes = {b.dtype for b in net.blobs.values()} | {b.dtype for layer in net.layers for b in layer.blobs}
    return max((TOL_HALF[d] for d in dtypes if d in TOL_HALF), default=0.0)


def _chunks(net, rows: list[CheckRow], budget: int) -> list[list[CheckRow]]:
    """The compared rows in groups whose distinct ONNX values hold about ``budget`` bytes."""
    if any(layer.type in STATEFUL_TYPES for layer in net.layers):
        return [rows] if rows else []
    chunks: list[list[CheckRow]] = []
    current: list[CheckRow] = []
    values: set[str] = set()
    size = 0
    for cr in rows:
        v = str(cr.row.value)
        if v not in values:
            nbytes = int(net.top_vecs[cr.row.index][cr.row.top_index].count) * 4
            if current and size + nbytes > budget:
                chunks.append(current)
                current, values, size = [], set(), 0
            values.add(v)
            size += nbytes
        current.append(cr)
    if current:
        chunks.append(current)
    return chunks


def check(net, exported: Exported, inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0,
          tol: float | None = None, folder: str | None = None, chunk_bytes: int | None = None,
          layer_recheck: bool = True) -> CheckResult:
    """Compare ``exported`` (built from ``net`` at its current shapes) with the net's forward on
    ``inputs`` (default: random) and return the per-blob table; :func:`verify` raises unless it
    passed. ``folder``: where the model's external data files are (when it has any);
    ``chunk_bytes``: the values fetched per ONNX Runtime run (default :data:`CHUNK_BYTES`).
    ``layer_recheck``: a blob that differs end to end is compared once more with its layer's ONNX
    nodes run on our own values of the layer's bottoms (:mod:`.local`): within ``tol`` there, the
    row is ``ok (layer)`` (the difference was carried in from the layers before it)."""
    feeds = dict(inputs) if inputs is not None else _rng_inputs(net, exported, seed)
    for name, shape in exported.inputs.items():
        if name not in feeds:
            raise CheckError(f"check input: no array for graph input '{name}'")
        if tuple(feeds[name].shape) != shape:
            raise CheckError(f"check input '{name}': shape {tuple(feeds[name].shape)}, the export expects {shape}")
    if tol is None:
        tol = max(TOL_FP16_FOLDED if exported.fp16 and exported.folded else TOL_FP32, half_tolerance(net))
    rows = [CheckRow(r) for r in exported.rows]
    compared = []
    for cr in rows:
        if cr.row.value is None:
            cr.verdict = cr.row.note or "left out"
        else:
            compared.append(cr)
    runner = OrtRunner(exported.model, folder)
    try:
        for chunk in _chunks(net, compared, chunk_bytes or CHUNK_BYTES):
            wanted = [v for v in dict.fromkeys(str(cr.row.value) for cr in chunk) if v not in exported.inputs]
            got: dict[str, np.ndarray] = runner.run(wanted, feeds) if wanted else {}
            got.update({k: np.asarray(feeds[k], np.float32) for k in exported.inputs})
            _compare_chunk(net, feeds, chunk, got, tol, exported.fp16)
            del got
        if layer_recheck and any(cr.verdict == "MISMATCH" for cr in compared):
            from .local import recheck_layers

            with _fp16_weights(net, exported.fp16):
                recheck_layers(net, exported, runner, feeds, compared, tol)
    finally:
        runner.close()
    seen: set[str] = set()
    for cr in compared:
        if cr.row.value in seen and cr.verdict == "ok":
            cr.verdict = "ok (alias)"
        seen.add(str(cr.row.value))
        if not cr.verdict:  # the forward never reached its layer
            cr.verdict, cr.max_abs, cr.rel = "MISMATCH", float("inf"), float("inf")
    return CheckResult(rows, tol, feeds)


def _compare_chunk(net, feeds: Mapping[str, np.ndarray], chunk: list[CheckRow], got: Mapping[str, np.ndarray],
                   tol: float, fp16: bool) -> None:
    """One Caffe forward comparing each of ``chunk``'s tops right after its layer with ``got``."""
    by_top: dict[tuple[int, int], list[CheckRow]] = {}
    for cr in chunk:
        by_top.setdefault((cr.row.index, cr.row.top_index), []).append(cr)

    def visit(i: int, j: int, value: np.ndarray) -> None:
        for cr in by_top.get((i, j), ()):
            compare_value(cr, value, got.get(str(cr.row.value)), tol)

    with _fp16_weights(net, fp16):
        caffe_forward(net, feeds, visit)


def verify(result: CheckResult) -> None:
    """Raise :class:`CheckError` naming the first diverging layer when the check failed, and
    :class:`InconclusiveCheck` naming the first non-finite reference blob when it was inconclusive."""
    status = result.status
    if status == "PASS":
        return
    if status == "INCONCLUSIVE":
        f = result.inconclusive[0]
        raise InconclusiveCheck(
            f"the check is inconclusive: pycaffe-lite's own forward is not finite from layer '{f.row.layer}' "
            f"({f.row.type}), top '{f.row.top}' ({f.detail}), so ONNX Runtime's values prove nothing there; "
            f"{len(result.inconclusive)} blob(s) non-finite, {len(result.failures)} compared blob(s) differ"
        )
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
