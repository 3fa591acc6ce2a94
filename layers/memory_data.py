"""MemoryData: serves batches from arrays held in memory (BVLC's MemoryDataLayer).

``memory_data_param { batch_size channels height width }``; no bottoms; tops ``data``
(batch_size, channels, height, width) and ``label`` (batch_size,). ``reset(data, labels, n)``
(what ``net.set_input_arrays`` calls) points the layer at ``data`` (n, C, H, W) and ``labels``
(n values); each forward copies the next ``batch_size`` items and wraps around after ``n``.
The arrays are kept by reference, so later changes to them are seen, as in Caffe. As in Caffe,
``transform_param`` is not applied to arrays given through ``reset`` (a warning says so).
``read_state()`` / ``restore_read_state()`` give and set the next item (kept in solver snapshots:
give the arrays before resuming, as ``reset`` starts again from the first item).
"""

from __future__ import annotations

import warnings

import numpy as np

from pycaffe_lite.errors import DataError
from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("MemoryData")
class MemoryDataLayer(Layer):
    traits = Traits()  # a host-side reader: runs plainly before a replayed graph
    exact_num_bottom_blobs = 0
    exact_num_top_blobs = 2

    def layer_setup(self, bottom, top):
        p = self.layer_param.memory_data_param
        self.batch_size = int(p.batch_size)
        self.channels, self.height, self.width = int(p.channels), int(p.height), int(p.width)
        if min(self.batch_size, self.channels, self.height, self.width) <= 0:
            raise self.error(
                "memory_data_param needs positive batch_size, channels, height and width, got "
                f"{self.batch_size}, {self.channels}, {self.height}, {self.width}"
            )
        self._data: np.ndarray | None = None
        self._labels: np.ndarray | None = None
        self.n = 0
        self.pos = 0

    def reshape(self, bottom, top):
        top[0].reshape(self.batch_size, self.channels, self.height, self.width)
        top[1].reshape(self.batch_size)

    def reset(self, data: np.ndarray, labels: np.ndarray, n: int) -> None:
        """Serve ``data[:n]`` / ``labels[:n]`` from the start; ``n`` a multiple of batch_size."""
        if data is None or labels is None:
            raise self.error("reset needs both a data and a labels array")
        n = int(n)
        if n <= 0 or n % self.batch_size:
            raise self.error(f"reset: n ({n}) must be a positive multiple of batch_size ({self.batch_size})")
        size = self.channels * self.height * self.width
        if data.size < n * size or labels.size < n:
            raise self.error(
                f"reset: need {n} items of {self.channels}x{self.height}x{self.width} and {n} labels, "
                f"got data of shape {data.shape} and labels of shape {labels.shape}"
            )
        if self.layer_param.HasField("transform_param"):
            warnings.warn(
                f"MemoryData layer '{self.name}' does not apply transform_param to arrays given by "
                "reset / set_input_arrays",
                stacklevel=2,
            )
        self._data = data.reshape(-1)[: n * size].reshape(n, self.channels, self.height, self.width)
        self._labels = labels.reshape(-1)[:n]
        self.n = n
        self.pos = 0

    def read_state(self) -> tuple[int, bytes, str]:
        """(next item, no key, no random state)."""
        return self.pos, b"", ""

    def restore_read_state(self, position: int, key: bytes, rng_state: str, where: str = "") -> None:
        """Continue from the item given by ``read_state``."""
        if self._data is not None and not 0 <= position < self.n:
            where = where or self.where
            raise DataError(f"{where}: cannot restore the read position {position}: the arrays "
                            f"given by reset hold {self.n} items")
        self.pos = int(position)

    def set_batch_size(self, batch_size: int) -> None:
        """Change the batch size (the next forward reshapes the tops)."""
        if int(batch_size) <= 0:
            raise self.error(f"batch_size must be positive, got {batch_size}")
        if self._data is not None and self.n % int(batch_size):
            raise self.error(f"batch_size {batch_size} does not divide the {self.n} items given by reset")
        self.batch_size = int(batch_size)

    def forward_cpu(self, bottom, top):
        if self._data is None:
            raise self.error("has no data: call net.set_input_arrays(data, labels) (Reset) first")
        self.reshape(bottom, top)
        end = self.pos + self.batch_size
        top[0].mutable_cpu_data()[...] = self._data[self.pos : end]
        top[1].mutable_cpu_data()[...] = self._labels[self.pos : end]
        self.pos = end % self.n
