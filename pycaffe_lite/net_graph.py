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
