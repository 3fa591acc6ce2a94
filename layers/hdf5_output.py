"""HDF5Output: writes its two bottoms to an HDF5 file (BVLC's HDF5OutputLayer).

``hdf5_output_param { file_name }`` (relative to the current directory). Bottoms ``data`` and
``label`` with the same num; no tops; no backward. As in Caffe, each bottom is stored with its
legacy 4-D shape ``(num, channels, height, width)`` (missing trailing axes are 1; more than 4
axes is an error) in the layer's dtype, as the datasets ``"data"`` and ``"label"``. The file is
created (truncated) at set-up. Caffe can write only once into its open file; here every forward
appends its rows to what earlier forwards gave and rewrites the file, through a temporary file in
the same folder renamed over it, so the file always holds every row seen so far.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from pycaffe_lite.errors import DataError
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.optional import require

DATASET_NAMES = ("data", "label")


def legacy_shape(shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """``shape`` padded with trailing 1s to 4 axes (None if it has more than 4)."""
    if len(shape) > 4:
        return None
    return (*shape, *(1,) * (4 - len(shape))) if shape else (1, 1, 1, 1)


@register_layer("HDF5Output")
class HDF5OutputLayer(Layer):
    traits = Traits(outside_effects=True)  # writes a host file every forward
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 0

    def layer_setup(self, bottom, top):
        self.file_name = self.layer_param.hdf5_output_param.file_name
        if not self.file_name:
            raise DataError(f"{self.where}: hdf5_output_param.file_name is empty (expected the output .h5 path)")
        self._h5py = require("h5py", feature=self.where)
        self._rows: list[list[np.ndarray]] = [[], []]
        self._write()  # Caffe creates (truncates) the file at set-up

    def reshape(self, bottom, top):
        """No tops; shapes are checked in forward."""

    def _write(self) -> None:
        folder = os.path.dirname(os.path.abspath(self.file_name))
        if not os.path.isdir(folder):
            raise DataError(f"{self.where}: cannot create HDF5 file {self.file_name}: folder {folder} does not exist")
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(self.file_name)}.", suffix=".tmp", dir=folder)
        os.close(fd)
        try:
            with self._h5py.File(tmp, "w") as f:
                for name, rows in zip(DATASET_NAMES, self._rows):
                    if rows:
                        f.create_dataset(name, data=np.concatenate(rows, axis=0))
            os.replace(tmp, self.file_name)
        except Exception as exc:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise DataError(f"{self.where}: cannot write HDF5 file {self.file_name}: {exc}") from None

    def forward_cpu(self, bottom, top):
        if bottom[0].shape[:1] != bottom[1].shape[:1] or not bottom[0].shape:
            raise self.error(f"bottoms data {bottom[0].shape} and label {bottom[1].shape} need the same num "
                             "(first axis)")
        for j, (name, blob) in enumerate(zip(DATASET_NAMES, bottom)):
            shape = legacy_shape(blob.shape)
            if shape is None:
                raise self.error(f"bottom '{name}' has shape {blob.shape}; at most 4 axes can be written")
            if self._rows[j] and self._rows[j][0].shape[1:] != shape[1:]:
                raise self.error(f"bottom '{name}' has shape {blob.shape}; earlier forwards wrote rows of shape "
                                 f"{self._rows[j][0].shape[1:]} to {self.file_name}")
            self._rows[j].append(np.array(blob.cpu_data(), dtype=self.dtype).reshape(shape))
        self._write()

    # Reads the host copies of the bottoms (synced from the device).
    forward_gpu = forward_cpu

    def backward_cpu(self, top, propagate_down, bottom):
        """No gradient (Caffe's HDF5OutputLayer does nothing in backward)."""

    backward_gpu = backward_cpu
