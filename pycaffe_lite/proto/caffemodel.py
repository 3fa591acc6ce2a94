"""Net weights in ``.caffemodel`` files (binary NetParameter), read into and written from a built
:class:`~pycaffe_lite.net_graph.NetGraph` (Caffe's ``Net::ToProto``, ``CopyTrainedLayersFrom``,
``ShareTrainedLayersWith``). HDF5 weights are :mod:`.hdf5_weights`; ``copy_from`` reads either,
telling them apart by the file's signature as Caffe does.

Layers are matched by name; with duplicate names the first layer of the name gets the weights (BVLC's
linear search), and file layers that match no net layer are ignored.
"""

from __future__ import annotations

import logging
import os

from ..errors import PrototxtError, ShapeError, WeightsError
from ..net_graph import NetGraph, warn_missing_weights
from ..schema import caffe_pb2
from . import hdf5_weights, protoio, upgrade

log = logging.getLogger("pycaffe_lite")


def to_proto(graph: NetGraph, write_diff: bool = False) -> caffe_pb2.NetParameter:
    """The net definition with each layer's learned blobs, as a .caffemodel holds it (no Splits)."""
    assert graph.param is not None
    out = caffe_pb2.NetParameter()
    out.name = graph.name
    for lp, layer in zip(graph.param.layer, graph.layers):
        if lp.type == "Split":
            continue
        entry = out.layer.add()
        entry.CopyFrom(lp)
        del entry.blobs[:]
        for blob in layer.blobs:
            blob.to_proto(write_diff, entry.blobs.add())
    return out


def copy_trained_layers(graph: NetGraph, param: caffe_pb2.NetParameter, source: str = "<weights>") -> list[str]:
    """Copy blobs layer by layer; layers absent from ``param`` keep theirs. Returns the names of the
    net's layers with parameters that got none (logged as a warning)."""
    upgrade.upgrade_net(param, source=source)
    filled: set[int] = set()
    targets: dict[str, int] = {}
    copies: dict[str, int] = {}
    for src in param.layer:
        target = graph.first_layer_index(src.name)
        if target is None:
            continue
        targets[src.name] = target
        copies[src.name] = copies.get(src.name, 0) + 1
        layer = graph.layers[target]
        if len(src.blobs) != len(layer.blobs):
            raise WeightsError(f"{source}: layer '{src.name}' has {len(src.blobs)} blobs in the file but "
                               f"{len(layer.blobs)} in the net")
        for i, (proto, blob) in enumerate(zip(src.blobs, layer.blobs)):
            try:
                blob.from_proto(proto, reshape=False, where=f"{source}: layer '{src.name}' param {i}")
            except (ShapeError, PrototxtError) as exc:  # PrototxtError: a raw blob of no float type
                raise WeightsError(f"cannot copy weights: {exc}") from None
        filled.add(target)
    missing = [n for i, (n, layer) in enumerate(zip(graph.layer_names, graph.layers)) if layer.blobs and i not in filled]
    warn_missing_weights(graph, source, missing, targets,
                         "a .caffemodel's weights go to the first net layer of a name, as in BVLC",
                         {name: n for name, n in copies.items() if n > 1})
    return missing


def copy_from(graph: NetGraph, path: str | os.PathLike, allow_missing: bool = True) -> list[str]:
    """Load weights from a .caffemodel (binary NetParameter) or an HDF5 file.

    An empty, truncated or non-caffemodel file is a WeightsError naming it. Returns the layers with
    parameters that got no weights (a warning lists them); with ``allow_missing=False`` they are a
    WeightsError instead."""
    path = str(path)
    protoio.check_regular_file(path, "weights file", WeightsError)
    if hdf5_weights.is_hdf5_file(path):  # by signature, as Caffe does
        return hdf5_weights.load(graph, path, allow_missing)
    try:
        param = protoio.read_binary(path, caffe_pb2.NetParameter(), "caffemodel")
    except Exception as exc:  # unreadable or corrupt file
        raise WeightsError(str(exc)) from None
    if not param.layer and not param.layers:
        size = os.path.getsize(path) if os.path.exists(path) else 0
        what = "an empty file" if size == 0 else f"{size} bytes holding no layers"
        raise WeightsError(f"{path}: not a caffemodel ({what}; expected a binary NetParameter with weights)")
    missing = copy_trained_layers(graph, param, source=path)
    if missing and not allow_missing:
        raise WeightsError(
            f"{path}: holds no weights for layer{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"of net '{graph.name}' (truncated file, or weights of another net?); pass --allow-missing "
            "(allow_missing=True) to run with their initial values"
        )
    return missing


def share_trained_layers(graph: NetGraph, other: NetGraph) -> None:
    """Make ``graph``'s layers use the weights of ``other``'s same-named layers."""
    for src_name, src_layer in zip(other.layer_names, other.layers):
        target = graph.first_layer_index(src_name)
        if target is None:
            continue
        layer = graph.layers[target]
        if len(layer.blobs) != len(src_layer.blobs):
            raise WeightsError(f"share_with: layer '{src_name}' has {len(src_layer.blobs)} blobs in the source "
                               f"net, {len(layer.blobs)} here")
        for i, (mine, theirs) in enumerate(zip(layer.blobs, src_layer.blobs)):
            if mine.shape != theirs.shape:
                raise WeightsError(f"share_with: layer '{src_name}' param {i} has shape {theirs.shape} in the "
                                   f"source net, {mine.shape} here")
            mine.share_data(theirs)
