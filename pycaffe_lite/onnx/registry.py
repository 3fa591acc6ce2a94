"""The converter registry: one function per Caffe layer type, ``@exports("Type")``.

A converter takes a :class:`~pycaffe_lite.onnx.graph.LayerContext` and returns the ONNX value name
of each of the layer's tops, in order. It adds nodes with ``ctx.op(...)`` (the last node of a top
writes ``ctx.out(i)``, the name the exporter chose for that top) and constants with ``ctx.const``.
Returning a bottom's value unchanged makes the top an alias (TEST-time identities: Dropout, Split).
A layer the converter cannot express raises ``ctx.error("...")``.

A module that adds converters (the fork layers: PriorBox, DetectionOutput, Normalize, Permute,
Interp, Upsample, ROIPooling, ShuffleChannel, ReLU6, the recurrent layers; ops_landed: the
depthwise convolutions, Im2col, Axpy, BN, BatchReindex, Filter, Reverse, Transpose, LSTMUnit, Lstm,
Unpooling) only needs to be listed
in :data:`CONVERTER_MODULES`; its functions register themselves when the exporter imports it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .graph import LayerContext

Converter = Callable[["LayerContext"], list[str]]

CONVERTERS: dict[str, Converter] = {}

# Modules of this package whose converters register themselves on import.
CONVERTER_MODULES = ("ops_vision", "ops_neuron", "ops_norm", "ops_shape", "ops_fork", "ops_landed")

# Layer types left out of a deploy graph, with the reason shown in the export notes.
DROPPED: dict[str, str] = {
    "Accuracy": "an evaluation layer (needs labels)",
    "DetectionEvaluate": "an evaluation layer (needs ground-truth boxes)",
    "Silence": "consumes blobs without output",
    "HDF5Output": "writes files, not part of inference",
}
# Layer types whose top has a data-dependent size: {type: {axis: symbolic name}} for the output's shape.
SYMBOLIC_DIMS: dict[str, dict[int, str]] = {"DetectionOutput": {2: "detections"}, "Filter": {0: "selected"}}
# Data layers: their tops become graph inputs (shapes from the net as built).
DATA_LAYERS = frozenset({"Data", "ImageData", "HDF5Data", "MemoryData", "DummyData", "WindowData",
                         "AnnotatedData", "VideoData", "Python"})


def exports(*types: str) -> Callable[[Converter], Converter]:
    """Register the decorated function as the converter of the given Caffe layer type(s)."""

    def register(fn: Converter) -> Converter:
        for t in types:
            if t in CONVERTERS:
                raise ValueError(f"ONNX converter for layer type '{t}' registered twice")
            CONVERTERS[t] = fn
        return fn

    return register


_loaded = False


def load_converters() -> dict[str, Converter]:
    """Import every converter module once; returns the registry."""
    global _loaded
    if not _loaded:
        for name in CONVERTER_MODULES:
            importlib.import_module(f"{__package__}.{name}")
        _loaded = True
    return CONVERTERS
