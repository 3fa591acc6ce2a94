"""BVLC pycaffe's Python-side Net methods, attached to :class:`pycaffe_lite.net.Net`.

As in BVLC's ``pycaffe.py`` the methods are set on the class itself, so every Net (including the
ones a solver builds) has them: ``forward_all``, ``forward_backward_all``, ``set_input_arrays``
(MemoryData nets), ``save_hdf5`` / ``load_hdf5`` (weights in Caffe's HDF5 layout:
``/data/<layer name>/<param index>``, and ``/diff/...`` when diffs are written).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from itertools import zip_longest

import numpy as np

from .errors import NetError, ShapeError, WeightsError
from .net import Net
from .optional import require


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


def _Net_batch(self: Net, arrays: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
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


def _Net_forward_all(self: Net, blobs: Iterable[str] | None = None, **kwargs) -> dict[str, np.ndarray]:
    """Run forward over inputs of any length in batches of the net's batch size.

    ``kwargs``: input blob name -> (N, ...) array. Returns {blob name: (N, ...) array} for the
    outputs and ``blobs``; the padding of the last batch is dropped. Without inputs, runs one
    forward pass (data layers feed the net) and returns copies of the outputs.
    """
    blobs = list(blobs or [])
    names = set(self.outputs) | set(blobs)
    collected: dict[str, list[np.ndarray]] = {name: [] for name in names}
    if not kwargs:
        outs = self.forward(blobs=blobs)
        return {name: np.array(value, copy=True) for name, value in outs.items()}
    for batch in self._batch(kwargs):
        outs = self.forward(blobs=blobs, **batch)
        for name in names:
            collected[name].append(np.array(outs[name], copy=True))
    num = _num_items(kwargs)
    return {name: _join(parts, num) for name, parts in collected.items()}


def _Net_forward_backward_all(
    self: Net, blobs: Iterable[str] | None = None, diffs: Iterable[str] | None = None, **kwargs
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Forward and backward in batches.

    ``kwargs`` holds input arrays (for forward) and output-diff arrays (for backward), keyed by
    blob name; a missing side uses what the net already holds. Returns (outputs + ``blobs``
    data, inputs + ``diffs`` diffs), each {name: (N, ...) array} with the padding dropped.
    """
    blobs, diffs = list(blobs or []), list(diffs or [])
    unknown = set(kwargs) - set(self.inputs) - set(self.outputs)
    if unknown:
        raise NetError(
            f"net '{self.name}': {sorted(unknown)} are neither inputs {self.inputs} nor outputs {self.outputs}"
        )
    out_names = set(self.outputs) | set(blobs)
    diff_names = set(self.inputs) | set(diffs)
    all_outs: dict[str, list[np.ndarray]] = {n: [] for n in out_names}
    all_diffs: dict[str, list[np.ndarray]] = {n: [] for n in diff_names}
    fwd = {n: kwargs[n] for n in self.inputs if n in kwargs}
    bwd = {n: kwargs[n] for n in self.outputs if n in kwargs}
    fwd_batches = self._batch(fwd) if fwd else iter(())
    bwd_batches = self._batch(bwd) if bwd else iter(())
    for fb, bb in zip_longest(fwd_batches, bwd_batches, fillvalue={}):
        outs = self.forward(blobs=blobs, **fb)
        grads = self.backward(diffs=diffs, **bb)
        for n in out_names:
            all_outs[n].append(np.array(outs[n], copy=True))
        for n in diff_names:
            all_diffs[n].append(np.array(grads[n], copy=True))
    num = _num_items(kwargs) if kwargs else None
    outs_final = {n: _join(v, num) for n, v in all_outs.items() if v}
    diffs_final = {n: _join(v, num) for n, v in all_diffs.items() if v}
    return outs_final, diffs_final


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


def _Net_set_input_arrays(self: Net, data: np.ndarray, labels: np.ndarray) -> None:
    """Feed the net's first layer, a MemoryData layer, with ``data`` (N, C, H, W) float32 C-order
    and ``labels`` (N,) or (N, 1, 1, 1); N must be a multiple of the layer's batch size. The
    arrays are used in place (not copied): keep them unchanged while the net reads them."""
    if not self.layers or self.layers[0].type != "MemoryData":
        first = f"'{self._layer_names[0]}' ({self.layers[0].type})" if self.layers else "none"
        raise NetError(
            f"net '{self.name}': set_input_arrays may only be called if the first layer is a "
            f"MemoryData layer (first layer: {first})"
        )
    layer = self.layers[0]
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


def _h5py():
    return require("h5py", feature="HDF5 weights")


_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def is_hdf5_file(path: str | os.PathLike) -> bool:
    """True when ``path`` starts with the HDF5 signature (how Caffe tells .h5 weights apart)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(8) == _HDF5_MAGIC
    except OSError:
        return False


def _param_ids(net: Net) -> dict[tuple[int, int], int]:
    return {pair: i for i, pair in enumerate(net.param_layer_indices)}


def _Net_save_hdf5(self: Net, filename: str | os.PathLike, write_diff: bool = False) -> None:
    """Write the params in Caffe's HDF5 layout: ``/data/<layer>/<j>`` (and ``/diff``), one
    group per layer; a shared param is stored only under its owner."""
    h5py = _h5py()
    ids = _param_ids(self)
    with h5py.File(os.fspath(filename), "w") as f:
        groups = [f.create_group("data")] + ([f.create_group("diff")] if write_diff else [])
        for li, (name, layer) in enumerate(zip(self._layer_names, self.layers)):
            for g in groups:
                g.create_group(name)
            for j, blob in enumerate(layer.blobs):
                if self.param_owners[ids[(li, j)]] != -1:
                    continue
                f["data"][name].create_dataset(str(j), data=blob.cpu_data())
                if write_diff:
                    f["diff"][name].create_dataset(str(j), data=blob.cpu_diff())


def _Net_load_hdf5(self: Net, filename: str | os.PathLike) -> None:
    """Copy params from a Caffe HDF5 weights file; layers absent from the net are ignored and
    shapes must match exactly."""
    h5py = _h5py()
    filename = os.fspath(filename)
    ids = _param_ids(self)
    index = {name: i for i, name in enumerate(self._layer_names)}
    try:
        f = h5py.File(filename, "r")
    except OSError as exc:
        raise WeightsError(f"{filename}: cannot open HDF5 weights file: {exc}") from None
    with f:
        if "data" not in f:
            raise WeightsError(f"{filename}: no 'data' group (not a Caffe HDF5 weights file)")
        for lname, group in f["data"].items():
            if lname not in index:
                continue
            li = index[lname]
            layer = self.layers[li]
            if len(group) > len(layer.blobs):
                raise WeightsError(
                    f"{filename}: layer '{lname}' has {len(group)} blobs in the file but "
                    f"{len(layer.blobs)} in the net"
                )
            for j, blob in enumerate(layer.blobs):
                key = str(j)
                if key not in group:
                    if self.param_owners[ids[(li, j)]] == -1:
                        raise WeightsError(f"{filename}: layer '{lname}' lacks param {j}")
                    continue  # shared params are stored under their owner
                values = group[key][()]
                if tuple(values.shape) != blob.shape:
                    raise WeightsError(
                        f"{filename}: layer '{lname}' param {j}: shape mismatch: net has "
                        f"{blob.shape}, file has {tuple(values.shape)}"
                    )
                blob.mutable_cpu_data()[...] = values


Net._batch = _Net_batch
Net.forward_all = _Net_forward_all
Net.forward_backward_all = _Net_forward_backward_all
Net.set_input_arrays = _Net_set_input_arrays
Net.save_hdf5 = _Net_save_hdf5
Net.load_hdf5 = _Net_load_hdf5

__all__ = ["Net", "is_hdf5_file"]
