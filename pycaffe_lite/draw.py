"""Draw a NetParameter as a graph (BVLC's ``caffe.draw``), with pydot and Graphviz.

Layers are boxes (colored by type; in-place neuron layers green), blobs are octagons, edges go
bottom -> layer -> top. ``phase`` keeps only the layers of that phase; ``display_lrm`` adds each
layer's learning-rate and decay multipliers.
"""

from __future__ import annotations

import shutil

from .optional import require
from .schema import caffe_pb2

LAYER_STYLE_DEFAULT = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": "#90EE90", "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": "#E0E0E0", "style": "filled"}


def _pydot():
    return require("pydot", feature="drawing nets (with Graphviz)")


def _require_dot() -> None:
    if shutil.which("dot") is None:
        raise RuntimeError(
            "drawing nets needs the Graphviz 'dot' program on PATH "
            "(e.g. apt-get install graphviz / brew install graphviz)"
        )


def get_pooling_types_dict() -> dict[int, str]:
    """Pooling method number -> name (0 -> 'MAX')."""
    desc = caffe_pb2.PoolingParameter.PoolMethod.DESCRIPTOR
    return {v.number: name for name, v in desc.values_by_name.items()}


def get_edge_label(layer: caffe_pb2.LayerParameter) -> str:
    """Label of a layer's output edges: batch size of data layers, num_output of conv/ip."""
    if layer.type == "Data":
        return f"Batch {layer.data_param.batch_size}"
    if layer.type in ("Convolution", "Deconvolution"):
        return str(layer.convolution_param.num_output)
    if layer.type == "InnerProduct":
        return str(layer.inner_product_param.num_output)
    return '""'


def _first(values, default: int) -> int:
    return int(values[0]) if len(values) else default


def get_layer_lr_mult(layer: caffe_pb2.LayerParameter) -> tuple[float, float]:
    """(lr_mult, decay_mult) of the first param of conv/ip layers (1, 1 when unset)."""
    if layer.type in ("Convolution", "Deconvolution", "InnerProduct") and len(layer.param):
        return layer.param[0].lr_mult, layer.param[0].decay_mult
    return 1.0, 1.0


def get_layer_label(layer: caffe_pb2.LayerParameter, rankdir: str, display_lrm: bool = False) -> str:
    """Node label: name and type, plus kernel/stride/pad for conv and pooling layers."""
    sep = " " if rankdir in ("TB", "BT") else "\\n"
    if layer.type in ("Convolution", "Deconvolution"):
        p = layer.convolution_param
        kernel = _first(p.kernel_size, p.kernel_h if p.HasField("kernel_h") else 1)
        label = (
            f"{layer.name}{sep}({layer.type}){sep}kernel size: {kernel}{sep}"
            f"stride: {_first(p.stride, 1)}{sep}pad: {_first(p.pad, 0)}"
        )
    elif layer.type == "Pooling":
        p = layer.pooling_param
        kernel = p.kernel_size if p.HasField("kernel_size") else p.kernel_h
        label = (
            f"{layer.name}{sep}({get_pooling_types_dict()[p.pool]} {layer.type}){sep}"
            f"kernel size: {kernel}{sep}stride: {p.stride}{sep}pad: {p.pad}"
        )
    else:
        label = f"{layer.name}{sep}({layer.type})"
    if display_lrm:
        lr_mult, decay_mult = get_layer_lr_mult(layer)
        label += f"{sep}lr mult: {lr_mult:g}{sep}decay mult: {decay_mult:g}"
    return f'"{label}"'


def choose_color_by_layertype(layertype: str) -> str:
    return {
        "Convolution": "#FF5050",
        "Deconvolution": "#FF5050",
        "Pooling": "#FF9900",
        "InnerProduct": "#CC33FF",
    }.get(layertype, "#6495ED")


def _in_phase(layer: caffe_pb2.LayerParameter, phase: int | None) -> bool:
    if phase is None:
        return True
    if len(layer.include) and len(layer.exclude):
        raise ValueError(f"layer '{layer.name}' has both include and exclude specified")
    included = not len(layer.include) or any(r.phase == phase for r in layer.include if r.HasField("phase"))
    return included and not any(r.HasField("phase") and r.phase == phase for r in layer.exclude)


def get_pydot_graph(
    caffe_net: caffe_pb2.NetParameter,
    rankdir: str,
    label_edges: bool = True,
    phase: int | None = None,
    display_lrm: bool = False,
):
    """A ``pydot.Dot`` graph of ``caffe_net`` (rankdir: 'LR', 'TB', 'BT' or 'RL')."""
    pydot = _pydot()
    graph = pydot.Dot(caffe_net.name or "Net", graph_type="digraph", rankdir=rankdir)
    nodes: dict[str, object] = {}
    edges: list[tuple[str, str, str]] = []
    for layer in caffe_net.layer:
        if not _in_phase(layer, phase):
            continue
        node = f"{layer.name}_{layer.type}"
        label = get_layer_label(layer, rankdir, display_lrm)
        if len(layer.bottom) == 1 and len(layer.top) == 1 and layer.bottom[0] == layer.top[0]:
            style = NEURON_LAYER_STYLE
        else:
            style = dict(LAYER_STYLE_DEFAULT, fillcolor=choose_color_by_layertype(layer.type))
        nodes[node] = pydot.Node(node, label=label, **style)
        for bottom in layer.bottom:
            nodes[bottom + "_blob"] = pydot.Node(bottom + "_blob", label=f'"{bottom}"', **BLOB_STYLE)
            edges.append((bottom + "_blob", node, '""'))
        for top in layer.top:
            nodes[top + "_blob"] = pydot.Node(top + "_blob", label=f'"{top}"', **BLOB_STYLE)
            edges.append((node, top + "_blob", get_edge_label(layer) if label_edges else '""'))
    for pd_node in nodes.values():
        graph.add_node(pd_node)
    for src, dst, label in edges:
        graph.add_edge(pydot.Edge(nodes[src], nodes[dst], label=label))
    return graph


def draw_net(
    caffe_net: caffe_pb2.NetParameter,
    rankdir: str,
    ext: str = "png",
    phase: int | None = None,
    display_lrm: bool = False,
) -> bytes:
    """The drawing of ``caffe_net`` encoded as ``ext`` (png, svg, pdf, dot...; 'raw': dot source)."""
    graph = get_pydot_graph(caffe_net, rankdir, phase=phase, display_lrm=display_lrm)
    if ext == "raw":
        return graph.to_string().encode()
    _require_dot()
    return graph.create(format=ext)


def draw_net_to_file(
    caffe_net: caffe_pb2.NetParameter,
    filename: str,
    rankdir: str = "LR",
    phase: int | None = None,
    display_lrm: bool = False,
) -> None:
    """Draw ``caffe_net`` into ``filename``; the format is the file's extension ('.raw': dot source)."""
    ext = str(filename)[str(filename).rfind(".") + 1 :]
    data = draw_net(caffe_net, rankdir, ext, phase=phase, display_lrm=display_lrm)
    with open(filename, "wb") as fh:
        fh.write(data)
