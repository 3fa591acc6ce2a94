"""A whole dataset kept in device memory and served as batches by a capturable gather.

For data sets that fit comfortably on the device (MNIST's 60,000 images are 188 MB as float32),
the Data layer can load every transformed record once and then, each iteration, only gather the
next ``batch`` records on the device: no host work, no host-to-device copy, and the read position
lives in device memory, so the data layer joins the training iteration's CUDA graph. Records are
served in order from ``start``, wrapping after the last, exactly as the host reader serves them.
"""

from __future__ import annotations

import numpy as np

from ..errors import DataError
from ..gpu import backend


class DeviceBatches:
    """``data`` (N, ...) and optional ``labels`` (N,) on the device; :meth:`next_batch` fills tops."""

    def __init__(self, data: np.ndarray, labels: np.ndarray | None, batch: int, start: int = 0,
                 stride: int | None = None, where: str = "") -> None:
        """``stride``: records the read position advances per batch (default ``batch``; more when
        several ranks share the data, each reading every N-th batch)."""
        if data.ndim < 2 or len(data) == 0:
            raise DataError(f"{where}: a device cache needs at least one record, got shape {data.shape}")
        if labels is not None and len(labels) != len(data):
            raise DataError(f"{where}: {len(data)} records but {len(labels)} labels")
        self.dtype = np.dtype(data.dtype)
        self.total = len(data)
        self.per = int(np.prod(data.shape[1:]))
        self.batch = int(batch)
        self.stride = int(stride if stride is not None else batch)
        self.record_shape = tuple(data.shape[1:])
        self._data = backend.alloc(data.nbytes)
        backend.memcpy_htod(int(self._data), np.ascontiguousarray(data))
        self._labels = None
        if labels is not None:
            lab = np.ascontiguousarray(labels, dtype=self.dtype)
            self._labels = backend.alloc(max(lab.nbytes, 1))
            backend.memcpy_htod(int(self._labels), lab)
        self._cursor = backend.alloc(8)
        self.seek(start)

    @property
    def nbytes(self) -> int:
        return self.total * self.per * self.dtype.itemsize

    def seek(self, position: int) -> None:
        """Serve record ``position % total`` next."""
        backend.memcpy_htod(int(self._cursor), np.array([int(position) % self.total], np.int64))

    def position(self) -> int:
        """The index of the record served next (reads the device: a host sync)."""
        out = np.empty(1, np.int64)
        backend.memcpy_dtoh(out, int(self._cursor))
        return int(out[0])

    def next_batch(self, data_ptr: int, label_ptr: int | None) -> None:
        """Queue: the next ``batch`` records into ``data_ptr`` (and labels), then advance ``stride``."""
        dt = self.dtype
        backend.elementwise(
            "cache_gather", "const int per, const long long total, const Dtype* src, const long long* cursor, "
            "Dtype* out",
            "const long long rec = (cursor[0] + i / per) % total; out[i] = src[rec * per + i % per]", dt)(
            self.batch * self.per, self.per, self.total, int(self._data), int(self._cursor), data_ptr)
        if label_ptr is not None and self._labels is not None:
            backend.elementwise(
                "cache_gather_labels", "const long long total, const Dtype* src, const long long* cursor, Dtype* out",
                "out[i] = src[(cursor[0] + i) % total]", dt)(
                self.batch, self.total, int(self._labels), int(self._cursor), label_ptr)
        backend.elementwise("cache_advance", "const long long step, const long long total, long long* cursor",
                            "cursor[0] = (cursor[0] + step) % total", dt)(1, self.stride, self.total, int(self._cursor))
