"""Net: layers wired by blob names, built from a NetParameter (prototxt), as in Caffe's Net.

Builds the graph (phase/stage filtering, Split insertion, in-place tops, loss weights, which
layers need backward, shared params) and runs forward/backward over layer ranges. The
pycaffe-style surface (``blobs``, ``params``, ``forward(**inputs)``...) is defined here too.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import zip_longest
from typing import Any, cast

import numpy as np

from . import common, memcheck
from .blob import Blob
from .errors import CaffeError, NetError, PrototxtError, ShapeError, WeightsError
from .layer import Layer, create_layer
from .net_graph import NetGraph
from .optional import require
from .proto import caffe_pb2, hdf5_weights, protoio, upgrade
from .proto.net_filter import filter_net, insert_splits
from .runtime.executor import Executor
from .vectors import BlobVec, IntVec

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


def _num_items(arrays: dict[str, np.ndarray]) -> int:
    sizes = {name: len(a) for name, a in arrays.items()}
    if len(set(sizes.values())) > 1:
        raise ShapeError(f"all input arrays must hold the same number of items, got {sizes}")
    return next(iter(sizes.values()))


def _join(parts: list[np.ndarray], num: int | None) -> np.ndarray:
    """Concatenate per-batch arrays along the batch axis and drop the padding; scalar blobs
    (losses) come back as one value per batch."""
    if parts[0].ndim == 0:
        return np.stack(parts)
    return np.concatenate(parts)[:num]


def _check_array(arr: np.ndarray, what: str, dims: tuple[int, int, int], dtype: np.dtype) -> None:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"set_input_arrays: {what} must be a numpy array, got {type(arr).__name__}")
    if not arr.flags.c_contiguous:
        raise ValueError(f"set_input_arrays: {what} must be C contiguous (use np.ascontiguousarray)")
    if arr.ndim != 4:
        raise ValueError(f"set_input_arrays: {what} must be 4-d, got shape {arr.shape}")
    if arr.dtype != dtype:
        raise ValueError(f"set_input_arrays: {what} must be {dtype.name}, got {arr.dtype.name}")
    if tuple(arr.shape[1:]) != dims:
        raise ValueError(
            f"set_input_arrays: {what} has shape {arr.shape}; expected (N, {dims[0]}, {dims[1]}, {dims[2]})"
        )


def _view(name: str) -> Any:
    """A read-only attribute of :class:`Net` that is the field ``name`` of its :class:`NetGraph`."""
    return property(lambda self: getattr(self.graph, name), doc=f"``self.graph.{name}``")


class Net:
    """A network. ``Net(prototxt_or_param, phase)``; also the pycaffe forms
    ``Net(file, phase, level=0, stages=None, weights=None)`` and ``Net(file, weights, phase)``.

    The built graph is :attr:`graph` (:class:`~pycaffe_lite.net_graph.NetGraph`); the names pycaffe
    scripts and Caffe's C++ use (``_blobs``, ``_layer_names``, ``bottom_vecs``...) are views of it.
    """

    name = _view("name")
    phase = _view("phase")
    layers = _view("layers")
    _layer_names = _view("layer_names")
    _layer_names_index = _view("layer_names_index")
    _blobs = _view("blobs")
    _blob_names = _view("blob_names")
    _blob_name_to_idx = _view("blob_name_to_idx")
    _blob_need_backward = _view("blob_need_backward")
    _blob_loss_weights = _view("blob_loss_weights")
    bottom_vecs = _view("bottom_vecs")
    bottom_id_vecs = _view("bottom_id_vecs")
    bottom_need_backward = _view("bottom_need_backward")
    top_vecs = _view("top_vecs")
    top_id_vecs = _view("top_id_vecs")
    layer_need_backward = _view("layer_need_backward")
    params_list = _view("params_list")
    param_owners = _view("param_owners")
    param_display_names = _view("param_display_names")
    param_layer_indices = _view("param_layer_indices")
    _param_names_index = _view("param_names_index")
    learnable_params = _view("learnable_params")
    learnable_param_ids = _view("learnable_param_ids")
    params_lr = _view("params_lr")
    params_weight_decay = _view("params_weight_decay")
    input_blob_indices = _view("input_blob_indices")
    output_blob_indices = _view("output_blob_indices")
    _inputs = _view("inputs")
    _outputs = _view("outputs")

    def __init__(
        self,
        network: str | os.PathLike | caffe_pb2.NetParameter | None = None,
        *args,
        phase: int | None = None,
        level: int = 0,
        stages: Sequence[str] | None = None,
        weights: str | os.PathLike | None = None,
        dtype: np.dtype | type = np.float32,
        network_file: str | os.PathLike | None = None,
    ) -> None:
        # BVLC's keyword form: Net(network_file=..., phase=..., weights=...)
        if network_file is not None:
            if network is not None:
                raise TypeError("Net(): give the net as the first argument or as network_file=, not both")
            network = network_file
        if network is None:
            raise TypeError("Net(): missing the net definition (a prototxt path, network_file=, or a NetParameter)")
        # Accept the positional pycaffe forms: (file, phase) and legacy (file, weights, phase).
        if len(args) == 1:
            phase = args[0] if phase is None else phase
        elif len(args) == 2:
            weights, phase = args
        elif len(args) > 2:
            raise TypeError("Net(file, phase) or Net(file, weights, phase)")
        param = load_net_param(network)
        if phase is not None:
            param.state.phase = cast("caffe_pb2.Phase", int(phase))
        elif not param.state.HasField("phase"):
            param.state.phase = cast("caffe_pb2.Phase", common.TEST)
        param.state.level = level if level else param.state.level
        if stages:
            del param.state.stage[:]
            param.state.stage.extend(stages)
        self.dtype = np.dtype(dtype)
        self.source = str(network) if not isinstance(network, caffe_pb2.NetParameter) else None
        try:
            self._init(param)
        except CaffeError as exc:
            raise in_file(exc, self.source) from None
        if weights is not None:
            self.copy_from(weights)

    # ------------------------------------------------------------------------------------------
    # construction
    def _init(self, in_param: caffe_pb2.NetParameter) -> None:
        filtered = filter_net(in_param)
        param = insert_splits(filtered)
        self.param = param
        self.graph = NetGraph(param.name, param.state.phase, self.dtype)
        self._lr_explicit: dict[int, tuple[bool, bool]] = {}  # owner param -> lr/decay given?

        available: dict[str, int] = {}  # blobs produced and not yet consumed (net outputs at the end)
        input_names = []
        for layer_id, lp in enumerate(param.layer):
            layer = self._add_layer(layer_id, lp)
            bvec, bids, bneed, need_backward = self._wire_bottoms(lp, available)
            tvec: list[Blob] = []
            tids: list[int] = []
            for ti, tname in enumerate(lp.top):
                self._append_top(lp, ti, tname, tvec, tids, available)
            if layer.auto_top_blobs:
                for ti in range(len(lp.top), layer.auto_top_count()):
                    self._append_top(lp, ti, f"(automatic) {lp.name}_{ti}", tvec, tids, available)
            if lp.type == "Input":
                input_names.extend(lp.top)
            g = self.graph
            g.bottom_vecs.append(bvec)
            g.bottom_id_vecs.append(bids)
            g.bottom_need_backward.append(bneed)
            g.top_vecs.append(tvec)
            g.top_id_vecs.append(tids)
            layer.setup(bvec, tvec)  # its errors name the layer
            self._check_tops_hold_values(layer_id)
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
        self._blob_dict = OrderedDict((n, self.graph.blobs[i]) for i, n in enumerate(self.graph.blob_names))
        self._check_memory()
        self.executor = Executor(self.graph)
        self._debug_info = False
        self._debug_hooked = False
        self.debug_info = bool(param.debug_info)

    @property
    def debug_info(self) -> bool:
        """Caffe's ``debug_info`` (NetParameter field, or set here): after each layer's forward, log
        the mean absolute value of its tops (BVLC's "[Forward] Layer ..." lines) and raise a
        NetError at the first layer whose tops hold NaN or infinite values, naming the layer, the
        blob and whether its bottoms or params were already non-finite. Slow: reads every top."""
        return self._debug_info

    @debug_info.setter
    def debug_info(self, on: bool) -> None:
        self._debug_info = bool(on)
        if self._debug_info and not self._debug_hooked:
            self.executor.hooks["after_forward"].append(self._debug_forward)
            self._debug_hooked = True

    def _debug_forward(self, i: int) -> None:
        if not self._debug_info:
            return
        layer, lname = self.layers[i], self._layer_names[i]
        for bid, blob in zip(self.top_id_vecs[i], self.top_vecs[i]):
            values = blob.cpu_data()
            bname = self._blob_names[bid]
            log.info("    [Forward] Layer %s, top blob %s data: %g", lname, bname,
                     float(np.abs(values).mean()) if values.size else 0.0)
            bad = ~np.isfinite(values)
            if not bad.any():
                continue
            why = []
            for b_id, bottom in zip(self.bottom_id_vecs[i], self.bottom_vecs[i]):
                if bottom is not blob and not np.isfinite(bottom.cpu_data()).all():
                    why.append(f"its bottom '{self._blob_names[b_id]}' was already non-finite")
            for j, param in enumerate(layer.blobs):
                if not np.isfinite(param.cpu_data()).all():
                    why.append(f"its param {j} holds NaN/Inf (the weights)")
            raise NetError(
                f"net '{self.name}': layer '{lname}' ({layer.type}) gave {int(bad.sum())} non-finite value(s) "
                f"(NaN or infinite) of {values.size} in top '{bname}'"
                + (f": {'; '.join(why)}" if why else " from finite inputs and params (overflow?)")
            )

    def _check_memory(self) -> None:
        """OutOfMemoryError (naming the net, the total and the largest blobs) when what the net will
        surely hold exceeds the memory still free under the host's limits (cgroup, RLIMIT_AS) or
        on the GPU: its params, and in a net that trains every blob's data and the params' diffs;
        a net that only runs forward may share blob memory (memory_plan), so there only its
        largest layer's bottoms and tops together count."""

        seen: set[int] = set()
        params: list[tuple[str, int]] = []
        for (li, j), blob in zip(self.param_layer_indices, self.params_list):
            if id(blob._data) not in seen:
                seen.add(id(blob._data))
                params.append((f"{self._layer_names[li]} param {j}", blob.count * blob.dtype.itemsize))
        if any(self.layer_need_backward):
            items = list(params) + [(f"{name} diff", n) for name, n in params]
            for name, blob in zip(self._blob_names, self._blobs):
                if id(blob._data) not in seen:
                    seen.add(id(blob._data))
                    items.append((name, blob.count * blob.dtype.itemsize))
        else:
            best: list[tuple[str, int]] = []
            for i in range(len(self.layers)):
                these, ids = [], set()
                for bid in (*self.bottom_id_vecs[i], *self.top_id_vecs[i]):
                    blob = self._blobs[bid]
                    if id(blob._data) not in ids and id(blob._data) not in seen:
                        ids.add(id(blob._data))
                        these.append((self._blob_names[bid], blob.count * blob.dtype.itemsize))
                if sum(n for _, n in these) > sum(n for _, n in best):
                    best = these
            items = params + best
        # in GPU mode the blobs live on the device; the host surely holds only the params' values
        memcheck.check_total(f"net '{self.name}'", items, "its blobs and params",
                             device=common.mode() is common.Mode.GPU, host_items=params)

    def _add_layer(self, layer_id: int, lp: caffe_pb2.LayerParameter) -> Layer:
        """Create layer ``layer_id`` and record its name (duplicate names are Caffe's: accepted)."""
        if lp.name in self._layer_names_index:  # accepted, as BVLC's Net::Init does
            log.info("net '%s': layers %d and %d are both named '%s' (weights from a .caffemodel go to "
                     "the first, from an HDF5 file to the last, as in BVLC)",
                     self.name, self._first_layer_index(lp.name), layer_id, lp.name)
        if not lp.HasField("phase"):
            lp.phase = self.phase
        layer = create_layer(lp, self.dtype)
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

    def _append_top(self, lp, ti, tname, tvec, tids, available) -> None:
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
            blob = Blob(dtype=self.dtype)
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

    # ------------------------------------------------------------------------------------------
    # running
    def _first_layer_index(self, name: str) -> int | None:
        """The first layer named ``name`` (BVLC's linear search in CopyTrainedLayersFrom and
        pycaffe's ``list(net._layer_names).index(name)``), or None."""
        if name not in self._layer_names_index:
            return None
        return self._layer_names.index(name)

    def _layer_index(self, key: int | str | None, default: int) -> int:
        if key is None:
            return default
        if isinstance(key, str):
            index = self._first_layer_index(key)
            if index is None:
                raise NetError(f"net '{self.name}': no layer named '{key}'")
            return index
        if not 0 <= key < len(self.layers):
            raise NetError(f"net '{self.name}': layer index {key} out of range (0..{len(self.layers) - 1})")
        return int(key)

    def forward_from_to(self, start: int, end: int) -> float:
        """Run layers ``start``..``end`` (inclusive); returns the summed weighted loss."""
        return self.executor.forward(start, end)

    def backward_from_to(self, start: int, end: int) -> None:
        """Backward through layers ``start`` down to ``end`` (inclusive, start >= end)."""
        self.executor.backward(start, end)

    # pycaffe's low-level names (BVLC's _caffe.cpp): ForwardFromTo / BackwardFromTo and the blob
    # indices of a layer's tops and bottoms.
    def _forward(self, start: int, end: int) -> float:
        """Forward through layers ``start``..``end`` (inclusive); the summed weighted loss."""
        return self.forward_from_to(self._layer_index(start, 0), self._layer_index(end, 0))

    def _backward(self, start: int, end: int) -> None:
        """Backward from layer ``start`` down to layer ``end`` (inclusive)."""
        self.backward_from_to(self._layer_index(start, 0), self._layer_index(end, 0))

    def _top_ids(self, layer: int) -> IntVec:
        """Indices (into ``_blobs``/``_blob_names``) of layer ``layer``'s tops."""
        return IntVec(self.top_id_vecs[self._layer_index(layer, 0)])

    def _bottom_ids(self, layer: int) -> IntVec:
        """Indices (into ``_blobs``/``_blob_names``) of layer ``layer``'s bottoms."""
        return IntVec(self.bottom_id_vecs[self._layer_index(layer, 0)])

    def forward_prefilled(self) -> float:
        return self.forward_from_to(0, len(self.graph.layers) - 1)

    def forward_backward(self) -> float:
        loss = self.forward_prefilled()
        self.backward_from_to(len(self.graph.layers) - 1, 0)
        return loss

    def reshape(self) -> None:
        """Propagate input shape changes through every layer."""
        for i, layer in enumerate(self.graph.layers):
            layer.reshape(self.graph.bottom_vecs[i], self.graph.top_vecs[i])
            self._check_tops_hold_values(i)

    def _check_tops_hold_values(self, layer_id: int) -> None:
        """NetError naming the layer and blob when a top has a 0 dimension (BVLC's CHECK(data_)
        refuses such blobs at their first use; the layers after would divide or reshape by 0)."""
        for blob, tid in zip(self.graph.top_vecs[layer_id], self.graph.top_id_vecs[layer_id]):
            if blob.count == 0:
                layer = self.graph.layers[layer_id]
                raise layer.error(f"top blob '{self.graph.blob_names[tid]}' has shape {blob.shape}: a dimension is 0, "
                                  "so it holds no values")

    def clear_param_diffs(self) -> None:
        """Zero the gradients of every learnable param."""
        self.executor.clear_param_diffs()

    # -- per-layer hooks (pycaffe's Net.before_forward & co.; NCCL reduces gradients through after_backward)
    def before_forward(self, fn: Callable[[int], None]) -> None:
        """Call ``fn(layer_index)`` before each layer's forward."""
        self.executor.hooks["before_forward"].append(fn)

    def after_forward(self, fn: Callable[[int], None]) -> None:
        """Call ``fn(layer_index)`` after each layer's forward."""
        self.executor.hooks["after_forward"].append(fn)

    def before_backward(self, fn: Callable[[int], None]) -> None:
        """Call ``fn(layer_index)`` before each layer's backward (layers without backward too)."""
        self.executor.hooks["before_backward"].append(fn)

    def after_backward(self, fn: Callable[[int], None]) -> None:
        """Call ``fn(layer_index)`` after each layer's backward; ``fn`` may be a ``caffe.NCCL``."""
        self.executor.hooks["after_backward"].append(fn)

    # ------------------------------------------------------------------------------------------
    # pycaffe surface
    @property
    def blobs(self) -> OrderedDict[str, Blob]:
        """Ordered blob name -> Blob."""
        return self._blob_dict

    @property
    def params(self) -> OrderedDict[str, BlobVec]:
        """Ordered layer name -> its param blobs (layers with params only), each a ``BlobVec``
        (``caffe._caffe.BlobVec``, as scripts test with ``type(v) is caffe._caffe.BlobVec``)."""
        return OrderedDict(
            (name, BlobVec(layer.blobs, self.dtype))
            for name, layer in zip(self.graph.layer_names, self.graph.layers) if layer.blobs
        )

    @property
    def layer_dict(self) -> OrderedDict[str, Layer]:
        return OrderedDict(zip(self.graph.layer_names, self.graph.layers))

    @property
    def inputs(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def outputs(self) -> list[str]:
        return list(self.graph.outputs)

    @property
    def blob_loss_weights(self) -> OrderedDict[str, float]:
        """Blob name -> loss weight."""
        return OrderedDict(zip(self.graph.blob_names, self.graph.blob_loss_weights))

    def top_names_of(self, layer: int) -> list[str]:
        return [self.graph.blob_names[i] for i in self.graph.top_id_vecs[layer]]

    def bottom_names_of(self, layer: int) -> list[str]:
        return [self.graph.blob_names[i] for i in self.graph.bottom_id_vecs[layer]]

    @property
    def top_names(self) -> OrderedDict[str, list[str]]:
        return OrderedDict((n, self.top_names_of(i)) for i, n in enumerate(self.graph.layer_names))

    @property
    def bottom_names(self) -> OrderedDict[str, list[str]]:
        return OrderedDict((n, self.bottom_names_of(i)) for i, n in enumerate(self.graph.layer_names))

    def _set_input_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        for name, value in arrays.items():
            if name not in self.graph.inputs:
                raise NetError(f"net '{self.name}': '{name}' is not an input blob (inputs: {self.graph.inputs})")
            blob = self._blob_dict[name]
            value = np.asarray(value)
            if value.shape != blob.shape:
                raise ShapeError(
                    f"net '{self.name}': input '{name}' has shape {value.shape}, blob expects {blob.shape} "
                    "(call blob.reshape(...) and net.reshape() first to change it)"
                )
            self.executor.shared_data.sources_replaced()
            blob.mutable_cpu_data()[...] = value

    def _set_diffs(self, arrays: dict[str, np.ndarray]) -> None:
        for name, value in arrays.items():
            if name not in self._blob_dict:
                raise NetError(f"net '{self.name}': no blob named '{name}' to set a diff on")
            blob = self._blob_dict[name]
            value = np.asarray(value)
            if value.shape != blob.shape:
                raise ShapeError(f"net '{self.name}': diff for '{name}' has shape {value.shape}, blob is {blob.shape}")
            blob.diff = value  # the setter: a whole new diff (a stale one needs no recomputation)

    def forward(
        self,
        blobs: Iterable[str] | None = None,
        start: int | str | None = None,
        end: int | str | None = None,
        **kwargs,
    ) -> dict[str, np.ndarray]:
        """pycaffe: set inputs from ``kwargs``, run forward, return {output name: data}."""
        self._set_input_arrays(kwargs)
        start_i = self._layer_index(start, 0)
        end_i = self._layer_index(end, len(self.graph.layers) - 1)
        if end is not None:
            outputs = set(self.top_names_of(end_i))
        else:
            outputs = set(self.graph.outputs)
        wanted = set(blobs or ())
        outputs |= wanted
        self.executor.shared_data.keep_blobs([self.graph.blob_name_to_idx[n] for n in wanted if n in self._blob_dict])
        self.forward_from_to(start_i, end_i)
        return {name: self._blob_dict[name].data for name in self.graph.blob_names if name in outputs}

    def backward(
        self,
        diffs: Iterable[str] | None = None,
        start: int | str | None = None,
        end: int | str | None = None,
        **kwargs,
    ) -> dict[str, np.ndarray]:
        """pycaffe: set top diffs from ``kwargs``, run backward, return {input name: diff}."""
        start_i = self._layer_index(start, len(self.graph.layers) - 1)
        end_i = self._layer_index(end, 0)
        outputs = set(self.bottom_names_of(end_i)) if end is not None else set(self.graph.inputs)
        diffs = list(diffs or ())
        outputs |= set(diffs)
        self._set_diffs(kwargs)
        # the diffs asked for stay private (the others may share gradient buffers: shared_diffs.SharedDiffs)
        self.executor.shared_diffs.keep_blobs([self.graph.blob_name_to_idx[n] for n in diffs if n in self._blob_dict])
        self.backward_from_to(start_i, end_i)
        return {name: self._blob_dict[name].diff for name in self.graph.blob_names if name in outputs}

    # ------------------------------------------------------------------------------------------
    # pycaffe's batch helpers (BVLC's pycaffe.py adds these to Net)
    def _batch(self, arrays: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        """Split ``{blob name: (N, ...) array}`` into net-sized batches; the last is zero-padded."""
        if not arrays:
            return
        arrays = {name: np.asarray(a) for name, a in arrays.items()}
        for name in arrays:
            if name not in self.blobs:
                raise NetError(f"net '{self.name}': no blob named '{name}' to feed")
        num = _num_items(arrays)
        batch_size = self.blobs[next(iter(arrays))].shape[0]
        full, remainder = divmod(num, batch_size)
        for b in range(full):
            yield {name: a[b * batch_size : (b + 1) * batch_size] for name, a in arrays.items()}
        if remainder:
            padded = {}
            for name, a in arrays.items():
                pad = np.zeros((batch_size - remainder,) + a.shape[1:], dtype=a.dtype)
                padded[name] = np.concatenate([a[num - remainder :], pad])
            yield padded

    def forward_all(self, blobs: Iterable[str] | None = None, **kwargs) -> dict[str, np.ndarray]:
        """Run forward over inputs of any length in batches of the net's batch size.

        ``kwargs``: input blob name -> (N, ...) array. Returns {blob name: (N, ...) array} for the
        outputs and ``blobs``; the padding of the last batch is dropped. Without inputs, runs one
        forward pass (data layers feed the net) and returns copies of the outputs.
        """
        blobs = list(blobs or [])
        names = set(self.graph.outputs) | set(blobs)
        collected: dict[str, list[np.ndarray]] = {name: [] for name in names}
        if not kwargs:
            outs = self.forward(blobs=blobs)
            return {name: np.array(value, copy=True) for name, value in outs.items()}
        for batch in self._batch(kwargs):
            self._set_input_arrays(batch)
            outs = self.forward(blobs)
            for name in names:
                collected[name].append(np.array(outs[name], copy=True))
        num = _num_items(kwargs)
        return {name: _join(parts, num) for name, parts in collected.items()}

    def forward_backward_all(
        self, blobs: Iterable[str] | None = None, diffs: Iterable[str] | None = None, **kwargs
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Forward and backward in batches.

        ``kwargs`` holds input arrays (for forward) and output-diff arrays (for backward), keyed by
        blob name; a missing side uses what the net already holds. Returns (outputs + ``blobs``
        data, inputs + ``diffs`` diffs), each {name: (N, ...) array} with the padding dropped.
        """
        blobs, diffs = list(blobs or []), list(diffs or [])
        unknown = set(kwargs) - set(self.graph.inputs) - set(self.graph.outputs)
        if unknown:
            raise NetError(
                f"net '{self.name}': {sorted(unknown)} are neither inputs {self.graph.inputs} nor outputs {self.graph.outputs}"
            )
        out_names = set(self.graph.outputs) | set(blobs)
        diff_names = set(self.graph.inputs) | set(diffs)
        all_outs: dict[str, list[np.ndarray]] = {n: [] for n in out_names}
        all_diffs: dict[str, list[np.ndarray]] = {n: [] for n in diff_names}
        fwd = {n: kwargs[n] for n in self.graph.inputs if n in kwargs}
        bwd = {n: kwargs[n] for n in self.graph.outputs if n in kwargs}
        fwd_batches = self._batch(fwd) if fwd else iter(())
        bwd_batches = self._batch(bwd) if bwd else iter(())
        empty: dict[str, np.ndarray] = {}
        for fb, bb in zip_longest(fwd_batches, bwd_batches, fillvalue=empty):
            self._set_input_arrays(fb)
            outs = self.forward(blobs)
            self._set_diffs(bb)
            grads = self.backward(diffs)
            for n in out_names:
                all_outs[n].append(np.array(outs[n], copy=True))
            for n in diff_names:
                all_diffs[n].append(np.array(grads[n], copy=True))
        num = _num_items(kwargs) if kwargs else None
        outs_final = {n: _join(v, num) for n, v in all_outs.items() if v}
        diffs_final = {n: _join(v, num) for n, v in all_diffs.items() if v}
        return outs_final, diffs_final

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        """Feed the net's first layer, a MemoryData layer, with ``data`` (N, C, H, W) float32 C-order
        and ``labels`` (N,) or (N, 1, 1, 1); N must be a multiple of the layer's batch size. The
        arrays are used in place (not copied): keep them unchanged while the net reads them."""
        if not self.graph.layers or self.graph.layers[0].type != "MemoryData":
            first = f"'{self.graph.layer_names[0]}' ({self.graph.layers[0].type})" if self.graph.layers else "none"
            raise NetError(
                f"net '{self.name}': set_input_arrays may only be called if the first layer is a "
                f"MemoryData layer (first layer: {first})"
            )
        layer: Any = self.graph.layers[0]  # a MemoryDataLayer (channels, height, width, batch_size, reset)
        if isinstance(labels, np.ndarray) and labels.ndim == 1:
            labels = np.ascontiguousarray(labels[:, None, None, None])
        _check_array(data, "data array", (layer.channels, layer.height, layer.width), self.dtype)
        _check_array(labels, "labels array", (1, 1, 1), self.dtype)
        if data.shape[0] != labels.shape[0]:
            raise ValueError(
                f"set_input_arrays: data and labels must have the same first dimension, got "
                f"{data.shape[0]} and {labels.shape[0]}"
            )
        if data.shape[0] == 0 or data.shape[0] % layer.batch_size:
            raise ValueError(
                f"set_input_arrays: first dimensions of input arrays ({data.shape[0]}) must be a "
                f"multiple of batch size ({layer.batch_size})"
            )
        layer.reset(data, labels, data.shape[0])

    def save_hdf5(self, filename: str | os.PathLike, write_diff: bool = False) -> None:
        """Write the params in Caffe's HDF5 layout (see :mod:`pycaffe_lite.proto.hdf5_weights`)."""
        hdf5_weights.save(self.graph, filename, write_diff)

    def load_hdf5(self, filename: str | os.PathLike, allow_missing: bool = True) -> list[str]:
        """Copy params from a Caffe HDF5 weights file (see :mod:`pycaffe_lite.proto.hdf5_weights`);
        returns the layers with params that got none, as ``copy_from``."""
        return hdf5_weights.load(self.graph, filename, allow_missing)

    # ------------------------------------------------------------------------------------------
    # weights
    def to_proto(self, write_diff: bool = False) -> caffe_pb2.NetParameter:
        """The net definition with each layer's learned blobs, as a .caffemodel holds it."""
        out = caffe_pb2.NetParameter()
        out.name = self.name
        for lp, layer in zip(self.param.layer, self.graph.layers):
            if lp.type == "Split":
                continue
            entry = out.layer.add()
            entry.CopyFrom(lp)
            del entry.blobs[:]
            for blob in layer.blobs:
                blob.to_proto(write_diff, entry.blobs.add())
        return out

    def save(self, path: str | os.PathLike, write_diff: bool = False) -> None:
        """Write a binary .caffemodel (atomically)."""
        protoio.write_binary(path, self.to_proto(write_diff))

    def copy_trained_layers_from(self, param: caffe_pb2.NetParameter, source: str = "<weights>") -> list[str]:
        """Copy blobs layer by layer (matched by name); layers absent from ``param`` keep theirs.
        Returns the names of the net's layers with parameters that got none (logged as a warning)."""

        upgrade.upgrade_net(param, source=source)
        filled: set[int] = set()
        for src in param.layer:
            target = self._first_layer_index(src.name)  # with duplicate names: the first (BVLC)
            if target is None:
                continue
            layer = self.layers[target]
            if len(src.blobs) != len(layer.blobs):
                raise WeightsError(
                    f"{source}: layer '{src.name}' has {len(src.blobs)} blobs in the file but "
                    f"{len(layer.blobs)} in the net"
                )
            for i, (proto, blob) in enumerate(zip(src.blobs, layer.blobs)):
                try:
                    blob.from_proto(proto, reshape=False, where=f"{source}: layer '{src.name}' param {i}")
                except (ShapeError, PrototxtError) as exc:  # PrototxtError: a raw blob of no float type
                    raise WeightsError(f"cannot copy weights: {exc}") from None
            filled.add(target)
        missing = [n for i, (n, layer) in enumerate(zip(self._layer_names, self.layers)) if layer.blobs and i not in filled]
        if missing:
            import logging

            logging.getLogger("pycaffe_lite").warning("%s: no weights for layer%s %s of net '%s' (they keep their initial values)",
                        source, "s" if len(missing) > 1 else "", ", ".join(missing), self.name)
        return missing

    def copy_from(self, path: str | os.PathLike, allow_missing: bool = True) -> list[str]:
        """Load weights from a .caffemodel (binary NetParameter) or an HDF5 file (.h5).

        An empty, truncated or non-caffemodel file is a WeightsError naming it. Returns the layers
        with parameters that got no weights (a warning lists them); with ``allow_missing=False``
        they are a WeightsError instead."""
        path = str(path)
        protoio.check_regular_file(path, "weights file", WeightsError)
        if hdf5_weights.is_hdf5_file(path):  # by signature, as Caffe does
            return hdf5_weights.load(self.graph, path, allow_missing)
        try:
            param = protoio.read_binary(path, caffe_pb2.NetParameter(), "caffemodel")
        except Exception as exc:  # unreadable or corrupt file
            raise WeightsError(str(exc)) from None
        if not param.layer and not param.layers:
            size = os.path.getsize(path) if os.path.exists(path) else 0
            what = "an empty file" if size == 0 else f"{size} bytes holding no layers"
            raise WeightsError(f"{path}: not a caffemodel ({what}; expected a binary NetParameter with weights)")
        missing = self.copy_trained_layers_from(param, source=path)
        if missing and not allow_missing:
            raise WeightsError(
                f"{path}: holds no weights for layer{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                f"of net '{self.name}' (truncated file, or weights of another net?); pass --allow-missing "
                "(allow_missing=True) to run with their initial values"
            )
        return missing

    def to_onnx(self, path: str | os.PathLike | None, opset: int | None = None, dynamic_batch: bool = False,
                input_shapes: dict[str, Sequence[int]] | None = None, fp16: bool = False, check: bool = True,
                check_inputs: Sequence = (), **kwargs):
        """Write this net as ONNX and prove it in ONNX Runtime, blob by blob (the ``onnx`` extra;
        :func:`pycaffe_lite.onnx.export_net` has the options). Returns its ExportReport; raises
        ``CheckError`` naming the first diverging layer on a mismatch."""

        require("onnx", feature="Net.to_onnx", extra="onnx")
        require("onnxruntime", feature="Net.to_onnx", extra="onnx")
        from .onnx import DEFAULT_OPSET, export_net

        return export_net(self, path, opset=opset or DEFAULT_OPSET, dynamic_batch=dynamic_batch,
                          input_shapes=input_shapes, fp16=fp16, random_check=check,
                          check_inputs=check_inputs if check else (), **kwargs)

    def share_with(self, other: Net) -> None:
        """Share the weights of ``other``'s same-named layers (Caffe's ShareTrainedLayersWith)."""
        for src_name, src_layer in zip(other._layer_names, other.layers):
            target = self._first_layer_index(src_name)  # with duplicate names: the first (BVLC)
            if target is None:
                continue
            layer = self.layers[target]
            if len(layer.blobs) != len(src_layer.blobs):
                raise WeightsError(
                    f"share_with: layer '{src_name}' has {len(src_layer.blobs)} blobs in the source "
                    f"net, {len(layer.blobs)} here"
                )
            for i, (mine, theirs) in enumerate(zip(layer.blobs, src_layer.blobs)):
                if mine.shape != theirs.shape:
                    raise WeightsError(
                        f"share_with: layer '{src_name}' param {i} has shape {theirs.shape} in the "
                        f"source net, {mine.shape} here"
                    )
                mine.share_data(theirs)
