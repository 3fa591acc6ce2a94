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
    return _Exporter(net, opset, dynamic_batch, fp16, fold_bn).run()


class _Exporter:
    """One export: the layers in order (graph inputs, left out, folded or converted), then outputs."""

    def __init__(self, net, opset: int, dynamic_batch: bool, fp16: bool, fold_bn: bool) -> None:
        self.net, self.dynamic_batch, self.fp16 = net, dynamic_batch, fp16
        self.groups = fold.plan(net) if fold_bn else {}
        self.folded_into = {m: members[-1] for members in self.groups.values() for m in [*members[:-1]]}
        self.folded_into.update({head: members[-1] for head, members in self.groups.items()})
        self.last_members = {members[-1] for members in self.groups.values()}
        self.converters = load_converters()
        self.g = GraphBuilder(opset, fp16)
        n = len(net.layers)
        self.tops_of = [net.top_names_of(i) for i in range(n)]
        self.bottoms_of = [net.bottom_names_of(i) for i in range(n)]
        self.last_writer: dict[str, int] = {t: i for i in range(n) for t in self.tops_of[i]}
        self.input_layers = [i for i, layer in enumerate(net.layers)
                             if layer.type == "Input" or (layer.type in DATA_LAYERS and not self.bottoms_of[i])]
        self.input_names = {t for i in self.input_layers for t in self.tops_of[i]}
        self.out_names = [[t if self.last_writer[t] == i and (t not in self.input_names or i in self.input_layers)
                           else f"{t}/{layer.name}" for t in self.tops_of[i]]
                          for i, layer in enumerate(net.layers)]
        self.g.used.update(name for names in self.out_names for name in names)
        self.values: dict[str, str] = {}
        self.rows: list[BlobRow] = []
        self.notes: list[str] = []
        self.inputs: dict[str, tuple[int, ...]] = {}
        self.consumed_by_dropped: list[str] = []

    def run(self) -> Exported:
        net = self.net
        for i, layer in enumerate(net.layers):
            if i in self.input_layers:
                self._graph_inputs(i, layer)
            elif getattr(layer, "is_loss", False) or layer.type in DROPPED:
                self._left_out(i, layer)
            elif i in self.folded_into and i not in self.groups:  # a middle member of a folded group
                self._folded_rows(i, layer)
            elif i not in self.last_members:  # (the last member of a folded group: written with its head)
                if i in self.groups:
                    self._folded_rows(i, layer)
                self._convert(i, layer)
        outputs = self._outputs()
        self._drop_unread_inputs(outputs)
        self.rows.sort(key=lambda r: (r.index, r.top_index))
        model = self.g.model(net.name, doc=f"exported by pycaffe-lite from Caffe net '{net.name}'")
        return Exported(model, self.inputs, outputs, self.rows, self.notes, self.fp16, self.dynamic_batch,
                        bool(self.groups))

    def _graph_inputs(self, i: int, layer) -> None:
        lt, name, tops = layer.type, layer.name, self.tops_of[i]
        for j, t in enumerate(tops):
            shape = tuple(self.net.blobs[t].shape)
            dims: list[int | str] = list(shape)
            if self.dynamic_batch and dims:
                dims[0] = BATCH
            self.g.inputs.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, dims))
            self.inputs[t] = shape
            self.values[t] = t
            self.rows.append(BlobRow(i, j, name, lt, t, t, "graph input"))
        if lt != "Input":
            self.notes.append(f"layer '{name}' ({lt}): a data layer; its tops {tops} are graph inputs")

    def _left_out(self, i: int, layer) -> None:
        lt, name = layer.type, layer.name
        why = DROPPED.get(lt, "a loss layer (training only)")
        self.notes.append(f"layer '{name}' ({lt}) left out: {why}")
        self.consumed_by_dropped.extend(b for b in self.bottoms_of[i] if b in self.values)
        for j, t in enumerate(self.tops_of[i]):
            self.rows.append(BlobRow(i, j, name, lt, t, None, "left out"))

    def _folded_rows(self, i: int, layer) -> None:
        """The head or a middle member of a folded group: no value of its own."""
        last = self.net.layers[self.folded_into[i]].name
        for j, t in enumerate(self.tops_of[i]):
            self.rows.append(BlobRow(i, j, layer.name, layer.type, t, None, f"folded into '{last}'"))

    def _convert(self, i: int, layer) -> None:
        net, lt, name = self.net, layer.type, layer.name
        tops, bottoms = self.tops_of[i], self.bottoms_of[i]
        for b in bottoms:
            if b not in self.values:
                raise ExportError(f"layer '{name}' ({lt}): its bottom '{b}' comes from a layer that is not "
                                  "exported (a loss, evaluation or dropped layer)")
        conv = self.converters.get(lt)
        if conv is None:
            raise ExportError(f"layer '{name}' ({lt}): no ONNX converter for layer type '{lt}'")
        ctx = LayerContext(
            g=self.g, layer=layer, bottoms=[self.values[b] for b in bottoms],
            bottom_shapes=[tuple(blob.shape) for blob in net.bottom_vecs[i]],
            top_shapes=[tuple(blob.shape) for blob in net.top_vecs[i]],
            out_names=self.out_names[i], dynamic_batch=self.dynamic_batch, notes=self.notes,
            bottom_blobs=list(net.bottom_vecs[i]), top_blobs=list(net.top_vecs[i]),
        )
        if i in self.groups:
            last = self.groups[i][-1]
            ctx.out_names = self.out_names[last]
            v = fold.convert(ctx, [net.layers[m] for m in self.groups[i]])[0]
            t = self.tops_of[last][0]
            self.values[t] = v
            self.rows.append(BlobRow(last, 0, net.layers[last].name, net.layers[last].type, t, v,
                                     f"folded from '{name}'"))
            return
        outs = conv(ctx)
        if len(outs) != len(tops):
            raise ExportError(f"layer '{name}' ({lt}): the converter gave {len(outs)} values for {len(tops)} tops")
        for j, (t, v) in enumerate(zip(tops, outs)):
            self.values[t] = v
            self.rows.append(BlobRow(i, j, name, lt, t, v, "" if v == self.out_names[i][j] else f"= {v}"))

    def _outputs(self) -> list[str]:
        """The net's outputs (and what dropped layers read) as graph outputs named after their tops."""
        net, g, values = self.net, self.g, self.values
        wanted = [t for t in net.outputs if t in values]
        wanted += [t for t in dict.fromkeys(self.consumed_by_dropped) if t not in wanted and not t.startswith("(")]
        wanted = [t for t in _unsplit(net, wanted) if t not in self.input_names]
        if not wanted:
            raise ExportError(f"net '{net.name}': nothing to export (no output blob survives)")
        outputs: list[str] = []
        for t in wanted:
            v = values[t]
            if v != t and t not in self.input_names and not _produced(g, t):
                g.node("Identity", [v], [t], f"{t}/output")
                v = t
            if v in outputs:
                continue
            out_shape: list[int | str] = list(net.blobs[t].shape)
            if self.dynamic_batch and out_shape and self.inputs \
                    and out_shape[0] == next(iter(self.inputs.values()))[0]:
                out_shape[0] = BATCH
            for axis, sym in SYMBOLIC_DIMS.get(net.layers[self.last_writer[t]].type, {}).items():
                out_shape[axis] = sym
            g.add_output(v, out_shape)
            outputs.append(v)
        return outputs

    def _drop_unread_inputs(self, outputs: list[str]) -> None:
        used_inputs = {x for node in self.g.nodes for x in node.input} | set(outputs)
        for vi in list(self.g.inputs):
            if vi.name not in used_inputs:
                self.g.inputs.remove(vi)
                del self.inputs[vi.name]
                self.notes.append(f"graph input '{vi.name}' dropped: no exported layer reads its values")
                for r in self.rows:
                    if r.value == vi.name:
                        r.value, r.note = None, "input not read (shape only)"


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
