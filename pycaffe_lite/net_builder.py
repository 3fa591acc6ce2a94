"""Building a net: Caffe's ``Net::Init`` from a NetParameter to a :class:`~.net_graph.NetGraph`.

``build_net(param, dtype)``: upgrade-free input (see :func:`load_net_param`), phase/stage filtering
and Split insertion (:mod:`.proto.net_filter`), then per layer: create it, wire its bottoms (consumed
by name) and tops (in place when a top repeats its bottom), set it up, record its loss weights and
param blobs (sharing by ``ParamSpec.name``, lr/decay multipliers); then Caffe's backward-needs pass
from the last layer (only layers under a loss backprop; ``force_backward``) and the memory check.
The runtime and the solvers run the graph; :class:`~.net.Net` is pycaffe's view over it.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import cast

import numpy as np

from . import common, memcheck, precision
from .blob import Blob
from .conv import cpu as cpu_conv
from .errors import CaffeError, NetError, ShapeError
from .layer import Layer, create_layer
from .net_graph import NetGraph
from .proto import protoio, upgrade
from .proto.net_filter import filter_net, insert_splits
from .schema import caffe_pb2

log = logging.getLogger("pycaffe_lite")


def load_net_param(source: str | os.PathLike | caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """A NetParameter from a prototxt path or a message (copied), with legacy forms upgraded."""
    if isinstance(source, caffe_pb2.NetParameter):
        param = caffe_pb2.NetParameter()
        param.CopyFrom(source)
    else:
        param = protoio.read_text(source, caffe_pb2.NetParameter())
    upgrade.upgrade_net(param, source=str(source) if not isinstance(source, caffe_pb2.NetParameter) else "<NetParameter>")
    return param


def in_file(exc: CaffeError, source: str | None) -> CaffeError:
    """``exc`` (same class and traceback) with its message prefixed by ``source``, the file whose
    definition failed, unless it already names it."""
    if not source or source in str(exc):
        return exc
    named = type(exc)(f"{source}: {exc}")
    return named.with_traceback(exc.__traceback__)


_nesting = threading.local()  # .depth: builds in progress on this thread (a layer's inner net is nested)


def build_net(param: caffe_pb2.NetParameter, dtype: np.dtype | type = np.float32) -> NetGraph:
    """The built graph of ``param`` (its ``state`` set: phase, level, stages); errors name layers.
    The blobs are added up as they are made, before they are filled (``memcheck.net_build``).
    The precision switch (``caffe.set_precision``, ``--precision``) applies to the outermost build
    (``precision.apply_precision``); a net a layer builds inside itself (Recurrent's) follows its layer."""
    depth = getattr(_nesting, "depth", 0)
    if depth == 0:
        param = precision.apply_precision(param, common.context().precision, dtype)
    _nesting.depth = depth + 1
    try:
        with memcheck.net_build(f"net '{param.name}'"):
            return _Builder(param, np.dtype(dtype)).build()
    finally:
        _nesting.depth = depth


def check_tops_hold_values(graph: NetGraph, layer_id: int) -> None:
    """NetError naming the layer and blob when a top has a 0 dimension (BVLC's CHECK(data_)
    refuses such blobs at their first use; the layers after would divide or reshape by 0)."""
    for blob, tid in zip(graph.top_vecs[layer_id], graph.top_id_vecs[layer_id]):
        if blob.count == 0:
            layer = graph.layers[layer_id]
            raise layer.error(f"top blob '{graph.blob_names[tid]}' has shape {blob.shape}: a dimension is 0, "
                              "so it holds no values")


def check_memory(graph: NetGraph) -> None:
    """OutOfMemoryError (naming the net, the total and the largest blobs) when what the net will
    surely hold exceeds the memory still free under the host's limits (cgroup, RLIMIT_AS) or
    on the GPU: its params, and in a net that trains every blob's data and the params' diffs;
    a net that only runs forward may share blob memory (memory_plan), so there only its
    largest layer's bottoms and tops together count."""

    seen: set[int] = set()
    params: list[tuple[str, int]] = []
    diffs: list[tuple[str, int]] = []  # (each counted at its own item size: half nets)
    for (li, j), blob in zip(graph.param_layer_indices, graph.params_list):
        if id(blob._data) not in seen:
            seen.add(id(blob._data))
            params.append((f"{graph.layer_names[li]} param {j}", blob.count * blob.dtype.itemsize))
            diffs.append((f"{graph.layer_names[li]} param {j} diff", blob.count * blob.diff_dtype.itemsize))
    views = [(f"{layer.name} float copies", layer._float_view.nbytes()) for layer in graph.layers
             if layer._float_view is not None and layer._float_view.nbytes()]
    if any(graph.layer_need_backward):
        items = list(params) + diffs + views
        for name, blob in zip(graph.blob_names, graph.blobs):
            if id(blob._data) not in seen:
                seen.add(id(blob._data))
                items.append((name, blob.count * blob.dtype.itemsize))
    else:
        best: list[tuple[str, int]] = []
        for i in range(len(graph.layers)):
            these, ids = [], set()
            for bid in (*graph.bottom_id_vecs[i], *graph.top_id_vecs[i]):
                blob = graph.blobs[bid]
                if id(blob._data) not in ids and id(blob._data) not in seen:
                    ids.add(id(blob._data))
                    these.append((graph.blob_names[bid], blob.count * blob.dtype.itemsize))
            if sum(n for _, n in these) > sum(n for _, n in best):
                best = these
        items = params + best + views
    if common.mode() is common.Mode.CPU:  # the CPU convolutions' buffers (conv.cpu.held_bytes)
        scratch = cpu_conv.held_bytes(getattr(layer, "host_workspace", {}) for layer in graph.layers)
        if scratch:
            items.append(("CPU convolution scratch", scratch))
    # in GPU mode the blobs live on the device; the host surely holds only the params' values
    memcheck.check_total(f"net '{graph.name}'", items, "its blobs and params",
                         device=common.mode() is common.Mode.GPU, host_items=params)


class _Builder:
    """One build: the graph under construction and what sharing params needs on the way."""

    def __init__(self, in_param: caffe_pb2.NetParameter, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.param = param = insert_splits(filter_net(in_param))
        self.graph = NetGraph(param.name, param.state.phase, dtype, param=param)
        self._lr_explicit: dict[int, tuple[bool, bool]] = {}  # owner param -> lr/decay given?
        # docs/precision.md: each layer's types by NVCaffe's rule (float32/float64 nets: no half)
        self._fallback = precision.DOUBLE if dtype == np.float64 else precision.FLOAT

    def build(self) -> NetGraph:
        param = self.param

        available: dict[str, int] = {}  # blobs produced and not yet consumed (net outputs at the end)
        input_names = []
        for layer_id, lp in enumerate(param.layer):
            layer = self._add_layer(layer_id, lp)
            bvec, bids, bneed, need_backward = self._wire_bottoms(lp, available)
            tvec: list[Blob] = []
            tids: list[int] = []
            for ti, tname in enumerate(lp.top):
                self._append_top(lp, ti, tname, tvec, tids, available, layer)
            if layer.auto_top_blobs:
                for ti in range(len(lp.top), layer.auto_top_count()):
                    self._append_top(lp, ti, f"(automatic) {lp.name}_{ti}", tvec, tids, available, layer)
            if lp.type == "Input":
                input_names.extend(lp.top)
            g = self.graph
            g.bottom_vecs.append(bvec)
            g.bottom_id_vecs.append(bids)
            g.bottom_need_backward.append(bneed)
            g.top_vecs.append(tvec)
            g.top_id_vecs.append(tids)
            layer.setup(bvec, tvec)  # its errors name the layer
            if layer._float_view is not None:  # it runs on converted copies (docs/precision.md): in GPU
                # mode kernels convert them, so it stays capturable, but it takes part in no fusion
                layer.traits = layer.traits.but(fuses=frozenset(), regenerates_top=False, saves_input_in_place=False)
            check_tops_hold_values(self.graph, layer_id)
            self._adopt_param_specs(lp, layer)
            for ti, tid in enumerate(tids):
                while len(g.blob_loss_weights) <= tid:
                    g.blob_loss_weights.append(0.0)
                g.blob_loss_weights[tid] = layer.loss(ti)
            need_backward |= self._wire_params(layer_id, lp, layer)
            g.layer_need_backward.append(need_backward)
            if need_backward:
                for tid in tids:
                    g.blob_need_backward[tid] = True

        self._compute_backward_needs(param)
        self.graph.input_blob_indices[:] = [self.graph.blob_name_to_idx[n] for n in input_names]
        self.graph.output_blob_indices[:] = [self.graph.blob_name_to_idx[n] for n in available]
        self.graph.inputs[:] = input_names
        self.graph.outputs[:] = available
        check_memory(self.graph)
        return self.graph

    def _add_layer(self, layer_id: int, lp: caffe_pb2.LayerParameter) -> Layer:
        """Create layer ``layer_id`` and record its name (duplicate names are Caffe's: accepted)."""
        if lp.name in self.graph.layer_names_index:  # accepted, as BVLC's Net::Init does
            log.info("net '%s': layers %d and %d are both named '%s' (weights from a .caffemodel go to "
                     "the first, from an HDF5 file to the last, as in BVLC)",
                     self.graph.name, self.graph.layer_names.index(lp.name), layer_id, lp.name)
        if not lp.HasField("phase"):
            lp.phase = cast("caffe_pb2.Phase", self.graph.phase)
        prec = precision.layer_precision(self.param, lp, self._fallback)
        layer = create_layer(lp, self.dtype, prec)
        for note in (prec.note, layer.half_note):
            if note:
                log.info("%s", note)
        self.graph.layers.append(layer)
        self.graph.layer_names.append(lp.name)
        self.graph.layer_names_index[lp.name] = layer_id  # the last layer of a name (BVLC's layer_names_index_)
        if lp.propagate_down and len(lp.propagate_down) != len(lp.bottom):
            raise NetError(
                f"layer '{lp.name}': propagate_down has {len(lp.propagate_down)} entries, "
                f"expected one per bottom ({len(lp.bottom)})"
            )
        return layer

    def _wire_bottoms(self, lp: caffe_pb2.LayerParameter, available: dict[str, int]
                      ) -> tuple[list[Blob], list[int], list[bool], bool]:
        """The layer's bottom blobs, their ids, whether each needs a gradient, and whether any
        bottom needs backward; each bottom is consumed from ``available``."""
        g = self.graph
        bvec, bids, bneed = [], [], []
        need_backward = False
        for bi, bname in enumerate(lp.bottom):
            if bname not in g.blob_name_to_idx:
                raise NetError(f"layer '{lp.name}' ({lp.type}): unknown bottom blob '{bname}'")
            if bname not in available:
                raise NetError(
                    f"layer '{lp.name}' ({lp.type}): bottom blob '{bname}' was already consumed "
                    "(insert_splits should have split it)"
                )
            bid = g.blob_name_to_idx[bname]
            del available[bname]
            prop = lp.propagate_down[bi] if lp.propagate_down else True
            bvec.append(g.blobs[bid])
            bids.append(bid)
            bneed.append(g.blob_need_backward[bid] and prop)
            need_backward |= g.blob_need_backward[bid]
        return bvec, bids, bneed, need_backward

    @staticmethod
    def _adopt_param_specs(lp: caffe_pb2.LayerParameter, layer: Layer) -> None:
        """Param specs a layer adds for itself in setup (BatchNorm's lr_mult 0) count, and so do the
        ones it overrides (the forks' BN forces lr_mult 0 on its statistics, or on all four blobs
        when frozen, whatever the prototxt says)."""
        for i in range(min(len(lp.param), len(layer.layer_param.param))):
            if lp.param[i] != layer.layer_param.param[i]:
                lp.param[i].CopyFrom(layer.layer_param.param[i])
        if len(layer.layer_param.param) > len(lp.param):
            lp.param.extend(layer.layer_param.param[len(lp.param):])

    def _wire_params(self, layer_id: int, lp: caffe_pb2.LayerParameter, layer: Layer) -> bool:
        """Register the layer's param blobs (sharing by name, lr and decay multipliers); True when
        one of them learns (so the layer needs backward)."""
        if len(lp.param) > len(layer.blobs):
            raise NetError(
                f"layer '{lp.name}' ({lp.type}): {len(lp.param)} param specs but the layer has "
                f"{len(layer.blobs)} param blobs"
            )
        learns = False
        for pi in range(len(layer.blobs)):
            spec = lp.param[pi] if pi < len(lp.param) else caffe_pb2.ParamSpec()
            need = spec.lr_mult != 0
            learns |= need
            layer.param_propagate_down[pi] = need
            self._append_param(layer_id, pi)
        return learns

    def _append_top(self, lp, ti, tname, tvec, tids, available, layer: Layer) -> None:
        if ti < len(lp.bottom) and lp.bottom[ti] == tname:  # in place
            bid = self.graph.blob_name_to_idx[tname]
            blob = self.graph.blobs[bid]
        else:
            if tname in self.graph.blob_name_to_idx:
                raise NetError(
                    f"layer '{lp.name}' ({lp.type}): top blob '{tname}' is already produced by "
                    "another layer (duplicate top; in-place use needs the same name at the same "
                    "bottom position)"
                )
            blob = Blob(dtype=layer.top_dtype, diff_dtype=layer.top_diff_dtype)  # (the net's dtype unless half)
            bid = len(self.graph.blobs)
            self.graph.blobs.append(blob)
            self.graph.blob_names.append(tname)
            self.graph.blob_need_backward.append(False)
            self.graph.blob_name_to_idx[tname] = bid
        available[tname] = bid
        tvec.append(blob)
        tids.append(bid)

    def _append_param(self, layer_id: int, param_id: int) -> None:
        lp = self.param.layer[layer_id]
        layer = self.graph.layers[layer_id]
        spec = lp.param[param_id] if param_id < len(lp.param) else None
        name = spec.name if spec is not None and spec.name else ""
        net_param_id = len(self.graph.params_list)
        blob = layer.blobs[param_id]
        self.graph.params_list.append(blob)
        self.graph.param_layer_indices.append((layer_id, param_id))
        self.graph.param_display_names.append(name or str(param_id))
        if not name or name not in self.graph.param_names_index:
            if name:
                self.graph.param_names_index[name] = net_param_id
            self.graph.param_owners.append(-1)
            self.graph.learnable_param_ids.append(len(self.graph.learnable_params))
            self.graph.learnable_params.append(blob)
            has_lr = spec is not None and spec.HasField("lr_mult")
            has_decay = spec is not None and spec.HasField("decay_mult")
            self.graph.params_lr.append(spec.lr_mult if spec is not None and has_lr else 1.0)
            self.graph.params_weight_decay.append(spec.decay_mult if spec is not None and has_decay else 1.0)
            self._lr_explicit[net_param_id] = (has_lr, has_decay)
            return
        assert spec is not None  # a shared name comes from a ParamSpec
        owner_id = self.graph.param_names_index[name]
        self.graph.param_owners.append(owner_id)
        owner = self.graph.params_list[owner_id]
        owner_layer, owner_pi = self.graph.param_layer_indices[owner_id]
        mode = spec.share_mode
        if mode == caffe_pb2.ParamSpec.PERMISSIVE:
            if owner.count != blob.count:
                raise ShapeError(
                    f"layer '{lp.name}': shared param '{name}' has {blob.count} elements here but "
                    f"{owner.count} in owner layer '{self.graph.layer_names[owner_layer]}'"
                )
        elif owner.shape != blob.shape:
            raise ShapeError(
                f"layer '{lp.name}': shared param '{name}' has shape {blob.shape} here but "
                f"{owner.shape} in owner layer '{self.graph.layer_names[owner_layer]}' "
                "(use share_mode PERMISSIVE to require only equal counts)"
            )
        learnable_id = self.graph.learnable_param_ids[owner_id]
        self.graph.learnable_param_ids.append(learnable_id)
        has_lr, has_decay = self._lr_explicit[owner_id]
        if spec.HasField("lr_mult"):
            if has_lr and self.graph.params_lr[learnable_id] != spec.lr_mult:
                raise NetError(f"layer '{lp.name}': shared param '{name}' has mismatched lr_mult")
            self.graph.params_lr[learnable_id] = spec.lr_mult
            self._lr_explicit[owner_id] = (True, has_decay)
        if spec.HasField("decay_mult"):
            if has_decay and self.graph.params_weight_decay[learnable_id] != spec.decay_mult:
                raise NetError(f"layer '{lp.name}': shared param '{name}' has mismatched decay_mult")
            self.graph.params_weight_decay[learnable_id] = spec.decay_mult
            self._lr_explicit[owner_id] = (self._lr_explicit[owner_id][0], True)
        blob.share_data(owner)
        blob.share_diff(owner)

    def _compute_backward_needs(self, param: caffe_pb2.NetParameter) -> None:
        """Caffe's pass from the last layer back: only layers that contribute to a loss backprop."""
        under_loss: set[str] = set()
        skip_backprop: set[str] = set()
        for li in range(len(self.graph.layers) - 1, -1, -1):
            layer = self.graph.layers[li]
            lp = self.param.layer[li]
            contributes = False
            skip_propagate = True
            for ti, tid in enumerate(self.graph.top_id_vecs[li]):
                tname = self.graph.blob_names[tid]
                if layer.loss(ti) or tname in under_loss:
                    contributes = True
                if tname not in skip_backprop:
                    skip_propagate = False
                if contributes and not skip_propagate:
                    break
            if self.graph.layer_need_backward[li] and skip_propagate:
                self.graph.layer_need_backward[li] = False
                self.graph.bottom_need_backward[li] = [False] * len(self.graph.bottom_need_backward[li])
            if not contributes:
                self.graph.layer_need_backward[li] = False
            for bi, bname in enumerate(lp.bottom):
                if contributes:
                    under_loss.add(bname)
                else:
                    self.graph.bottom_need_backward[li][bi] = False
                if not self.graph.bottom_need_backward[li][bi]:
                    skip_backprop.add(bname)
        if param.force_backward:
            for li, layer in enumerate(self.graph.layers):
                self.graph.layer_need_backward[li] = True
                for bi, bid in enumerate(self.graph.bottom_id_vecs[li]):
                    need = self.graph.bottom_need_backward[li][bi] or layer.allow_force_backward(bi)
                    self.graph.bottom_need_backward[li][bi] = need
                    self.graph.blob_need_backward[bid] = self.graph.blob_need_backward[bid] or need
                layer.param_propagate_down = [True] * len(layer.blobs)
