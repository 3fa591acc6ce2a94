"""Net: pycaffe's face of a built net (Caffe's ``Net`` as pycaffe scripts see it).

:func:`~pycaffe_lite.net_builder.build_net` builds the :class:`~pycaffe_lite.net_graph.NetGraph`
(filtering, splits, wiring, shared params) and an :class:`~pycaffe_lite.runtime.executor.Executor`
runs it; ``Net`` is the thin view users' scripts hold: ``blobs``, ``params``, ``forward(**inputs)``,
``backward``, the batch helpers, weights in and out, and Caffe's underscore names as views of the graph.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import zip_longest
from typing import Any, cast

import numpy as np

from . import common
from .blob import Blob
from .errors import CaffeError, NetError, ShapeError
from .layer import Layer
from .net_builder import build_net, check_tops_hold_values, in_file, load_net_param
from .net_graph import NetGraph
from .optional import require
from .proto import caffemodel, hdf5_weights, protoio
from .runtime.executor import Executor
from .schema import caffe_pb2
from .vectors import BlobVec, IntVec

log = logging.getLogger("pycaffe_lite")

__all__ = ["Net", "in_file", "load_net_param"]


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


def _numeric(value: Any, what: str) -> np.ndarray:
    """``value`` as an array of numbers (bool, int or float), or a NetError naming ``what``."""
    try:
        arr = np.asarray(value)
    except ValueError as exc:  # ragged nested lists
        raise NetError(f"{what}: not an array of numbers ({exc})") from None
    if arr.dtype.kind not in "biuf":
        raise NetError(f"{what}: holds {arr.dtype} values ({type(arr.flat[0]).__name__ if arr.size else 'none'}); "
                       "expected numbers (convert them first, e.g. np.asarray(x, np.float32))")
    return arr


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
        source = str(network) if not isinstance(network, caffe_pb2.NetParameter) else None
        try:
            graph = build_net(param, dtype)
        except CaffeError as exc:
            raise in_file(exc, source) from None
        self._view(graph, Executor(graph), source)
        if weights is not None:
            self.copy_from(weights)

    @classmethod
    def over(cls, graph: NetGraph, executor: Executor, source: str | None = None) -> Net:
        """pycaffe's view of a built ``graph`` run by ``executor`` (what a Solver's ``net`` is)."""
        net = cls.__new__(cls)
        net._view(graph, executor, source)
        return net

    def _view(self, graph: NetGraph, executor: Executor, source: str | None) -> None:
        self.graph, self.executor, self.source = graph, executor, source
        self.dtype = graph.dtype
        assert graph.param is not None
        self.param = graph.param
        self._blob_dict = OrderedDict((n, graph.blobs[i]) for i, n in enumerate(graph.blob_names))
        self._debug_info = False
        self._debug_hooked = False
        self.debug_info = bool(graph.param.debug_info)

    # ------------------------------------------------------------------------------------------
    # construction
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

    # ------------------------------------------------------------------------------------------
    # running
    def _layer_index(self, key: int | str | None, default: int) -> int:
        if key is None:
            return default
        if isinstance(key, str):
            index = self.graph.first_layer_index(key)
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
        return self.executor.forward_backward()

    def reshape(self) -> None:
        """Propagate input shape changes through every layer."""
        for i, layer in enumerate(self.graph.layers):
            layer.reshape(self.graph.bottom_vecs[i], self.graph.top_vecs[i])
            check_tops_hold_values(self.graph, i)

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
            value = _numeric(value, f"net '{self.name}': input '{name}'")
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
            value = _numeric(value, f"net '{self.name}': diff for '{name}'")
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
        """pycaffe: set inputs from ``kwargs``, run forward, return {output name: data}. The data
        are the blobs' storage arrays, as ``blob.data``: in a half net (docs/precision.md) float16
        arrays, or uint16 bit patterns for bfloat16; ``net.blobs[name].math_data()`` gives float32
        values."""
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
        """pycaffe: set top diffs from ``kwargs``, run backward, return {input name: diff} (storage
        arrays, as :meth:`forward`'s; ``math_diff()`` gives float32 values)."""
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
        return caffemodel.to_proto(self.graph, write_diff)

    def save(self, path: str | os.PathLike, write_diff: bool = False) -> None:
        """Write a binary .caffemodel (atomically)."""
        protoio.write_binary(path, self.to_proto(write_diff))

    def copy_trained_layers_from(self, param: caffe_pb2.NetParameter, source: str = "<weights>") -> list[str]:
        """Copy blobs layer by layer (matched by name); layers absent from ``param`` keep theirs.
        Returns the names of the net's layers with parameters that got none (logged as a warning)."""
        return caffemodel.copy_trained_layers(self.graph, param, source)

    def copy_from(self, path: str | os.PathLike, allow_missing: bool = True) -> list[str]:
        """Load weights from a .caffemodel (binary NetParameter) or an HDF5 file (.h5)
        (:func:`pycaffe_lite.proto.caffemodel.copy_from`)."""
        return caffemodel.copy_from(self.graph, path, allow_missing)

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
        caffemodel.share_trained_layers(self.graph, other.graph)
