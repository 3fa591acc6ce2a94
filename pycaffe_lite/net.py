"""Net: layers wired by blob names, built from a NetParameter (prototxt), as in Caffe's Net.

Builds the graph (phase/stage filtering, Split insertion, in-place tops, loss weights, which
layers need backward, shared params) and runs forward/backward over layer ranges. The
pycaffe-style surface (``blobs``, ``params``, ``forward(**inputs)``...) is defined here too.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np

from . import common, protoio
from .blob import Blob
from .errors import NetError, ShapeError, WeightsError
from .layer import Layer, create_layer
from .net_filter import filter_net, insert_splits
from .proto import caffe_pb2


def load_net_param(source: str | os.PathLike | caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """A NetParameter from a prototxt path or a message (copied), with legacy forms upgraded."""
    if isinstance(source, caffe_pb2.NetParameter):
        param = caffe_pb2.NetParameter()
        param.CopyFrom(source)
    else:
        param = protoio.read_text(source, caffe_pb2.NetParameter())
    from . import upgrade

    upgrade.upgrade_net(param, source=str(source) if not isinstance(source, caffe_pb2.NetParameter) else "<NetParameter>")
    return param


class Net:
    """A network. ``Net(prototxt_or_param, phase)``; also the pycaffe forms
    ``Net(file, phase, level=0, stages=None, weights=None)`` and ``Net(file, weights, phase)``.
    """

    def __init__(
        self,
        network: str | os.PathLike | caffe_pb2.NetParameter,
        *args,
        phase: int | None = None,
        level: int = 0,
        stages: Sequence[str] | None = None,
        weights: str | os.PathLike | None = None,
        dtype: np.dtype | type = np.float32,
    ) -> None:
        # Accept the positional pycaffe forms: (file, phase) and legacy (file, weights, phase).
        if len(args) == 1:
            phase = args[0] if phase is None else phase
        elif len(args) == 2:
            weights, phase = args
        elif len(args) > 2:
            raise TypeError("Net(file, phase) or Net(file, weights, phase)")
        param = load_net_param(network)
        if phase is not None:
            param.state.phase = int(phase)
        elif not param.state.HasField("phase"):
            param.state.phase = common.TEST
        param.state.level = level if level else param.state.level
        if stages:
            del param.state.stage[:]
            param.state.stage.extend(stages)
        self.dtype = np.dtype(dtype)
        # Replay fixed-shape GPU ranges as CUDA graphs (PYCAFFE_LITE_CUDA_GRAPHS=0 turns it off).
        self.use_cuda_graphs = os.environ.get("PYCAFFE_LITE_CUDA_GRAPHS", "1") != "0"
        self._graph_runner = None
        self.source = str(network) if not isinstance(network, caffe_pb2.NetParameter) else None
        self._init(param)
        if weights is not None:
            self.copy_from(weights)

    # ------------------------------------------------------------------------------------------
    # construction
    def _init(self, in_param: caffe_pb2.NetParameter) -> None:
        filtered = filter_net(in_param)
        param = insert_splits(filtered)
        self.param = param
        self.name = param.name
        self.phase = param.state.phase
        self.layers: list[Layer] = []
        self._layer_names: list[str] = []
        self._blobs: list[Blob] = []
        self._blob_names: list[str] = []
        self._blob_name_to_idx: dict[str, int] = {}
        self._blob_need_backward: list[bool] = []
        self.bottom_vecs: list[list[Blob]] = []
        self.bottom_id_vecs: list[list[int]] = []
        self.bottom_need_backward: list[list[bool]] = []
        self.top_vecs: list[list[Blob]] = []
        self.top_id_vecs: list[list[int]] = []
        self.layer_need_backward: list[bool] = []
        self._blob_loss_weights: list[float] = []
        # parameters
        self.params_list: list[Blob] = []  # every layer param blob, in order (Caffe's params_)
        self.param_owners: list[int] = []  # -1: owner, else index of the owning param
        self.param_display_names: list[str] = []
        self.param_layer_indices: list[tuple[int, int]] = []
        self.learnable_params: list[Blob] = []
        self.learnable_param_ids: list[int] = []  # per entry of params_list
        self.params_lr: list[float | None] = []
        self.params_weight_decay: list[float | None] = []
        self._param_names_index: dict[str, int] = {}
        self._layer_names_index: dict[str, int] = {}
        self._lr_explicit: dict[int, tuple[bool, bool]] = {}  # owner param -> lr/decay given?

        available: dict[str, int] = {}  # blobs produced and not yet consumed (net outputs at the end)
        input_names = []
        for layer_id, lp in enumerate(param.layer):
            if lp.name in self._layer_names_index:
                raise NetError(f"net '{self.name}': two layers are named '{lp.name}'")
            if not lp.HasField("phase"):
                lp.phase = self.phase
            layer = create_layer(lp, self.dtype)
            self.layers.append(layer)
            self._layer_names.append(lp.name)
            self._layer_names_index[lp.name] = layer_id
            if lp.propagate_down and len(lp.propagate_down) != len(lp.bottom):
                raise NetError(
                    f"layer '{lp.name}': propagate_down has {len(lp.propagate_down)} entries, "
                    f"expected one per bottom ({len(lp.bottom)})"
                )
            bvec, bids, bneed = [], [], []
            need_backward = False
            for bi, bname in enumerate(lp.bottom):
                if bname not in self._blob_name_to_idx:
                    raise NetError(f"layer '{lp.name}' ({lp.type}): unknown bottom blob '{bname}'")
                if bname not in available:
                    raise NetError(
                        f"layer '{lp.name}' ({lp.type}): bottom blob '{bname}' was already consumed "
                        "(insert_splits should have split it)"
                    )
                bid = self._blob_name_to_idx[bname]
                del available[bname]
                prop = lp.propagate_down[bi] if lp.propagate_down else True
                bvec.append(self._blobs[bid])
                bids.append(bid)
                bneed.append(self._blob_need_backward[bid] and prop)
                need_backward |= self._blob_need_backward[bid]
            tvec, tids = [], []
            for ti, tname in enumerate(lp.top):
                self._append_top(lp, ti, tname, tvec, tids, available)
            if layer.auto_top_blobs:
                for ti in range(len(lp.top), layer.auto_top_count()):
                    tname = f"(automatic) {lp.name}_{ti}"
                    self._append_top(lp, ti, tname, tvec, tids, available)
            if lp.type == "Input":
                input_names.extend(lp.top)
            self.bottom_vecs.append(bvec)
            self.bottom_id_vecs.append(bids)
            self.bottom_need_backward.append(bneed)
            self.top_vecs.append(tvec)
            self.top_id_vecs.append(tids)
            try:
                layer.setup(bvec, tvec)
            except ShapeError as exc:
                raise ShapeError(f"layer '{lp.name}' ({lp.type}): {exc}") from None
            # Param specs a layer adds for itself in setup (BatchNorm's lr_mult 0) count too.
            if len(layer.layer_param.param) > len(lp.param):
                lp.param.extend(layer.layer_param.param[len(lp.param):])
            for ti, tid in enumerate(tids):
                while len(self._blob_loss_weights) <= tid:
                    self._blob_loss_weights.append(0.0)
                self._blob_loss_weights[tid] = layer.loss(ti)
            if len(lp.param) > len(layer.blobs):
                raise NetError(
                    f"layer '{lp.name}' ({lp.type}): {len(lp.param)} param specs but the layer has "
                    f"{len(layer.blobs)} param blobs"
                )
            for pi in range(len(layer.blobs)):
                spec = lp.param[pi] if pi < len(lp.param) else caffe_pb2.ParamSpec()
                need = spec.lr_mult != 0
                need_backward |= need
                layer.param_propagate_down[pi] = need
                self._append_param(layer_id, pi)
            self.layer_need_backward.append(need_backward)
            if need_backward:
                for tid in tids:
                    self._blob_need_backward[tid] = True

        self._compute_backward_needs(param)
        # A loss top that a later layer rewrites in place must be read right after its layer.
        self._loss_overwritten_later = [False] * len(self.layers)
        for i in range(len(self.layers)):
            if not self.layers[i].has_loss:
                continue
            mine = set(self.top_id_vecs[i])
            for j in range(i + 1, len(self.layers)):
                if mine & set(self.top_id_vecs[j]):
                    self._loss_overwritten_later[i] = True
                    break
        self.input_blob_indices = [self._blob_name_to_idx[n] for n in input_names]
        self.output_blob_indices = [self._blob_name_to_idx[n] for n in available]
        self._inputs = list(input_names)
        self._outputs = list(available)
        self._blob_dict = OrderedDict((n, self._blobs[i]) for i, n in enumerate(self._blob_names))

    def _append_top(self, lp, ti, tname, tvec, tids, available) -> None:
        if ti < len(lp.bottom) and lp.bottom[ti] == tname:  # in place
            bid = self._blob_name_to_idx[tname]
            blob = self._blobs[bid]
        else:
            if tname in self._blob_name_to_idx:
                raise NetError(
                    f"layer '{lp.name}' ({lp.type}): top blob '{tname}' is already produced by "
                    "another layer (duplicate top; in-place use needs the same name at the same "
                    "bottom position)"
                )
            blob = Blob(dtype=self.dtype)
            bid = len(self._blobs)
            self._blobs.append(blob)
            self._blob_names.append(tname)
            self._blob_need_backward.append(False)
            self._blob_name_to_idx[tname] = bid
        available[tname] = bid
        tvec.append(blob)
        tids.append(bid)

    def _append_param(self, layer_id: int, param_id: int) -> None:
        lp = self.param.layer[layer_id]
        layer = self.layers[layer_id]
        spec = lp.param[param_id] if param_id < len(lp.param) else None
        name = spec.name if spec is not None and spec.name else ""
        net_param_id = len(self.params_list)
        blob = layer.blobs[param_id]
        self.params_list.append(blob)
        self.param_layer_indices.append((layer_id, param_id))
        self.param_display_names.append(name or str(param_id))
        if not name or name not in self._param_names_index:
            if name:
                self._param_names_index[name] = net_param_id
            self.param_owners.append(-1)
            self.learnable_param_ids.append(len(self.learnable_params))
            self.learnable_params.append(blob)
            has_lr = spec is not None and spec.HasField("lr_mult")
            has_decay = spec is not None and spec.HasField("decay_mult")
            self.params_lr.append(spec.lr_mult if has_lr else 1.0)
            self.params_weight_decay.append(spec.decay_mult if has_decay else 1.0)
            self._lr_explicit[net_param_id] = (has_lr, has_decay)
            return
        owner_id = self._param_names_index[name]
        self.param_owners.append(owner_id)
        owner = self.params_list[owner_id]
        owner_layer, owner_pi = self.param_layer_indices[owner_id]
        mode = spec.share_mode
        if mode == caffe_pb2.ParamSpec.PERMISSIVE:
            if owner.count != blob.count:
                raise ShapeError(
                    f"layer '{lp.name}': shared param '{name}' has {blob.count} elements here but "
                    f"{owner.count} in owner layer '{self._layer_names[owner_layer]}'"
                )
        elif owner.shape != blob.shape:
            raise ShapeError(
                f"layer '{lp.name}': shared param '{name}' has shape {blob.shape} here but "
                f"{owner.shape} in owner layer '{self._layer_names[owner_layer]}' "
                "(use share_mode PERMISSIVE to require only equal counts)"
            )
        learnable_id = self.learnable_param_ids[owner_id]
        self.learnable_param_ids.append(learnable_id)
        has_lr, has_decay = self._lr_explicit[owner_id]
        if spec.HasField("lr_mult"):
            if has_lr and self.params_lr[learnable_id] != spec.lr_mult:
                raise NetError(f"layer '{lp.name}': shared param '{name}' has mismatched lr_mult")
            self.params_lr[learnable_id] = spec.lr_mult
            self._lr_explicit[owner_id] = (True, has_decay)
        if spec.HasField("decay_mult"):
            if has_decay and self.params_weight_decay[learnable_id] != spec.decay_mult:
                raise NetError(f"layer '{lp.name}': shared param '{name}' has mismatched decay_mult")
            self.params_weight_decay[learnable_id] = spec.decay_mult
            self._lr_explicit[owner_id] = (self._lr_explicit[owner_id][0], True)
        blob.share_data(owner)
        blob.share_diff(owner)

    def _compute_backward_needs(self, param: caffe_pb2.NetParameter) -> None:
        """Caffe's pass from the last layer back: only layers that contribute to a loss backprop."""
        under_loss: set[str] = set()
        skip_backprop: set[str] = set()
        for li in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[li]
            lp = self.param.layer[li]
            contributes = False
            skip_propagate = True
            for ti, tid in enumerate(self.top_id_vecs[li]):
                tname = self._blob_names[tid]
                if layer.loss(ti) or tname in under_loss:
                    contributes = True
                if tname not in skip_backprop:
                    skip_propagate = False
                if contributes and not skip_propagate:
                    break
            if self.layer_need_backward[li] and skip_propagate:
                self.layer_need_backward[li] = False
                self.bottom_need_backward[li] = [False] * len(self.bottom_need_backward[li])
            if not contributes:
                self.layer_need_backward[li] = False
            for bi, bname in enumerate(lp.bottom):
                if contributes:
                    under_loss.add(bname)
                else:
                    self.bottom_need_backward[li][bi] = False
                if not self.bottom_need_backward[li][bi]:
                    skip_backprop.add(bname)
        if param.force_backward:
            for li, layer in enumerate(self.layers):
                self.layer_need_backward[li] = True
                for bi, bid in enumerate(self.bottom_id_vecs[li]):
                    need = self.bottom_need_backward[li][bi] or layer.allow_force_backward(bi)
                    self.bottom_need_backward[li][bi] = need
                    self._blob_need_backward[bid] = self._blob_need_backward[bid] or need
                layer.param_propagate_down = [True] * len(layer.blobs)

    # ------------------------------------------------------------------------------------------
    # running
    def _layer_index(self, key: int | str | None, default: int) -> int:
        if key is None:
            return default
        if isinstance(key, str):
            if key not in self._layer_names_index:
                raise NetError(f"net '{self.name}': no layer named '{key}'")
            return self._layer_names_index[key]
        if not 0 <= key < len(self.layers):
            raise NetError(f"net '{self.name}': layer index {key} out of range (0..{len(self.layers) - 1})")
        return int(key)

    def forward_from_to(self, start: int, end: int) -> float:
        """Run layers ``start``..``end`` (inclusive); returns the summed weighted loss."""
        if any(self._loss_overwritten_later[start : end + 1]):
            return self._forward_eager(start, end)
        first = start  # leading host-side layers (data readers) run eagerly, the rest as a graph
        while first <= end and not self._graphable(first, first):
            first += 1
        if first > end or not self._graphable(first, end):
            return self._forward_eager(start, end)
        self._forward_compute(start, first - 1)
        self._graph_run(("fwd", first, end), first, end, lambda: self._forward_compute(first, end))
        # Losses are read once the whole range is queued (one host sync on the GPU).
        return self._range_loss(start, end)

    def _forward_compute(self, start: int, end: int) -> None:
        for i in range(start, end + 1):
            self.layers[i].compute_forward(self.bottom_vecs[i], self.top_vecs[i])

    def _range_loss(self, start: int, end: int) -> float:
        return sum(
            self.layers[i].weighted_loss(self.top_vecs[i])
            for i in range(start, end + 1)
            if self.layers[i].has_loss
        )

    def _forward_eager(self, start: int, end: int) -> float:
        loss = 0.0
        deferred = []
        for i in range(start, end + 1):
            layer = self.layers[i]
            layer.compute_forward(self.bottom_vecs[i], self.top_vecs[i])
            if layer.has_loss:
                if self._loss_overwritten_later[i]:
                    loss += layer.weighted_loss(self.top_vecs[i])
                else:
                    deferred.append(i)
        return loss + sum(self.layers[i].weighted_loss(self.top_vecs[i]) for i in deferred)

    # -- CUDA graphs ------------------------------------------------------------------------------
    def _graphable(self, start: int, end: int) -> bool:
        if not self.use_cuda_graphs or common.mode() is not common.Mode.GPU:
            return False
        return all(self._layer_graph_safe(self.layers[i]) for i in range(min(start, end), max(start, end) + 1))

    @staticmethod
    def _layer_graph_safe(layer: Layer) -> bool:
        """Declared safe and really on the GPU (the inherited GPU path runs host code)."""
        cls = type(layer)
        return layer.graph_safe and (cls.forward_gpu is not Layer.forward_gpu) and (
            cls.backward_gpu is not Layer.backward_gpu or cls.backward_cpu is Layer.backward_cpu
        )

    def _graph_memories(self):
        for blob in self._blobs:
            yield blob.data_memory
            yield blob.diff_memory
        for blob in self.params_list:
            yield blob.data_memory
            yield blob.diff_memory

    def _graph_key(self, tag) -> tuple:
        from .gpu import backend

        # a new random seed re-keys device generators (Dropout), which happens outside a replay
        return (tag, backend.state().alloc_generation, common.seed_generation(), tuple(b.shape for b in self._blobs))

    def _graph_run(self, tag, start: int, end: int, work) -> None:
        if self._graph_runner is None:
            from .graph_runner import GraphRunner

            self._graph_runner = GraphRunner(self._graph_memories)
        self._graph_runner.run(self._graph_key(tag), work)

    def graph_replays(self) -> int:
        """How many CUDA graph replays this net has made (0 when graphs are off or unused)."""
        return self._graph_runner.replays if self._graph_runner is not None else 0

    def backward_from_to(self, start: int, end: int) -> None:
        """Backward through layers ``start`` down to ``end`` (inclusive, start >= end)."""
        low = end  # the lowest layers (data readers, usually needing no backward) run eagerly last
        while low <= start and not self._graphable(low, low):
            low += 1
        if low > start or not self._graphable(low, start):
            self._backward_compute(start, end)
            return
        self._graph_run(("bwd", start, low), low, start, lambda: self._backward_compute(start, low))
        self._backward_compute(low - 1, end)

    def _backward_compute(self, start: int, end: int) -> None:
        for i in range(start, end - 1, -1):
            if self.layer_need_backward[i]:
                self.layers[i].backward(self.top_vecs[i], self.bottom_need_backward[i], self.bottom_vecs[i])

    def forward_prefilled(self) -> float:
        return self.forward_from_to(0, len(self.layers) - 1)

    def forward_backward(self) -> float:
        loss = self.forward_prefilled()
        self.backward_from_to(len(self.layers) - 1, 0)
        return loss

    def reshape(self) -> None:
        """Propagate input shape changes through every layer."""
        for i, layer in enumerate(self.layers):
            layer.reshape(self.bottom_vecs[i], self.top_vecs[i])

    def clear_param_diffs(self) -> None:
        """Zero the gradients of every learnable param."""
        on_gpu = common.mode() is common.Mode.GPU
        for blob in self.learnable_params:
            if on_gpu:
                from .gpu import backend

                backend.memset_zero(blob.mutable_gpu_diff(), blob.count * blob.dtype.itemsize)
            else:
                blob.mutable_cpu_diff()[...] = 0

    # ------------------------------------------------------------------------------------------
    # pycaffe surface
    @property
    def blobs(self) -> OrderedDict[str, Blob]:
        """Ordered blob name -> Blob."""
        return self._blob_dict

    @property
    def params(self) -> OrderedDict[str, list[Blob]]:
        """Ordered layer name -> its param blobs (layers with params only)."""
        return OrderedDict(
            (name, layer.blobs) for name, layer in zip(self._layer_names, self.layers) if layer.blobs
        )

    @property
    def layer_dict(self) -> OrderedDict[str, Layer]:
        return OrderedDict(zip(self._layer_names, self.layers))

    @property
    def inputs(self) -> list[str]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[str]:
        return list(self._outputs)

    @property
    def blob_loss_weights(self) -> OrderedDict[str, float]:
        """Blob name -> loss weight."""
        return OrderedDict(zip(self._blob_names, self._blob_loss_weights))

    def top_names_of(self, layer: int) -> list[str]:
        return [self._blob_names[i] for i in self.top_id_vecs[layer]]

    def bottom_names_of(self, layer: int) -> list[str]:
        return [self._blob_names[i] for i in self.bottom_id_vecs[layer]]

    @property
    def top_names(self) -> OrderedDict[str, list[str]]:
        return OrderedDict((n, self.top_names_of(i)) for i, n in enumerate(self._layer_names))

    @property
    def bottom_names(self) -> OrderedDict[str, list[str]]:
        return OrderedDict((n, self.bottom_names_of(i)) for i, n in enumerate(self._layer_names))

    def _set_input_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        for name, value in arrays.items():
            if name not in self._inputs:
                raise NetError(f"net '{self.name}': '{name}' is not an input blob (inputs: {self._inputs})")
            blob = self._blob_dict[name]
            value = np.asarray(value)
            if value.shape != blob.shape:
                raise ShapeError(
                    f"net '{self.name}': input '{name}' has shape {value.shape}, blob expects {blob.shape} "
                    "(call blob.reshape(...) and net.reshape() first to change it)"
                )
            blob.data[...] = value

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
        end_i = self._layer_index(end, len(self.layers) - 1)
        if end is not None:
            outputs = set(self.top_names_of(end_i))
        else:
            outputs = set(self._outputs)
        outputs |= set(blobs or ())
        self.forward_from_to(start_i, end_i)
        return {name: self._blob_dict[name].data for name in self._blob_names if name in outputs}

    def backward(
        self,
        diffs: Iterable[str] | None = None,
        start: int | str | None = None,
        end: int | str | None = None,
        **kwargs,
    ) -> dict[str, np.ndarray]:
        """pycaffe: set top diffs from ``kwargs``, run backward, return {input name: diff}."""
        start_i = self._layer_index(start, len(self.layers) - 1)
        end_i = self._layer_index(end, 0)
        outputs = set(self.bottom_names_of(end_i)) if end is not None else set(self._inputs)
        outputs |= set(diffs or ())
        for name, value in kwargs.items():
            if name not in self._blob_dict:
                raise NetError(f"net '{self.name}': no blob named '{name}' to set a diff on")
            blob = self._blob_dict[name]
            value = np.asarray(value)
            if value.shape != blob.shape:
                raise ShapeError(f"net '{self.name}': diff for '{name}' has shape {value.shape}, blob is {blob.shape}")
            blob.diff[...] = value
        self.backward_from_to(start_i, end_i)
        return {name: self._blob_dict[name].diff for name in self._blob_names if name in outputs}

    # ------------------------------------------------------------------------------------------
    # weights
    def to_proto(self, write_diff: bool = False) -> caffe_pb2.NetParameter:
        """The net definition with each layer's learned blobs, as a .caffemodel holds it."""
        out = caffe_pb2.NetParameter()
        out.name = self.name
        for lp, layer in zip(self.param.layer, self.layers):
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

    def copy_trained_layers_from(self, param: caffe_pb2.NetParameter, source: str = "<weights>") -> None:
        """Copy blobs layer by layer (matched by name); layers absent from ``param`` keep theirs."""
        from . import upgrade

        upgrade.upgrade_net(param, source=source)
        for src in param.layer:
            if src.name not in self._layer_names_index:
                continue
            layer = self.layers[self._layer_names_index[src.name]]
            if len(src.blobs) != len(layer.blobs):
                raise WeightsError(
                    f"{source}: layer '{src.name}' has {len(src.blobs)} blobs in the file but "
                    f"{len(layer.blobs)} in the net"
                )
            for i, (proto, blob) in enumerate(zip(src.blobs, layer.blobs)):
                try:
                    blob.from_proto(proto, reshape=False, where=f"{source}: layer '{src.name}' param {i}")
                except ShapeError as exc:
                    raise WeightsError(f"cannot copy weights: {exc}") from None

    def copy_from(self, path: str | os.PathLike) -> None:
        """Load weights from a .caffemodel (binary NetParameter) or an HDF5 file (.h5)."""
        path = str(path)
        from . import pycaffe

        if pycaffe.is_hdf5_file(path):  # by signature, as Caffe does
            pycaffe._Net_load_hdf5(self, path)
            return
        try:
            param = protoio.read_binary(path, caffe_pb2.NetParameter(), "caffemodel")
        except Exception as exc:  # unreadable or corrupt file
            raise WeightsError(str(exc)) from None
        self.copy_trained_layers_from(param, source=path)

    def share_with(self, other: Net) -> None:
        """Share the weights of ``other``'s same-named layers (Caffe's ShareTrainedLayersWith)."""
        for src_name, src_layer in zip(other._layer_names, other.layers):
            if src_name not in self._layer_names_index:
                continue
            layer = self.layers[self._layer_names_index[src_name]]
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
