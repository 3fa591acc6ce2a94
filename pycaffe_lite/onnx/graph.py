"""The ONNX graph under construction (:class:`GraphBuilder`) and the view a converter gets of one
Caffe layer (:class:`LayerContext`). Built with ``onnx.helper`` only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import CaffeError

MIN_OPSET = 13
DEFAULT_OPSET = 17


def fp16_stored(shape: Sequence[int]) -> bool:
    """Whether ``fp16`` stores a float tensor of this shape as float16: weights (two or more axes
    longer than 1: kernels, matrices, tables); vectors and scalars (biases, statistics, scales,
    slopes) stay float32, so that every stored value is a param blob's value rounded once."""
    return sum(1 for d in shape if d > 1) >= 2


class ExportError(CaffeError):
    """A net (or one of its layers) that cannot be written as ONNX."""


class CheckError(CaffeError):
    """ONNX Runtime's results differ from pycaffe-lite's forward (names the first diverging layer)."""


class GraphBuilder:
    """Nodes, initializers and unique value names of the graph being written."""

    def __init__(self, opset: int = DEFAULT_OPSET, fp16: bool = False) -> None:
        self.opset = opset
        self.fp16 = fp16
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.used: set[str] = set()
        self._counts: dict[str, int] = {}
        self._node_names: set[str] = set()

    def unique(self, base: str) -> str:
        """``base`` if no value, initializer or node output has it yet, else ``base_2``, ``base_3``..."""
        name = base
        while name in self.used:
            self._counts[base] = self._counts.get(base, 1) + 1
            name = f"{base}_{self._counts[base]}"
        self.used.add(name)
        return name

    def reserve(self, name: str) -> None:
        if name in self.used:
            raise ExportError(f"ONNX value name '{name}' is used twice")
        self.used.add(name)

    def add_input(self, name: str, shape: Sequence[int | str]) -> None:
        self.reserve(name)
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))

    def add_output(self, name: str, shape: Sequence[int | str] | None) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                          None if shape is None else list(shape)))

    def const(self, base: str, array: Any, dtype: Any = np.float32, exact: bool = False) -> str:
        """An initializer holding ``array`` (float32 unless ``dtype``; int64 for shapes and axes).
        With ``fp16``, weights (:func:`fp16_stored`) are stored as float16 and cast back to
        float32 by a Cast node (about half the file, the same graph); ``exact``: a constant the
        converter computed (not a param blob, which the check rounds too), always float32."""
        arr = np.asarray(array, dtype=dtype)
        if self.fp16 and not exact and arr.dtype == np.float32 and fp16_stored(arr.shape):
            stored = self.unique(base + "/fp16")
            self.initializers.append(numpy_helper.from_array(arr.astype(np.float16), stored))
            name = self.unique(base)
            self.nodes.append(helper.make_node("Cast", [stored], [name], name=name + "/cast",
                                               to=TensorProto.FLOAT))
            return name
        name = self.unique(base)
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: str, **attrs) -> None:
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=self.unique_node(name),
                                           **attrs))

    def unique_node(self, name: str) -> str:
        base, i = name, 1
        while name in self._node_names:
            i += 1
            name = f"{base}_{i}"
        self._node_names.add(name)
        return name

    def model(self, graph_name: str, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name or "net", self.inputs, self.outputs,
                                  initializer=self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="pycaffe-lite", doc_string=doc)
        model.ir_version = min(model.ir_version, _ir_version_for(self.opset))
        return model


def _ir_version_for(opset: int) -> int:
    """The IR version that goes with ``opset`` (ONNX Runtime refuses files newer than it knows)."""
    table = {13: 7, 14: 7, 15: 8, 16: 8, 17: 8, 18: 8, 19: 9, 20: 9, 21: 10, 22: 10}
    return table.get(opset, onnx.IR_VERSION)


@dataclass
class LayerContext:
    """One Caffe layer as a converter sees it."""

    g: GraphBuilder
    layer: Any  # pycaffe_lite.layer.Layer
    bottoms: list[str]  # ONNX values of the bottoms
    bottom_shapes: list[tuple[int, ...]]
    top_shapes: list[tuple[int, ...]]
    out_names: list[str]  # the names the tops' values should get
    dynamic_batch: bool = False
    notes: list[str] = field(default_factory=list)
    bottom_blobs: list[Any] | None = None  # the net's Blobs (for layers whose output is a constant)
    top_blobs: list[Any] | None = None

    @property
    def name(self) -> str:
        return str(self.layer.name)

    @property
    def type(self) -> str:
        return str(self.layer.type)

    @property
    def lp(self) -> Any:
        return self.layer.layer_param

    @property
    def opset(self) -> int:
        return self.g.opset

    def error(self, message: str) -> ExportError:
        return ExportError(f"layer '{self.name}' ({self.type}): {message}")

    def out(self, i: int = 0) -> str:
        """The value name of top ``i`` (give it to the node that computes that top)."""
        return self.out_names[i]  # reserved by the exporter

    def param(self, i: int) -> np.ndarray:
        """Param blob ``i`` of the layer as float64 values (a copy; half params through
        ``math_data()``: bfloat16 ones are uint16 bit patterns on the host)."""
        if i >= len(self.layer.blobs):
            raise self.error(f"has {len(self.layer.blobs)} param blobs, expected at least {i + 1}")
        return np.array(self.layer.blobs[i].math_data(), dtype=np.float64)

    def tmp(self, what: str) -> str:
        return self.g.unique(f"{self.name}/{what}")

    def const(self, what: str, array: Any, dtype: Any = np.float32, exact: bool = False) -> str:
        return self.g.const(f"{self.name}/{what}", array, dtype, exact)

    def ints(self, what: str, values: Sequence[int]) -> str:
        return self.g.const(f"{self.name}/{what}", np.asarray(list(values), dtype=np.int64), np.int64)

    def op(self, op_type: str, inputs: Sequence[str], out: str | Sequence[str] | None = None,
           n_out: int = 1, **attrs) -> str:
        """Add a node; returns its (first) output value. ``out``: the output name(s); default fresh
        names ``<layer>/<op>``."""
        if out is None:
            outs = [self.tmp(op_type.lower()) for _ in range(n_out)]
        elif isinstance(out, str):
            outs = [out]
        else:
            outs = list(out)
        self.g.node(op_type, inputs, outs, f"{self.name}/{op_type}", **attrs)
        return outs[0]

    def ops(self, op_type: str, inputs: Sequence[str], outs: Sequence[str], **attrs) -> list[str]:
        self.g.node(op_type, inputs, outs, f"{self.name}/{op_type}", **attrs)
        return list(outs)

    # -- helpers whose form depends on the opset ---------------------------------------------
    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: bool, out: str | None = None) -> str:
        """ReduceSum/Mean/Max/L1/SumSquare over ``axes`` (attribute before opset 18, input after;
        ReduceSum takes the input form from opset 13)."""
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.op(op_type, [x, self.ints("axes", axes)], out, keepdims=int(keepdims))
        return self.op(op_type, [x], out, axes=list(axes), keepdims=int(keepdims))

    def shape_target(self, shape: Sequence[int], batch_from: Sequence[int] | None = None) -> str:
        """An int64 Reshape target for the static ``shape``. With a dynamic batch the first
        dimension is written 0 (copy the input's, when it equals ``batch_from[0]``) or -1 (inferred)."""
        dims = [int(d) for d in shape]
        if self.dynamic_batch and dims:
            dims[0] = 0 if batch_from and dims[0] == batch_from[0] else -1
        return self.ints("shape", dims)

    def reshape(self, x: str, shape: Sequence[int], batch_from: Sequence[int] | None = None,
                out: str | None = None) -> str:
        return self.op("Reshape", [x, self.shape_target(shape, batch_from)], out)

    def broadcast_shape(self, axis: int, covered: Sequence[int], ndim: int) -> list[int]:
        """The shape that broadcasts an operand covering axes ``[axis, axis + len(covered))`` of an
        ``ndim``-axis blob against it (trailing 1s; leading axes left to broadcasting)."""
        return list(covered) + [1] * (ndim - axis - len(covered))
