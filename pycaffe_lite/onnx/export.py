"""Walk a built :class:`~pycaffe_lite.net.Net` layer by layer and write its ONNX graph.

Names: graph inputs are the Caffe input blobs. The value computed by a layer for top ``t`` is
named ``t`` when that layer is the last one to write ``t`` (so outputs keep their Caffe names and
a name means what ``net.blobs[t]`` holds after forward), else ``t/<layer>``: an in-place chain
``conv1 -> relu1`` becomes ``conv1/conv1`` (before the ReLU) and ``conv1`` (after it). Split and
TEST-time Dropout add no node: their tops share the bottom's value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import onnx

from . import fold
from .graph import MIN_OPSET, ExportError, GraphBuilder, LayerContext
from .registry import DATA_LAYERS, DROPPED, SYMBOLIC_DIMS, load_converters

BATCH = "N"


@dataclass
class BlobRow:
    """One top of one Caffe layer and the ONNX value that holds it (None: not exported)."""

    index: int  # the layer's index in the net
    top_index: int
    layer: str
    type: str
    top: str
    value: str | None
    note: str = ""


@dataclass
class Exported:
    model: onnx.ModelProto
    inputs: dict[str, tuple[int, ...]]  # graph input -> the shape the net was built with
    outputs: list[str]
    rows: list[BlobRow]
    notes: list[str] = field(default_factory=list)
    fp16: bool = False
    dynamic_batch: bool = False
    folded: bool = False  # some BatchNorm was folded (fold_bn)


def _check_opset(opset: int) -> None:
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ExportError(f"opset {opset}: this exporter writes opsets {MIN_OPSET} to {newest} "
                          f"(the installed onnx's newest)")


def build(net, opset: int = 17, dynamic_batch: bool = False, fp16: bool = False,
          fold_bn: bool = False) -> Exported:
    """The ONNX model of ``net`` at its current blob shapes (reshape the net first to export another
    input shape). ``fold_bn``: BatchNorm (+ Scale) folded into the convolution before it, or into
    one BatchNormalization (:mod:`.fold`). Raises :class:`ExportError` naming the first layer that
    cannot be written."""
    _check_opset(opset)
    groups = fold.plan(net) if fold_bn else {}
    folded_into = {m: members[-1] for members in groups.values() for m in [*members[:-1]]}
    folded_into.update({head: members[-1] for head, members in groups.items()})
    last_members = {members[-1] for members in groups.values()}
    converters = load_converters()
    g = GraphBuilder(opset, fp16)
    n = len(net.layers)
    tops_of = [net.top_names_of(i) for i in range(n)]
    bottoms_of = [net.bottom_names_of(i) for i in range(n)]
    last_writer: dict[str, int] = {}
    for i in range(n):
        for t in tops_of[i]:
            last_writer[t] = i
    input_layers = [i for i, layer in enumerate(net.layers)
                    if layer.type == "Input" or (layer.type in DATA_LAYERS and not bottoms_of[i])]
    input_names = {t for i in input_layers for t in tops_of[i]}
    out_names: list[list[str]] = []
    for i, layer in enumerate(net.layers):
        names = []
        for t in tops_of[i]:
            names.append(t if last_writer[t] == i and (t not in input_names or i in input_layers)
                         else f"{t}/{layer.name}")
        out_names.append(names)
    g.used.update(name for names in out_names for name in names)

    values: dict[str, str] = {}
    rows: list[BlobRow] = []
    notes: list[str] = []
    inputs: dict[str, tuple[int, ...]] = {}
    consumed_by_dropped: list[str] = []
    for i, layer in enumerate(net.layers):
        lt, name = layer.type, layer.name
        tops, bottoms = tops_of[i], bottoms_of[i]
        if i in input_layers:
            for j, t in enumerate(tops):
                shape = tuple(net.blobs[t].shape)
                dims: list[int | str] = list(shape)
                if dynamic_batch and dims:
                    dims[0] = BATCH
                g.inputs.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, dims))
                inputs[t] = shape
                values[t] = t
                rows.append(BlobRow(i, j, name, lt, t, t, "graph input"))
            if lt != "Input":
                notes.append(f"layer '{name}' ({lt}): a data layer; its tops {tops} are graph inputs")
            continue
        if getattr(layer, "is_loss", False) or lt in DROPPED:
            why = DROPPED.get(lt, "a loss layer (training only)")
            notes.append(f"layer '{name}' ({lt}) left out: {why}")
            consumed_by_dropped.extend(b for b in bottoms if b in values)
            for j, t in enumerate(tops):
                rows.append(BlobRow(i, j, name, lt, t, None, "left out"))
            continue
        if i in folded_into:  # the head or a middle member of a folded group: no value of its own
            last = net.layers[folded_into[i]].name
            for j, t in enumerate(tops):
                rows.append(BlobRow(i, j, name, lt, t, None, f"folded into '{last}'"))
            if i not in groups:
                continue
        if i in last_members:
            continue  # the last member of a folded group: written with its head
        for b in bottoms:
            if b not in values:
                raise ExportError(f"layer '{name}' ({lt}): its bottom '{b}' comes from a layer that is not "
                                  "exported (a loss, evaluation or dropped layer)")
        conv = converters.get(lt)
        if conv is None:
            raise ExportError(f"layer '{name}' ({lt}): no ONNX converter for layer type '{lt}'")
        ctx = LayerContext(
            g=g, layer=layer, bottoms=[values[b] for b in bottoms],
            bottom_shapes=[tuple(blob.shape) for blob in net.bottom_vecs[i]],
            top_shapes=[tuple(blob.shape) for blob in net.top_vecs[i]],
            out_names=out_names[i], dynamic_batch=dynamic_batch, notes=notes,
            bottom_blobs=list(net.bottom_vecs[i]), top_blobs=list(net.top_vecs[i]),
        )
        if i in groups:
            last = groups[i][-1]
            ctx.out_names = out_names[last]
            v = fold.convert(ctx, [net.layers[m] for m in groups[i]])[0]
            t = tops_of[last][0]
            values[t] = v
            rows.append(BlobRow(last, 0, net.layers[last].name, net.layers[last].type, t, v, f"folded from '{name}'"))
            continue
        outs = conv(ctx)
        if len(outs) != len(tops):
            raise ExportError(f"layer '{name}' ({lt}): the converter gave {len(outs)} values for {len(tops)} tops")
        for j, (t, v) in enumerate(zip(tops, outs)):
            values[t] = v
            rows.append(BlobRow(i, j, name, lt, t, v, "" if v == out_names[i][j] else f"= {v}"))

    wanted = [t for t in net.outputs if t in values]
    wanted += [t for t in dict.fromkeys(consumed_by_dropped) if t not in wanted and not t.startswith("(")]
    wanted = [t for t in _unsplit(net, wanted) if t not in input_names]
    if not wanted:
        raise ExportError(f"net '{net.name}': nothing to export (no output blob survives)")
    outputs = []
    for t in wanted:
        v = values[t]
        if v != t and t not in input_names and not _produced(g, t):
            g.node("Identity", [v], [t], f"{t}/output")
            v = t
        if v in outputs:
            continue
        out_shape: list[int | str] = list(net.blobs[t].shape)
        if dynamic_batch and out_shape and inputs and out_shape[0] == next(iter(inputs.values()))[0]:
            out_shape[0] = BATCH
        for axis, sym in SYMBOLIC_DIMS.get(net.layers[last_writer[t]].type, {}).items():
            out_shape[axis] = sym
        g.add_output(v, out_shape)
        outputs.append(v)
    used_inputs = {x for node in g.nodes for x in node.input} | set(outputs)
    for vi in list(g.inputs):
        if vi.name not in used_inputs:
            g.inputs.remove(vi)
            del inputs[vi.name]
            notes.append(f"graph input '{vi.name}' dropped: no exported layer reads its values")
            for r in rows:
                if r.value == vi.name:
                    r.value, r.note = None, "input not read (shape only)"
    rows.sort(key=lambda r: (r.index, r.top_index))
    model = g.model(net.name, doc=f"exported by pycaffe-lite from Caffe net '{net.name}'")
    return Exported(model, inputs, outputs, rows, notes, fp16, dynamic_batch, bool(groups))


def _produced(g: GraphBuilder, name: str) -> bool:
    return any(name in node.output for node in g.nodes)


def _unsplit(net, names: Sequence[str]) -> list[str]:
    """Blob names with the automatic split tops (``x_..._split_i``) replaced by their source."""
    source: dict[str, str] = {}
    for i, layer in enumerate(net.layers):
        if layer.type == "Split":
            b = net.bottom_names_of(i)[0]
            for t in net.top_names_of(i):
                source[t] = source.get(b, b)
    return list(dict.fromkeys(source.get(t, t) for t in names))


def reshape_inputs(net, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Give the net's input blobs new shapes (and propagate them); returns the old shapes."""
    old = {}
    for name, shape in shapes.items():
        if name not in net.blobs or name not in net.inputs:
            raise ExportError(f"input shape override: '{name}' is not an input of net '{net.name}' "
                              f"(inputs: {', '.join(net.inputs)})")
        old[name] = tuple(net.blobs[name].shape)
        net.blobs[name].reshape(tuple(int(d) for d in shape))
    if old:
        net.reshape()
    return old
