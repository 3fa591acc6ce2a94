"""Net weights in Caffe's HDF5 layout: ``/data/<layer name>/<param index>`` (and ``/diff/...``
when diffs are written), as BVLC's ``Net::ToHDF5`` / ``CopyTrainedLayersFromHDF5`` use them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import WeightsError

if TYPE_CHECKING:
    from ..net_graph import NetGraph


def _h5py():
    try:
        import h5py
    except ImportError:
        raise ImportError("HDF5 weights need the h5py package: pip install h5py") from None
    return h5py


_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def is_hdf5_file(path: str | os.PathLike) -> bool:
    """True when ``path`` starts with the HDF5 signature (how Caffe tells .h5 weights apart)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(8) == _HDF5_MAGIC
    except OSError:
        return False


def _param_ids(net: NetGraph) -> dict[tuple[int, int], int]:
    return {pair: i for i, pair in enumerate(net.param_layer_indices)}


def save(net: NetGraph, filename: str | os.PathLike, write_diff: bool = False) -> None:
    """Write the params in Caffe's HDF5 layout: ``/data/<layer>/<j>`` (and ``/diff``), one
    group per layer; a shared param is stored only under its owner."""
    h5py = _h5py()
    ids = _param_ids(net)
    with h5py.File(os.fspath(filename), "w") as f:
        groups = [f.create_group("data")] + ([f.create_group("diff")] if write_diff else [])
        for li, (name, layer) in enumerate(zip(net.layer_names, net.layers)):
            for g in groups:
                g.create_group(name)
            for j, blob in enumerate(layer.blobs):
                if net.param_owners[ids[(li, j)]] != -1:
                    continue
                f["data"][name].create_dataset(str(j), data=blob.cpu_data())
                if write_diff:
                    f["diff"][name].create_dataset(str(j), data=blob.cpu_diff())


def load(net: NetGraph, filename: str | os.PathLike) -> None:
    """Copy params from a Caffe HDF5 weights file; layers absent from the net are ignored and
    shapes must match exactly."""
    h5py = _h5py()
    filename = os.fspath(filename)
    ids = _param_ids(net)
    index = {name: i for i, name in enumerate(net.layer_names)}
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
            layer = net.layers[li]
            if len(group) > len(layer.blobs):
                raise WeightsError(
                    f"{filename}: layer '{lname}' has {len(group)} blobs in the file but "
                    f"{len(layer.blobs)} in the net"
                )
            for j, blob in enumerate(layer.blobs):
                key = str(j)
                if key not in group:
                    if net.param_owners[ids[(li, j)]] == -1:
                        raise WeightsError(f"{filename}: layer '{lname}' lacks param {j}")
                    continue  # shared params are stored under their owner
                values = group[key][()]
                if tuple(values.shape) != blob.shape:
                    raise WeightsError(
                        f"{filename}: layer '{lname}' param {j}: shape mismatch: net has "
                        f"{blob.shape}, file has {tuple(values.shape)}"
                    )
                blob.mutable_cpu_data()[...] = values
