"""HDF5Data: batches of rows read from HDF5 files (BVLC's HDF5DataLayer).

``hdf5_data_param { source batch_size shuffle }``. ``source`` is a text file listing ``.h5``
files (whitespace-separated, normally one per line; relative paths are taken relative to the
current directory, as in Caffe). Each top reads the dataset named like the top: a dataset of
shape ``(N, ...)`` gives a top of shape ``(batch_size, ...)``; all datasets of one file must have
the same ``N``. Files are loaded whole, one at a time; rows are served in order and the read moves
to the next file after the last row, wrapping to the first file after the last. With ``shuffle``
the file order is shuffled at set-up and at each wrap, and the row order of a file when it is
loaded and each time its rows run out (random numbers from ``pycaffe_lite.common.rng()``).
``read_state()`` / ``restore_read_state()`` give and set the file, row and shuffled orders (kept in
solver snapshots for an exact resume). No backward. Needs h5py.
"""

from __future__ import annotations

import json
import os

import numpy as np

from pycaffe_lite.data.order import Order
from pycaffe_lite.errors import DataError
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.optional import require


def read_file_list(source: str, where: str) -> list[str]:
    """The HDF5 file names listed in ``source`` (whitespace-separated tokens, as Caffe reads them)."""
    if not source:
        raise DataError(f"{where}: hdf5_data_param.source is empty (expected a text file listing .h5 files)")
    try:
        with open(source, encoding="utf-8") as fh:
            names = fh.read().split()
    except OSError as exc:
        raise DataError(f"{where}: cannot open source file {source}: {exc.strerror or exc}") from None
    if not names:
        raise DataError(f"{where}: source file {source} lists no HDF5 files (expected at least 1)")
    return names


@register_layer("HDF5Data")
class HDF5DataLayer(Layer):
    traits = Traits()  # a host-side reader: runs plainly before a replayed graph
    exact_num_bottom_blobs = 0
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.hdf5_data_param
        if p.batch_size <= 0:
            raise self.error(f"hdf5_data_param.batch_size must be positive, got {p.batch_size}")
        self.batch_size = int(p.batch_size)
        self.shuffle = bool(p.shuffle)
        self.dataset_names = list(self.layer_param.top)[: len(top)]
        if len(self.dataset_names) != len(top):
            raise self.error("every top needs a name (the name of the dataset it reads)")
        self.files = read_file_list(p.source, self.where)
        self.file_order = Order(len(self.files))
        if self.shuffle:
            self.file_order.shuffle()
        self.current_file = 0
        self.arrays: list[np.ndarray] = []
        self._open(0)
        for blob, arr in zip(top, self.arrays):
            blob.reshape((self.batch_size, *arr.shape[1:]))

    def _open(self, index: int) -> None:
        """Load the ``index``-th file of the (shuffled) file order; rows from the first, shuffled."""
        self.current_file = index
        self._load(self.files[self.file_order.order[index]])
        if self.shuffle:
            self.rows.shuffle()
        self.current_row = 0

    def _load(self, path: str) -> None:
        """Read every top's dataset from ``path`` (rows in file order)."""
        h5py = require("h5py", feature=self.where)
        if not os.path.isfile(path):
            raise DataError(f"{self.where}: HDF5 file {path} (listed in {self.layer_param.hdf5_data_param.source}) "
                            "not found")
        arrays = []
        try:
            with h5py.File(path, "r") as f:
                for name in self.dataset_names:
                    if name not in f or not isinstance(f[name], h5py.Dataset):
                        raise DataError(f"{self.where}: HDF5 file {path} has no dataset '{name}' "
                                        f"(each top reads the dataset of its name; found {sorted(f.keys())})")
                    ds = f[name]
                    if ds.dtype.kind not in "fiub":
                        raise DataError(f"{self.where}: HDF5 file {path}: dataset '{name}' has type {ds.dtype}; "
                                        "expected numbers")
                    if ds.ndim < 1:
                        raise DataError(f"{self.where}: HDF5 file {path}: dataset '{name}' is a scalar; "
                                        "expected at least 1 axis (rows)")
                    arrays.append(np.asarray(ds[()], dtype=self.dtype))
        except DataError:
            raise
        except Exception as exc:  # not an HDF5 file, unreadable...
            raise DataError(f"{self.where}: cannot read HDF5 file {path}: {exc}") from None
        num = arrays[0].shape[0]
        for name, arr in zip(self.dataset_names, arrays):
            if arr.shape[0] != num:
                raise DataError(f"{self.where}: HDF5 file {path}: dataset '{name}' has {arr.shape[0]} rows, "
                                f"'{self.dataset_names[0]}' has {num} (top outputs must have the same num)")
        if num == 0:
            raise DataError(f"{self.where}: HDF5 file {path} has datasets with 0 rows")
        if self.arrays:
            for name, old, arr in zip(self.dataset_names, self.arrays, arrays):
                if old.shape[1:] != arr.shape[1:]:
                    raise DataError(f"{self.where}: HDF5 file {path}: dataset '{name}' has rows of shape "
                                    f"{arr.shape[1:]}, earlier files have {old.shape[1:]}")
        self.arrays = arrays
        self.loaded = path
        self.rows = Order(num)

    def _next(self) -> None:
        """Advance one row, moving to the next file (or wrapping) after the last row."""
        self.current_row += 1
        if self.current_row < self.arrays[0].shape[0]:
            return
        if len(self.files) == 1:
            self.current_row = 0
            if self.shuffle:
                self.rows.shuffle()
            return
        index = self.current_file + 1
        if index == len(self.files):
            index = 0
            if self.shuffle:
                self.file_order.shuffle()
        self._open(index)

    def read_state(self) -> tuple[int, bytes, str]:
        """(next row, its file, JSON of the file index and the shuffle random states)."""
        rng = {"file": self.current_file, "files": self.file_order.drawn_from, "rows": self.rows.drawn_from}
        return self.current_row, self.loaded.encode(), json.dumps(rng)

    def restore_read_state(self, position: int, key: bytes, rng_state: str, where: str = "") -> None:
        """Continue from a state given by ``read_state``."""
        where = where or self.where
        try:
            rng = json.loads(rng_state)
            self.file_order.redraw(rng["files"])
            index = int(rng["file"])
            path = self.files[self.file_order.order[index]]
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise DataError(f"{where}: cannot restore the read position: {exc}") from None
        if path.encode() != key:
            raise DataError(f"{where}: cannot restore the read position: file {index} of the shuffled list is "
                            f"{path}, the snapshot says {key.decode(errors='replace')} (was "
                            f"{self.layer_param.hdf5_data_param.source} changed?)")
        if path != self.loaded:
            self._load(path)
        if not 0 <= position < self.arrays[0].shape[0]:
            raise DataError(f"{where}: cannot restore the read position: row {position} of {path}, which "
                            f"has {self.arrays[0].shape[0]} rows")
        try:
            self.rows.redraw(rng["rows"])
        except (ValueError, TypeError, KeyError) as exc:
            raise DataError(f"{where}: cannot restore the random state: {exc}") from None
        self.current_file, self.current_row = index, int(position)

    def reshape(self, bottom, top):
        """Top shapes are fixed at set-up: (batch_size, *row shape)."""

    def forward_cpu(self, bottom, top):
        outs = [blob.mutable_cpu_data() for blob in top]
        for i in range(self.batch_size):
            row = self.rows.order[self.current_row]
            for out, arr in zip(outs, self.arrays):
                out[i] = arr[row]
            self._next()

    # The host batch is written into the tops; the device copy syncs when the next layer reads it.
    forward_gpu = forward_cpu
