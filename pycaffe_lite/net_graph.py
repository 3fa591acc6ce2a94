"""The built net as a value: layers, blobs and their wiring, what needs backward, params.

:func:`~pycaffe_lite.net_builder.build_net` builds it (filtering, splits, in-place tops, shared
params); :class:`~pycaffe_lite.net.Net` keeps pycaffe's names (``net._blobs``, ``net._layer_names``, ``net.bottom_vecs``...) as views of
it; the runtime (executor, fusions, memory plans), weight files and snapshots read it. Indices:
layer ``i`` reads ``bottom_vecs[i]`` (blob ids ``bottom_id_vecs[i]``) and writes ``top_vecs[i]``;
blob ``b`` is ``blobs[b]`` named ``blob_names[b]``; every param blob of every layer is
``params_list[p]``, owned by itself (``param_owners[p] == -1``) or shared from another entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .blob import Blob
from .layer import Layer

if TYPE_CHECKING:
    from .schema import caffe_pb2


@dataclass
class NetGraph:
    name: str
    phase: int
    dtype: np.dtype
    param: caffe_pb2.NetParameter | None = None  # the filtered, split definition it was built from
    layers: list[Layer] = field(default_factory=list)
    layer_names: list[str] = field(default_factory=list)
    layer_names_index: dict[str, int] = field(default_factory=dict)  # the first layer of each name
    blobs: list[Blob] = field(default_factory=list)
    blob_names: list[str] = field(default_factory=list)
    blob_name_to_idx: dict[str, int] = field(default_factory=dict)
    blob_need_backward: list[bool] = field(default_factory=list)
    blob_loss_weights: list[float] = field(default_factory=list)
    bottom_vecs: list[list[Blob]] = field(default_factory=list)
    bottom_id_vecs: list[list[int]] = field(default_factory=list)
    bottom_need_backward: list[list[bool]] = field(default_factory=list)
    top_vecs: list[list[Blob]] = field(default_factory=list)
    top_id_vecs: list[list[int]] = field(default_factory=list)
    layer_need_backward: list[bool] = field(default_factory=list)
    params_list: list[Blob] = field(default_factory=list)  # every layer param blob, in order (Caffe's params_)
    param_owners: list[int] = field(default_factory=list)  # -1: owner, else index of the owning param
    param_display_names: list[str] = field(default_factory=list)
    param_layer_indices: list[tuple[int, int]] = field(default_factory=list)  # (layer, index in its blobs)
    param_names_index: dict[str, int] = field(default_factory=dict)
    learnable_params: list[Blob] = field(default_factory=list)
    learnable_param_ids: list[int] = field(default_factory=list)  # per entry of params_list
    params_lr: list[float | None] = field(default_factory=list)
    params_weight_decay: list[float | None] = field(default_factory=list)
    input_blob_indices: list[int] = field(default_factory=list)
    output_blob_indices: list[int] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def first_layer_index(self, name: str) -> int | None:
        """The first layer named ``name`` (BVLC's linear search in CopyTrainedLayersFrom and pycaffe's
        ``list(net._layer_names).index(name)``; ``layer_names_index`` keeps the last), or None."""
        return self.layer_names.index(name) if name in self.layer_names_index else None


def warn_missing_weights(graph: NetGraph, source: str, missing: list[str], target: dict[str, int],
                         rule: str, copies: dict[str, int] | None = None) -> None:
    """The warning for the layers with params that a weights file left at their initial values.

    ``target``: the layer each name's weights went to; ``rule``: which layer of a name that is, in
    words (BVLC's rule of the file format). A layer that got none because another layer of its name
    took them is explained as such, and ``copies`` (name -> how many layers of that name the file
    holds, when more than one) says which of the file's copies stayed."""
    import logging

    log = logging.getLogger("pycaffe_lite")
    for name, count in (copies or {}).items():
        if name in target:
            log.warning("%s: holds %d layers named '%s'; all were copied into net layer #%d, so the last one's "
                        "values stay (%s)", source, count, name, target[name], rule)
    seen: set[str] = set()
    plain: list[str] = []
    for name in missing:
        if name in target and name not in seen:
            seen.add(name)
            others = [i for i, n in enumerate(graph.layer_names) if n == name and i != target[name]]
            log.warning("%s: net '%s' has %d layers named '%s': the weights went to layer #%d only and layer%s "
                        "#%s keep%s initial values (%s); give the layers distinct names", source, graph.name,
                        len(others) + 1, name, target[name], "s" if len(others) > 1 else "",
                        ", #".join(map(str, others)), "" if len(others) > 1 else "s its", rule)
        elif name not in target:
            plain.append(name)
    if plain:
        log.warning("%s: no weights for layer%s %s of net '%s' (they keep their initial values)",
                    source, "s" if len(plain) > 1 else "", ", ".join(plain), graph.name)
