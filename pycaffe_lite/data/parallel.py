"""The data layers' parallel path: batches that worker processes fill, put into the tops.

:class:`ParallelBatches` is what ``Data`` and ``ImageData`` subclass: their ``plan`` (run by the
loader's thread of :mod:`pycaffe_lite.data.workers`) picks the records and draws the transformer's
random choices in the single-thread path's order, their ``job`` reads and decodes in the workers.
:meth:`ParallelBatches.fill` copies a finished batch into the tops, or in GPU mode uploads its
uint8 items and draws and has ``transform.cu`` crop, subtract the mean, scale and mirror on the
device, pixel for pixel as :meth:`DataTransformer.apply` does on the host.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from ..schema import caffe_pb2
from . import workers as data_workers
from .transformer import DataTransformer

log = logging.getLogger("pycaffe_lite")

KERNELS = Path(__file__).with_name("transform.cu")


class TransformingJob:
    """What the Data and ImageData jobs share (their dataclasses declare the fields ``param`` (a
    serialized TransformationParameter), ``phase``, ``dtype``, ``where``, ``shape`` and ``raw``):
    the worker's transformer, made when the worker opens the job."""

    param: bytes
    phase: int
    dtype: str
    where: str

    def open(self) -> None:
        tp = caffe_pb2.TransformationParameter.FromString(self.param)
        self.transformer = DataTransformer(tp, self.phase, np.dtype(self.dtype), rng=np.random.default_rng(0),
                                           where=self.where)


class ParallelBatches:
    """Batches that worker processes fill (the data layers' parallel path): a subclass's ``plan``
    (run by the loader's thread, or for a ``Deferred`` batch when its forward asks for it) picks
    the records and draws the transformer's random choices in the single-thread path's order;
    its ``job`` reads, decodes and transforms in the workers (or, ``raw``, only decodes to uint8 for
    the device kernel). :meth:`fill` puts a batch into the tops."""

    def __init__(self, transformer: DataTransformer | None, batch_size: int, depth: int, dtype: np.dtype,
                 where: str, workers: int, shape: tuple[int, int, int], raw: bool) -> None:
        """``shape``: a record's ``(C, H, W)``; without a ``transformer`` the workers write items of
        that shape ready for the top (``raw`` must then be False)."""
        self.transformer: Any = transformer
        self.batch_size = batch_size
        self.dtype = dtype
        self.where = where
        self.workers = workers
        self.shape = shape
        self.out_shape = transformer._out_shape(shape) if transformer is not None else shape  # a top item's
        self.raw = raw
        self.waited = 0.0
        self.depth = max(2, depth)
        self.loader: data_workers.ParallelLoader | None = None
        self._registered: Any = None
        self.register_error = ""  # why the shared batches could not be page-locked, if they could not
        self._held: tuple[int, Any] | None = None
        self._device: dict[str, Any] = {}

    def job(self) -> data_workers.Job:
        raise NotImplementedError

    def plan(self, slot: int, now: bool) -> tuple[list, Any]:
        raise NotImplementedError

    def start(self) -> None:
        """Create the shared batches, fork the workers, start the loader (once)."""
        if self.loader is not None:
            return
        out_shape = self.shape if self.raw else self.out_shape
        item_dtype = np.dtype(np.uint8) if self.raw else self.dtype
        layout = data_workers.BatchLayout(self.batch_size, tuple(out_shape), item_dtype.str)
        self.loader = data_workers.ParallelLoader(self.workers, self.job(), layout, self.depth, self.plan, self.where)
        self.loader.start()

    def try_start(self, automatic: bool, instead: str) -> bool:
        """:meth:`start`; on any failure what started is stopped. Where the workers cannot be had
        (/dev/shm too small, no more processes: OSError, DataError) and the layer's worker count is
        ``automatic``, a warning says the layer reads ``instead`` and the result is False; a chosen
        count, or any other error, raises."""
        try:
            self.start()
        except BaseException as exc:
            self.stop()
            if automatic and isinstance(exc, OSError | DataError):
                log.warning("%s: no data workers (%s); reading %s", self.where, exc, instead)
                return False
            raise
        return True

    def _release_held(self) -> None:
        if self._held is not None and self.loader is not None:
            slot, event = self._held
            self._held = None
            if event is not None:
                event.synchronize()
            self.loader.release(slot)

    def fill(self, top, gpu: bool) -> tuple[int, bytes, str]:
        """The next batch into the tops: on the device by the kernel (``gpu`` and uint8 items), else
        on the host; where the next batch starts."""
        assert self.loader is not None
        start = time.perf_counter()
        slot, position, _ = self.loader.get()
        self.waited = time.perf_counter() - start
        batches = self.loader.batches
        data, labels, draws = batches.data[slot], batches.labels[slot], batches.draws[slot]
        top[0].reshape((self.batch_size, *self.out_shape))
        if len(top) > 1:
            top[1].reshape((self.batch_size,))
            top[1].mutable_cpu_data()[...] = labels
        if gpu and self.raw:
            self._release_held()
            self._held = (slot, self._transform_on_device(data, draws, top[0]))
            return position
        try:
            if self.raw:  # (a GPU-mode layer run on the CPU) the host transform, item by item
                out = top[0].mutable_cpu_data()
                for i in range(self.batch_size):
                    self.transformer.apply(data[i], int(draws[i, 0]), int(draws[i, 1]), bool(draws[i, 2]), out=out[i])
            else:
                top[0].mutable_cpu_data()[...] = data
        finally:
            self.loader.release(slot)
        return position

    def _transform_on_device(self, data: np.ndarray, draws: np.ndarray, top) -> Any:
        """Upload the uint8 batch and its draws; one kernel writes the transformed batch into ``top``.
        Returns the upload's event (None when the copy was synchronous)."""
        from pycaffe_lite.gpu import backend, driver

        dev = self._device
        if not dev:
            assert self.loader is not None
            try:  # page-lock the shared batches: uploads run at the bus's rate, asynchronously
                self._registered = driver.register_host(self.loader.batches.whole)
            except Exception as exc:  # (the driver may refuse: pageable copies then)
                log.info("%s: shared batches not page-locked (%s): pageable uploads", self.where, exc)
                self._registered = None
                self.register_error = f"{type(exc).__name__}: {exc}"
            dev["data"] = backend.alloc(data.nbytes)
            dev["draws"] = backend.alloc(draws.nbytes)
            t = self.transformer
            mean_kind, mean = 0, np.zeros(1, self.dtype)
            if t.mean is not None:
                full = t._mean_for(t.mean, self.shape)
                if t.param.HasField("mean_file"):
                    mean_kind, mean = 2, np.ascontiguousarray(full, self.dtype)
                else:
                    mean_kind, mean = 1, np.ascontiguousarray(full[:, 0, 0], self.dtype)
            dev["mean"] = backend.alloc(mean.nbytes)
            backend.memcpy_htod(int(dev["mean"]), mean)
            dev["mean_kind"] = mean_kind
            dev["kernel"] = backend.kernel(KERNELS, "data_transform_u8", self.dtype)
        event = backend.memcpy_htod(int(dev["data"]), data, pinned=self._registered is not None)
        backend.memcpy_htod(int(dev["draws"]), np.ascontiguousarray(draws))
        c, h, w = self.shape
        _, oh, ow = self.out_shape
        scale = float(self.transformer.param.scale)
        dev["kernel"](self.batch_size * c * oh * ow, int(dev["data"]), int(dev["draws"]), int(dev["mean"]),
                      dev["mean_kind"], int(scale != 1), scale, c, h, w, oh, ow, top.mutable_gpu_data())
        return event

    def stop(self) -> None:
        """Stop the workers, free the shared memory (the cursor stays open)."""
        if self._held is not None:
            try:
                self._release_held()
            except Exception:  # (the device context may be gone at exit)
                pass
        if self._registered is not None:
            try:
                self._registered()
            except Exception:  # (the device context may be gone at exit)
                pass
            self._registered = None
        self._device.clear()
        if self.loader is not None:
            self.loader.stop()
