"""What the check runs and compares, shared by the end-to-end check (:mod:`.check`) and the
layer-by-layer recheck (:mod:`.local`): a row of the table (:class:`CheckRow`), one value compared
(:func:`compare_value`), our CPU forward observed layer by layer (:func:`caffe_forward`) and ONNX
Runtime with chosen outputs (:class:`OrtRunner`, external data for large weights)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from .. import common
from ..blob import store_math, to_math
from ..optional import require
from .export import BlobRow
from .graph import CheckError

INLINE_BYTES = 512 * 2**20  # larger weights reach ONNX Runtime as external data files
_STEP = 1 << 22  # elements compared at a time (float64 temporaries of 32 MiB)


@dataclass
class CheckRow:
    row: BlobRow
    shape: tuple[int, ...] | None = None
    scale: float = 0.0  # max |caffe value|
    max_abs: float = 0.0
    rel: float = 0.0
    verdict: str = ""  # "ok", "ok (all 0)", "ok (alias)", "ok (layer)", "MISMATCH", "inconclusive", or why not
    detail: str = ""  # inconclusive: the reference's non-finite counts; rechecked: "layer alone <rel diff>"


def compare_value(cr: CheckRow, a: np.ndarray, b: np.ndarray | None, tol: float) -> None:
    """Fill ``cr`` from reference ``a`` and ONNX value ``b``, a slice at a time (float64)."""
    cr.shape = tuple(a.shape)
    if b is None or a.shape != b.shape:
        cr.verdict = "MISMATCH"
        cr.max_abs = cr.rel = float("inf")
        cr.row.note = "missing in ONNX" if b is None else f"shape {b.shape} in ONNX"
        return
    fa, fb = a.reshape(-1), np.asarray(b).reshape(-1)
    scale = max_abs = 0.0
    n_nan = n_inf = 0
    for s in range(0, fa.size, _STEP):
        x = fa[s:s + _STEP].astype(np.float64)
        y = fb[s:s + _STEP].astype(np.float64)
        finite = np.isfinite(x)
        if not finite.all():
            nan = int(np.isnan(x).sum())
            n_nan, n_inf = n_nan + nan, n_inf + int(x.size - finite.sum()) - nan
            continue
        if n_nan or n_inf:
            continue
        d = np.abs(x - y)
        d[~np.isfinite(d)] = np.inf  # a NaN or inf in ONNX where the reference is finite
        scale = max(scale, float(np.abs(x).max()))
        max_abs = max(max_abs, float(d.max()))
    if n_nan or n_inf:
        cr.verdict = "inconclusive"
        cr.detail = ", ".join(f"{n} {w}" for n, w in ((n_inf, "inf"), (n_nan, "NaN")) if n) + " in the reference"
        return
    cr.scale, cr.max_abs = scale, max_abs
    cr.rel = max_abs / scale if scale > 0 else max_abs
    if scale == 0 and max_abs == 0:
        cr.verdict = "ok (all 0)"  # agrees, but proves little (no weights loaded?)
        return
    cr.verdict = "ok" if max_abs <= tol * scale else "MISMATCH"


@contextlib.contextmanager
def _memory_data_fed(net, feeds: Mapping[str, np.ndarray]) -> Iterator[None]:
    """MemoryData layers serve the check's arrays for one forward (their own arrays and read
    position restored afterwards): their data top is a graph input like any other."""
    saved = []
    for i, layer in enumerate(net.layers):
        if layer.type != "MemoryData":
            continue
        tops = net.top_names_of(i)
        data = feeds.get(tops[0])
        if data is None:
            data = np.zeros(net.blobs[tops[0]].shape, np.float32)
        labels = feeds.get(tops[1]) if len(tops) > 1 else None
        if labels is None:
            labels = np.zeros(layer.batch_size, np.float32)
        saved.append((layer, layer._data, layer._labels, layer.n, layer.pos))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transform_param is not applied to these arrays (as in Caffe)
            layer.reset(np.ascontiguousarray(data, np.float32), np.ascontiguousarray(labels, np.float32),
                        layer.batch_size)
    try:
        yield
    finally:
        for layer, data, labels, n, pos in saved:
            layer._data, layer._labels, layer.n, layer.pos = data, labels, n, pos


def caffe_forward(net, feeds: Mapping[str, np.ndarray], visit: Callable[[int, int, np.ndarray], None],
                  before: Callable[[int], None] | None = None) -> None:
    """One CPU forward, fusions off, calling ``visit(layer index, top index, value)`` right after
    each layer for each of its tops (the value is the net's blob: read it, do not keep it), and
    ``before(layer index)`` before each layer when given."""
    feeding = {i for i in range(len(net.layers))  # the input and data layers (no bottoms)
               if not net.bottom_names_of(i) and set(net.top_names_of(i)) & set(feeds)}

    def after(i: int) -> None:
        for j, (name, blob) in enumerate(zip(net.top_names_of(i), net.top_vecs[i])):
            if i in feeding and name in feeds:
                store_math(blob.mutable_cpu_data(), feeds[name])
            visit(i, j, to_math(blob.cpu_data()))  # (half storage as float32 values)

    ex = net.executor
    fusions, mode = ex.fusions, common.mode()
    hooks = ex.hooks["after_forward"]
    before_hooks = ex.hooks["before_forward"]
    ex.fusions = {}
    hooks.append(after)
    if before is not None:
        before_hooks.append(before)
    try:
        common.set_mode_cpu()
        for name, arr in feeds.items():
            if name in net.blobs:
                store_math(net.blobs[name].mutable_cpu_data(), arr)
        with _memory_data_fed(net, feeds):
            net.forward_prefilled()
    finally:
        hooks.remove(after)
        if before is not None:
            before_hooks.remove(before)
        ex.fusions = fusions
        if mode is not common.Mode.CPU:
            common.set_mode_gpu()


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's weights held in the protobuf itself (not in external data)."""
    total = 0
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            total += len(t.raw_data) or int(np.prod(t.dims, dtype=np.int64)) * 4
    return total


def needs_external_data(model: onnx.ModelProto) -> bool:
    """Whether the model's inline weights exceed :data:`INLINE_BYTES` (written and run as external data)."""
    return initializer_bytes(model) > INLINE_BYTES


def has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


class OrtRunner:
    """Runs ``model`` in ONNX Runtime (CPU) with chosen values as the outputs. ``folder``: where its
    external data files lie (the model as the export wrote it); a model with more than
    :data:`INLINE_BYTES` of weights held inline is moved to external data in a temporary folder for
    the runner's life (and its weights loaded back into the proto when the runner closes)."""

    def __init__(self, model: onnx.ModelProto, folder: str | None = None) -> None:
        self.ort = require("onnxruntime", feature="checking an ONNX export", extra="onnx")
        self.model, self.folder, self._tmp = model, folder, None
        if not has_external_data(model) and needs_external_data(model):
            self._tmp = tempfile.mkdtemp(prefix="pycaffe-lite-onnx-check-")
            onnx.save_model(model, os.path.join(self._tmp, "model.onnx"), save_as_external_data=True,
                            all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=1024)
            self.folder = self._tmp  # the proto now references that file (its raw data cleared)
        elif has_external_data(model) and folder is None:
            raise CheckError("the model's weights are in external data files: give their folder")

    def run(self, names: list[str], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The values ``names`` (graph values, not inputs) for ``feeds``."""
        graph = self.model.graph
        saved = list(graph.output)
        del graph.output[:]
        graph.output.extend(onnx.helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, None) for v in names)
        try:
            data = self.model.SerializeToString()
        finally:
            del graph.output[:]
            graph.output.extend(saved)
        sess = self.session(data)
        del data
        inputs = {i.name for i in sess.get_inputs()}
        results = sess.run(names, {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in feeds.items()
                                   if k in inputs})
        return dict(zip(names, results))

    def session(self, data: bytes):
        """An ONNX Runtime CPU session of a serialized model whose external data (if any) lies in
        the runner's folder."""
        opts = self.ort.SessionOptions()
        opts.log_severity_level = 3
        if self.folder is not None:
            opts.add_session_config_entry("session.model_external_initializers_file_folder_path", self.folder)
        return self.ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])

    def close(self) -> None:
        if self._tmp is not None:
            onnx.load_external_data_for_model(self.model, self._tmp)
            for t in self.model.graph.initializer:  # inline again, as before the runner
                t.data_location = onnx.TensorProto.DEFAULT
                del t.external_data[:]
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
