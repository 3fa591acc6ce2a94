"""ONNX export that proves itself (``pycaffe-lite export_onnx``, :meth:`Net.to_onnx`).

Needs the ``onnx`` extra (``pip install 'pycaffe-lite[onnx]'``: onnx and onnxruntime); the rest of
the package imports this wing only when asked to export (``Net.to_onnx`` and the ``export_onnx``
command import it in the call). Modules:

- :mod:`.registry`: ``@exports("Type")`` converter functions, one per Caffe layer type;
- :mod:`.graph`: the graph builder and the per-layer context converters receive;
- :mod:`.ops_vision`, :mod:`.ops_neuron`, :mod:`.ops_norm`, :mod:`.ops_shape`, :mod:`.ops_fork`,
  :mod:`.ops_landed`: the converters;
- :mod:`.export`: walks a built Net and writes the model;
- :mod:`.check`: runs the model in ONNX Runtime and compares every surviving Caffe top, streaming;
- :mod:`.local`: rechecks a blob that differs end to end with its layer's nodes alone;
- :mod:`.runs`: what both compare with: a table row, one value compared, our forward observed layer by layer, ONNX Runtime with chosen outputs;
- :mod:`.fill`: normalization statistics for a net checked without trained weights.

See docs/onnx.md for the mapping table and how to read the check table.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ..durable import describe, fsync_dir, temp_path, write_temp
from .check import (
    CheckResult,
    InconclusiveCheck,
    check,
    load_check_input,
    needs_external_data,
    verify,
)
from .export import Exported, build, reshape_inputs
from .graph import DEFAULT_OPSET, CheckError, ExportError
from .registry import CONVERTERS, exports, load_converters

__all__ = ["CONVERTERS", "CheckError", "CheckResult", "DEFAULT_OPSET", "ExportError", "Exported", "ExportReport",
           "InconclusiveCheck", "build", "check", "export_net", "exports", "load_converters", "save_model", "verify"]

log = logging.getLogger("pycaffe_lite")


@dataclass
class ExportReport:
    exported: Exported
    checks: list[CheckResult]  # one per checked input set (random first)
    path: str | None


def export_net(net, path: str | os.PathLike | None, opset: int = DEFAULT_OPSET, dynamic_batch: bool = False,
               input_shapes: Mapping[str, Sequence[int]] | None = None, fp16: bool = False,
               check_model: bool = True, check_inputs: Sequence[Mapping[str, np.ndarray] | str] = (),
               random_check: bool = True, seed: int = 0, tol: float | None = None,
               raise_on_mismatch: bool = True, fold_bn: bool = False, layer_recheck: bool = True) -> ExportReport:
    """Write ``net`` as ONNX to ``path`` (None: build only) and prove it.

    ``input_shapes``: {input: shape} to export at another shape (the net is reshaped for the export
    and the check, then restored). ``dynamic_batch``: the first input axis is symbolic ("N").
    ``fold_bn``: BatchNorm (+ Scale) folded into the preceding convolution (or one BatchNormalization).
    ``check_model``: ``onnx.checker`` on the model. The check (``random_check`` and each of
    ``check_inputs``: {input: array} or a path for the first input, .npy or an image) runs ONNX
    Runtime against the net's forward and raises :class:`CheckError` naming the first diverging
    layer unless ``raise_on_mismatch`` is False. ``layer_recheck``: blobs that differ end to end are
    compared once more with their layer's nodes run on our values of its bottoms (:mod:`.local`).
    ``raise_on_mismatch`` also raises :class:`InconclusiveCheck` when the reference is not finite.
    A model whose weights exceed :data:`~.runs.INLINE_BYTES` is written with its weights in
    ``<path>.data`` beside it (:func:`save_model`).
    """
    old = reshape_inputs(net, input_shapes or {})
    try:
        exported = build(net, opset=opset, dynamic_batch=dynamic_batch, fp16=fp16, fold_bn=fold_bn)
        large = needs_external_data(exported.model)
        if check_model and not large:
            _checker(net, exported.model)
        folder = None
        if path is not None:
            if save_model(exported.model, path):
                folder = os.path.dirname(os.path.abspath(path))
            log.info("Wrote %s (%d nodes, opset %d)", path, len(exported.model.graph.node), opset)
        if check_model and large:  # onnx.checker reads a model over 2 GB from its files only
            if path is not None and folder is not None:
                _checker(net, os.fspath(path))
            else:
                with tempfile.TemporaryDirectory(prefix="pycaffe-lite-onnx-") as tmp:
                    onnx.save_model(exported.model, os.path.join(tmp, "m.onnx"), save_as_external_data=True,
                                    location="m.onnx.data", size_threshold=1024)
                    try:
                        _checker(net, os.path.join(tmp, "m.onnx"))
                    finally:
                        _load_weights(exported.model, tmp)
        for note in exported.notes:
            log.info("export note: %s", note)
        results = []
        feeds_list: list[Mapping[str, np.ndarray] | None] = [None] if random_check else []
        for item in check_inputs:
            if isinstance(item, Mapping):
                feeds_list.append(item)
            else:
                if not exported.inputs:
                    raise CheckError("the export has no input to feed a check input to")
                first, shape = next(iter(exported.inputs.items()))
                feeds: dict[str, np.ndarray] = {first: load_check_input(item, shape)}
                rng = np.random.default_rng(seed)
                feeds.update({k: rng.standard_normal(s).astype(np.float32)
                              for k, s in exported.inputs.items() if k != first})
                feeds_list.append(feeds)
        try:
            for item_feeds in feeds_list:
                result = check(net, exported, item_feeds, seed=seed, tol=tol, folder=folder,
                               layer_recheck=layer_recheck)
                results.append(result)
                if raise_on_mismatch:
                    verify(result)
        finally:
            if folder is not None:  # the weights back in the proto (they were written to the data file)
                _load_weights(exported.model, folder)
        return ExportReport(exported, results, None if path is None else os.fspath(path))
    finally:
        if old:
            reshape_inputs(net, old)


def _checker(net, model: onnx.ModelProto | str) -> None:
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"net '{net.name}': onnx.checker rejects the export: {exc}") from None


def _load_weights(model: onnx.ModelProto, folder: str) -> None:
    """Read the weights of a model saved with external data back into its proto (inline again)."""
    onnx.load_external_data_for_model(model, folder)
    for t in model.graph.initializer:
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> bool:
    """Write ``model`` to ``path``, whole or not at all: a fsynced temporary beside it, then renamed.
    Weights over :data:`~.runs.INLINE_BYTES` (protobuf cannot serialize 2 GB) go to
    ``<name>.data`` beside the model (ONNX external data, one file), both written in a temporary
    folder and renamed, the data file first; the model proto then references that file (its
    tensors' raw data cleared). Returns whether the weights went to the data file."""
    final = Path(os.fspath(path)).absolute()
    if not needs_external_data(model):
        tmp_file: Path | None = None
        try:
            tmp_file = write_temp(final, model.SerializeToString())
            os.replace(tmp_file, final)
        except OSError as exc:
            if tmp_file is not None:
                tmp_file.unlink(missing_ok=True)
            raise ExportError(f"cannot write {final}: {describe(exc)}") from None
        fsync_dir(final.parent)
        return False
    data = final.name + ".data"
    tmp = temp_path(final)
    try:
        tmp.mkdir()
        onnx.save_model(model, str(tmp / final.name), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data, size_threshold=1024)
        for name in (data, final.name):
            with open(tmp / name, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp / data, final.parent / data)
        os.replace(tmp / final.name, final)
    except OSError as exc:
        raise ExportError(f"cannot write {final}: {describe(exc)}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(final.parent)
    return True
