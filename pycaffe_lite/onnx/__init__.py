"""ONNX export that proves itself (``pycaffe-lite export_onnx``, :meth:`Net.to_onnx`).

Needs the ``onnx`` extra (``pip install 'pycaffe-lite[onnx]'``: onnx and onnxruntime); the rest of
the package imports this wing only when asked to export (``Net.to_onnx`` and the ``export_onnx``
command import it in the call). Modules:

- :mod:`.registry`: ``@exports("Type")`` converter functions, one per Caffe layer type;
- :mod:`.graph`: the graph builder and the per-layer context converters receive;
- :mod:`.ops_vision`, :mod:`.ops_neuron`, :mod:`.ops_norm`, :mod:`.ops_shape`, :mod:`.ops_fork`,
  :mod:`.ops_landed`: the converters;
- :mod:`.export`: walks a built Net and writes the model;
- :mod:`.check`: runs the model in ONNX Runtime and compares every surviving Caffe top.

See docs/onnx.md for the mapping table and how to read the check table.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from .. import durable
from .check import CheckResult, check, load_check_input, verify
from .export import Exported, build, reshape_inputs
from .graph import DEFAULT_OPSET, CheckError, ExportError
from .registry import CONVERTERS, exports, load_converters

__all__ = ["CONVERTERS", "CheckError", "CheckResult", "DEFAULT_OPSET", "ExportError", "Exported", "ExportReport",
           "build", "check", "export_net", "exports", "load_converters", "verify"]

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
               raise_on_mismatch: bool = True, fold_bn: bool = False) -> ExportReport:
    """Write ``net`` as ONNX to ``path`` (None: build only) and prove it.

    ``input_shapes``: {input: shape} to export at another shape (the net is reshaped for the export
    and the check, then restored). ``dynamic_batch``: the first input axis is symbolic ("N").
    ``fold_bn``: BatchNorm (+ Scale) folded into the preceding convolution (or one BatchNormalization).
    ``check_model``: ``onnx.checker`` on the model. The check (``random_check`` and each of
    ``check_inputs``: {input: array} or a path for the first input, .npy or an image) runs ONNX
    Runtime against the net's forward and raises :class:`CheckError` naming the first diverging
    layer unless ``raise_on_mismatch`` is False.
    """
    old = reshape_inputs(net, input_shapes or {})
    try:
        exported = build(net, opset=opset, dynamic_batch=dynamic_batch, fp16=fp16, fold_bn=fold_bn)
        if check_model:
            try:
                onnx.checker.check_model(exported.model, full_check=True)
            except onnx.checker.ValidationError as exc:
                raise ExportError(f"net '{net.name}': onnx.checker rejects the export: {exc}") from None
        if path is not None:
            durable.save_file(path, exported.model.SerializeToString(), "ONNX model")  # whole or absent
            log.info("Wrote %s (%d nodes, opset %d)", path, len(exported.model.graph.node), opset)
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
        for item_feeds in feeds_list:
            result = check(net, exported, item_feeds, seed=seed, tol=tol)
            results.append(result)
            if raise_on_mismatch:
                verify(result)
        return ExportReport(exported, results, None if path is None else os.fspath(path))
    finally:
        if old:
            reshape_inputs(net, old)
