"""The layer-by-layer recheck of the export check: each blob that differs end to end is compared once
more with the ONNX nodes of its own layer run on pycaffe-lite's values of that layer's bottoms.

End to end, float32 rounding differences of two runtimes (different summation orders in every
convolution) are carried from layer to layer; in a deep normalized net (MobileNet v2's 50 blocks)
they grow to about 1e-5 of a blob's range by the last layers, and a range-cutting layer (ReLU6's
Clip(0, 6), a max-pooling mask choosing between near ties) shows what it inherited relative to its
own, smaller range. Run on the exact inputs the layer saw in our forward, its nodes must agree
within the same tolerance: the row is then ``ok (layer)`` with the layer's own difference in its
detail (``layer alone 2.4e-07``); otherwise it stays ``MISMATCH`` (the converter, or a semantics
difference, is wrong there). A layer whose bottoms' values are not all in the graph (folded
BatchNorms, nodes with subgraphs such as the recurrent layers' Scan) is not rechecked.

The subgraph of a layer: walking back from its tops' ONNX values over their producing nodes,
stopping at the values of its bottoms (fed with our values), graph inputs (fed with the check's
inputs) and initializers (taken along). One more Caffe forward runs it: before each rechecked
layer its bottoms are read and its subgraph is run in ONNX Runtime; after the layer its tops are
compared. Nothing but one layer's values is held at a time.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper

from ..blob import to_math
from .export import Exported
from .runs import CheckRow, OrtRunner, caffe_forward, compare_value


class _Plan:
    """The subgraph of one layer: which bottom feeds which cut value, the model, its outputs."""

    def __init__(self, cut: dict[str, int], inputs: list[str], outputs: list[str], model: bytes | None) -> None:
        self.cut, self.inputs, self.outputs, self.model = cut, inputs, outputs, model


def _plans(net, exported: Exported, rows: list[CheckRow]) -> dict[int, _Plan]:
    """{layer index: its subgraph} for the layers of ``rows`` (the MISMATCH rows) that can be rechecked."""
    graph = exported.model.graph
    producer: dict[str, int] = {}
    for k, node in enumerate(graph.node):
        for o in node.output:
            producer[o] = k
    inits = {t.name: t for t in graph.initializer}
    graph_inputs = {i.name for i in graph.input}
    wanted: dict[int, list[CheckRow]] = {}
    for cr in rows:
        if "folded" not in cr.row.note:
            wanted.setdefault(cr.row.index, []).append(cr)
    value_of: dict[str, str] = {}  # blob -> its ONNX value so far, in layer order
    plans: dict[int, _Plan] = {}
    by_layer: dict[int, list] = {}
    for r in exported.rows:
        by_layer.setdefault(r.index, []).append(r)
    for i in sorted(by_layer):
        if i in wanted:
            cut: dict[str, int] = {}
            complete = True
            for b, name in enumerate(net.bottom_names_of(i)):
                v = value_of.get(name)
                if v is None:
                    complete = False
                    break
                cut.setdefault(v, b)
            if complete:
                plan = _subgraph(exported, [str(cr.row.value) for cr in wanted[i]], cut, producer, inits,
                                 graph_inputs)
                if plan is not None:
                    plans[i] = plan
        for r in by_layer[i]:
            if r.value is not None:
                value_of[r.top] = r.value
    return plans


def _subgraph(exported: Exported, targets: list[str], cut: dict[str, int], producer: dict[str, int],
              inits: Mapping[str, onnx.TensorProto], graph_inputs: set[str]) -> _Plan | None:
    graph = exported.model.graph
    nodes: set[int] = set()
    used_inits: dict[str, onnx.TensorProto] = {}
    used_inputs: list[str] = []
    fed_cut: list[str] = []
    stack = [t for t in dict.fromkeys(targets) if t not in cut]
    seen = set(stack)
    while stack:
        v = stack.pop()
        if v in inits:
            used_inits[v] = inits[v]
            continue
        if v in graph_inputs:
            used_inputs.append(v)
            continue
        k = producer.get(v)
        if k is None:
            return None
        node = graph.node[k]
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None  # a subgraph may read outer values implicitly
        nodes.add(k)
        for x in node.input:
            if not x or x in seen:
                continue
            seen.add(x)
            if x in cut:
                fed_cut.append(x)
            else:
                stack.append(x)
    outputs = [t for t in dict.fromkeys(targets) if t not in cut]
    if not outputs:
        return _Plan(cut, [], [], None)
    inputs = list(dict.fromkeys(fed_cut + used_inputs))
    g = helper.make_graph([graph.node[k] for k in sorted(nodes)], "layer",
                          [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None) for x in inputs],
                          [helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None) for t in outputs],
                          initializer=list(used_inits.values()))
    model = helper.make_model(g, opset_imports=list(exported.model.opset_import))
    model.ir_version = exported.model.ir_version
    return _Plan(cut, inputs, outputs, model.SerializeToString())


def recheck_layers(net, exported: Exported, runner: OrtRunner, feeds: Mapping[str, np.ndarray],
                   compared: list[CheckRow], tol: float) -> None:
    """Recheck the MISMATCH rows of ``compared`` layer by layer (module docstring), in place."""
    failing = [cr for cr in compared if cr.verdict == "MISMATCH"]
    plans = _plans(net, exported, failing)
    if not plans:
        return
    by_top: dict[tuple[int, int], list[CheckRow]] = {}
    for cr in failing:
        if cr.row.index in plans:
            by_top.setdefault((cr.row.index, cr.row.top_index), []).append(cr)
    local: dict[str, np.ndarray] = {}

    def before(i: int) -> None:
        plan = plans.get(i)
        if plan is None:
            return
        local.clear()
        bottoms = net.bottom_vecs[i]
        values = {v: np.array(to_math(bottoms[b].cpu_data()), np.float32) for v, b in plan.cut.items()}
        local.update(values)
        if plan.model is not None:
            sess = runner.session(plan.model)
            run_feeds = {x: values[x] if x in values else np.ascontiguousarray(feeds[x], np.float32)
                         for x in plan.inputs}
            local.update(zip(plan.outputs, sess.run(plan.outputs, run_feeds)))

    def visit(i: int, j: int, value: np.ndarray) -> None:
        for cr in by_top.get((i, j), ()):
            alone = CheckRow(cr.row)
            compare_value(alone, value, local.get(str(cr.row.value)), tol)
            cr.detail = f"layer alone {alone.rel:.3g}"
            if alone.verdict.startswith("ok"):
                cr.verdict = "ok (layer)"

    caffe_forward(net, feeds, visit, before=before)
