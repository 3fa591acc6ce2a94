"""Data: batches of Datums read from an LMDB or a LevelDB (Caffe's DataLayer with its prefetch thread).

``data_param { source batch_size backend rand_skip prefetch workers gpu_decode }`` (``backend``: LEVELDB,
BVLC's default, or LMDB) and ``transform_param``.
Tops: ``data`` ``(batch_size, C, h, w)`` and optionally ``label`` ``(batch_size,)``. Records are
read in key order and the read wraps to the first record after the last. A daemon thread decodes
and transforms the next ``prefetch`` batches (default 4) into a queue while the net computes;
``forward`` copies the next ready batch into the tops (on the GPU path the host copy is synced to
the device when the next layer reads it).

With worker processes (``data_param.workers``, pycaffe-lite's field 1001; ``$PYCAFFE_LITE_DATA_WORKERS``
overrides it; automatic by default: the usable cores less one for encoded records or batches of 1 MiB
of pixels or more, none for small data such as MNIST), a loader thread only walks the cursor and
draws the crop/mirror choices (so batches, labels and the random stream equal the single-thread
path's), and the workers (:mod:`pycaffe_lite.data.workers`) read, decode and transform the records
into shared memory. Every record must then have the shape of the first one (automatic workers go
back to the prefetch thread at the first that does not). In GPU mode, uint8 records (raw or
encoded) stay uint8 in shared memory, are uploaded as bytes and transformed on the device by one
kernel (``pycaffe_lite/data/transform.cu``) into the top, pixel for pixel as the host does; the
uploads run on a copy stream into two device buffers in turn, the next ready batch queued while the
net computes on this one. JPEG records in GPU mode (the first record says; ``data_param.gpu_decode``,
field 1002: ``true`` or ``$PYCAFFE_LITE_GPU_DECODE=1`` always, for any encoded records; ``false`` or
``=0`` never; the environment wins; unset in both, where libnvjpeg loads, once the forwards wait more
than 10 % of the time for the workers' host decode (``ParallelBatches._watch_host_decode``): so a training run whose workers keep up leaves
the device to the net, 98.5 % of the synthetic-input rate against 89.5 % with nvJPEG in ResNet-50
fp16 training on an H200, while a faster consumer gets nvJPEG's rate) are left encoded by the workers and
decoded on the device by nvJPEG (:mod:`pycaffe_lite.data.nvjpeg`: what it would not decode as the
host does is decoded by the workers; pixels within that module's stated tolerance of the host's),
batch by batch on the copy stream by a staging thread of the layer's own, ahead of the forwards.
A worker's or the staging thread's failure (a corrupt record, a crash) is raised by ``forward``
naming the layer and the record.

``read_state()`` / ``restore_read_state()`` give and set the next record the net will see (kept in
solver snapshots for an exact resume). ``data_stats()`` counts batches, images and the time waited
for them. ``close()`` (also run when the layer is collected) stops the thread or the workers and
closes the database.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.config import config
from pycaffe_lite.data import nvjpeg
from pycaffe_lite.data import workers as data_workers
from pycaffe_lite.data.db import Cursor, close_inherited, open_cursor
from pycaffe_lite.data.device_cache import DeviceBatches
from pycaffe_lite.data.parallel import (
    ParallelBatches,
    StopsReaders,
    TransformingJob,
    gpu_decode_chosen,
    leave_encoded,
)
from pycaffe_lite.data.transformer import DataTransformer
from pycaffe_lite.errors import CaffeError, DataError
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

log = logging.getLogger("pycaffe_lite")


_LEGACY_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


def transform_param_of(lp: caffe_pb2.LayerParameter) -> caffe_pb2.TransformationParameter:
    """``transform_param``, completed by the legacy transformation fields of ``data_param``."""
    tp = caffe_pb2.TransformationParameter()
    tp.CopyFrom(lp.transform_param)
    for field in _LEGACY_TRANSFORM_FIELDS:
        if lp.data_param.HasField(field) and not tp.HasField(field):
            setattr(tp, field, getattr(lp.data_param, field))
    return tp


class _Prefetcher:
    """Background producer of ``(data, label)`` batches. Holds no reference to the layer, so the
    layer can be collected (which closes this)."""

    def __init__(self, cursor, transformer: DataTransformer, batch_size: int, depth: int,
                 dtype: np.dtype, where: str) -> None:
        self.cursor = cursor
        self.transformer = transformer
        self.batch_size = batch_size
        self.dtype = dtype
        self.where = where
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"prefetch {where}", daemon=True)
        self.skip_after = 0  # records skipped after each batch (multi-GPU: the other ranks' batches)
        self.waited = 0.0  # seconds the last fill waited for its batch

    def start(self) -> None:
        self.thread.start()

    def read_datum(self) -> caffe_pb2.Datum:
        datum = caffe_pb2.Datum()
        try:
            datum.ParseFromString(self.cursor.value())
        except Exception as exc:
            raise DataError(
                f"{self.where}: {self.cursor.path}: record {self.cursor.key()!r} is not a Datum ({exc})"
            ) from None
        return datum

    def load_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The next ``batch_size`` records; shape taken from the batch's first record."""
        first = self.transformer.decode(self.read_datum())
        shape = self.transformer.infer_shape(first)
        data = np.empty((self.batch_size, *shape), dtype=self.dtype)
        labels = np.empty(self.batch_size, dtype=self.dtype)
        for i in range(self.batch_size):
            datum = self.read_datum()
            values = first if i == 0 else self.transformer.decode(datum)
            if values.shape != first.shape:
                raise DataError(
                    f"{self.where}: {self.cursor.path}: record {self.cursor.key()!r} has shape {values.shape}, "
                    f"the first record of its batch has {first.shape} (items of one batch must match)"
                )
            self.transformer.transform(values, out=data[i])
            labels[i] = datum.label
            self.cursor.next()
        for _ in range(self.skip_after):
            self.cursor.next()
        return data, labels

    def position(self) -> tuple[int, bytes, str]:
        """Where the next batch starts: (record index, its key, transformer random state)."""
        return self.cursor.index, bytes(self.cursor.key()), json.dumps(self.transformer.rng.bit_generator.state)

    def _run(self) -> None:
        try:
            while not self.stop_event.is_set():
                batch = (*self.load_batch(), self.position())  # with where the next one starts
                while not self.stop_event.is_set():
                    try:
                        self.queue.put(batch, timeout=0.05)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # handed to the consumer
            self.error = exc

    def get(self) -> tuple[np.ndarray, np.ndarray, tuple[int, bytes, str]]:
        if self.stop_event.is_set():  # closed: batches still queued are not handed out
            raise DataError(f"{self.where}: the prefetch thread is not running (layer closed?)")
        while True:
            try:
                return self.queue.get(timeout=0.05)
            except queue.Empty:
                if self.error is not None:
                    err = self.error
                    if isinstance(err, CaffeError):
                        raise type(err)(str(err)) from err
                    raise DataError(f"{self.where}: prefetch thread failed: {err!r}") from err
                if not self.thread.is_alive():
                    raise DataError(f"{self.where}: the prefetch thread is not running (layer closed?)") from None

    def fill(self, top, gpu: bool) -> tuple[int, bytes, str]:
        """Copy the next batch into the tops (the device copy syncs when read); where the next starts."""
        start = time.perf_counter()
        data, labels, position = self.get()
        self.waited = time.perf_counter() - start
        top[0].reshape(data.shape)
        top[0].mutable_cpu_data()[...] = data
        if len(top) > 1:
            top[1].reshape(labels.shape)
            top[1].mutable_cpu_data()[...] = labels
        return position

    def stop(self) -> None:
        """Stop the thread and drop the batches it prepared (the cursor stays open)."""
        self.stop_event.set()
        if self.thread is threading.current_thread():  # (a garbage collection in the thread finalized its layer)
            return
        while self.thread.is_alive():
            try:  # unblock a producer waiting on a full queue
                while True:
                    self.queue.get_nowait()
            except queue.Empty:
                pass
            self.thread.join(timeout=0.05)

    def close(self) -> None:
        self.stop()
        self.cursor.close()


@dataclass
class _DatumJob(TransformingJob):
    """A worker's part for the Data layer: read a record (LMDB: by key; LevelDB: the parent sends
    the value), parse the Datum, decode, check the shape, and write the item as uint8 (``raw``) or
    transformed with the parent's draws; the label too."""

    source: str
    backend: str
    param: bytes  # TransformationParameter
    phase: int
    dtype: str
    where: str
    shape: tuple[int, int, int]
    raw: bool
    gpu_decode: bool = False  # JPEG records nvJPEG decodes as the host would are left encoded in the slot

    def open(self) -> None:
        super().open()
        self.txn = None
        if self.backend == "lmdb":
            import lmdb

            close_inherited()
            path = Path(self.source)
            self.env = lmdb.open(str(path), readonly=True, lock=False, readahead=False, subdir=path.is_dir(),
                                 max_readers=512)
            self.txn = self.env.begin(buffers=True)

    def load(self, ref: Any, batches: data_workers.SharedBatches, slot: int, i: int) -> tuple[int, bytes] | None:
        if self.txn is not None:
            key, value = ref, self.txn.get(ref)
            if value is None:
                raise DataError(f"{self.where}: {self.source}: record {key!r} disappeared (was the database "
                                "rewritten?)")
        else:
            key, value = ref
        datum = caffe_pb2.Datum()
        try:
            datum.ParseFromString(value)
        except Exception as exc:
            raise DataError(f"{self.where}: {self.source}: record {bytes(key)!r} is not a Datum ({exc})") from None
        if self.gpu_decode and datum.encoded:
            p = self.transformer.param
            length = leave_encoded(batches, slot, i, datum.data, datum.label, self.shape, p.force_color, p.force_gray)
            if length is not None:
                return length, bytes(key)  # decoded on the device
        try:
            values = self.transformer.decode(datum)
        except DataError as exc:
            raise DataError(f"{exc} ({self.source}: record {bytes(key)!r})") from None
        if values.shape != self.shape:
            raise data_workers.ItemShapeError(
                f"{self.where}: {self.source}: record {bytes(key)!r} has shape {values.shape}, the first record "
                f"read has {self.shape} (with data workers every record must match; workers: 0 reads batches "
                "of different shapes)")
        data_workers.store_item(batches, slot, i, values, datum.label, self.raw, self.transformer)
        return None


class _ParallelPrefetcher(ParallelBatches):
    """The Data layer's parallel path: the loader's thread walks the cursor (and skips the other
    ranks' batches); workers read records by key (LMDB) or get their bytes (LevelDB)."""

    def __init__(self, cursor, transformer: DataTransformer, batch_size: int, depth: int, dtype: np.dtype,
                 where: str, workers: int, shape: tuple[int, int, int], raw: bool) -> None:
        super().__init__(transformer, batch_size, depth, dtype, where, workers, shape, raw)
        self.cursor = cursor
        self.skip_after = 0
        self.lmdb = isinstance(cursor, Cursor)

    def position(self) -> tuple[int, bytes, str]:
        return self.cursor.index, bytes(self.cursor.key()), json.dumps(self.transformer.rng.bit_generator.state)

    def job(self) -> data_workers.Job:
        return _DatumJob(str(self.cursor.path), "lmdb" if self.lmdb else "leveldb",
                         self.transformer.param.SerializeToString(), self.transformer.phase, self.dtype.str,
                         self.where, self.shape, self.raw, self.gpu_decode)

    def plan(self, slot: int, now: bool) -> tuple[list, tuple[int, bytes, str]]:
        assert self.loader is not None
        draws = self.loader.batches.draws[slot]
        refs: list = []
        for i in range(self.batch_size):
            key = bytes(self.cursor.key())
            refs.append(key if self.lmdb else (key, bytes(self.cursor.value())))
            draws[i] = self.transformer.draw(self.shape)
            self.cursor.next()
        for _ in range(self.skip_after):
            self.cursor.next()
        return refs, self.position()

    def close(self) -> None:
        self.stop()
        self.cursor.close()


@register_layer("Data")
class DataLayer(StopsReaders, Layer):
    traits = Traits()  # a host-side reader: runs plainly before a replayed graph
    exact_num_bottom_blobs = 0
    min_top_blobs = 1
    max_top_blobs = 2

    def layer_setup(self, bottom, top):
        dp = self.layer_param.data_param
        where = self.where
        self._auto_workers = False
        if not dp.source:
            raise DataError(f"{where}: data_param.source is empty (expected the path of an LMDB or a LevelDB)")
        if dp.batch_size <= 0:
            raise self.error("data_param.batch_size must be positive")
        self.batch_size = int(dp.batch_size)
        self.output_labels = len(top) == 2
        self.transformer = DataTransformer(transform_param_of(self.layer_param), self.phase, self.dtype, where=where)
        cursor = open_cursor(dp.source, dp.backend, where=where)
        try:
            if dp.rand_skip:
                skip = int(common.rng().integers(dp.rand_skip))
                for _ in range(skip % len(cursor)):
                    cursor.next()
            prefetcher = _Prefetcher(cursor, self.transformer, self.batch_size, dp.prefetch,
                                     self.dtype, where)
            # multi-GPU: rank r of N trains on batches r, r+N, r+2N, ... (tests read everything)
            ranks, rank = (common.solver_count(), common.solver_rank()) if self.phase == common.TRAIN else (1, 0)
            for _ in range(rank * self.batch_size):
                cursor.next()
            prefetcher.skip_after = (ranks - 1) * self.batch_size
            first = prefetcher.read_datum()
            shape = self.transformer.infer_shape(first)
            if not dp.cache_on_device:
                prefetcher = self._parallel_or(prefetcher, first)
        except BaseException:
            cursor.close()
            raise
        top[0].reshape((self.batch_size, *shape))
        if self.output_labels:
            top[1].reshape((self.batch_size,))
        self._where = where
        self._stats: list = [0, 0, 0.0]
        self._next = prefetcher.position()  # where the batch after the last one handed out starts
        self._cache: DeviceBatches | None = None
        if dp.cache_on_device and common.mode() is common.Mode.GPU:
            self._cache_dataset(prefetcher)
        else:
            self._install(prefetcher)

    def _parallel_or(self, prefetcher: _Prefetcher, first: caffe_pb2.Datum) -> _Prefetcher | _ParallelPrefetcher:
        """A :class:`_ParallelPrefetcher` in place of ``prefetcher`` when workers are chosen
        (``data_param.workers``, ``$PYCAFFE_LITE_DATA_WORKERS``, automatic for heavy data)."""
        values = self.transformer.decode(first) if first.encoded else None
        shape = values.shape if values is not None else (first.channels, first.height, first.width)
        uint8 = bool(first.encoded or first.data)
        batch_bytes = self.batch_size * int(np.prod(shape)) * (1 if uint8 else 4)
        heavy = bool(first.encoded) or batch_bytes >= data_workers.HEAVY_BATCH_BYTES
        ranks = common.solver_count() if self.phase == common.TRAIN else 1
        workers = data_workers.worker_count(self.layer_param.data_param.workers, heavy, ranks)
        self._auto_workers = data_workers.automatic(self.layer_param.data_param.workers)
        if workers <= 0:
            return prefetcher
        raw = uint8 and common.mode() is common.Mode.GPU
        parallel = _ParallelPrefetcher(prefetcher.cursor, self.transformer, self.batch_size,
                                       self.layer_param.data_param.prefetch, self.dtype, self.where, workers,
                                       tuple(int(d) for d in shape), raw)  # type: ignore[arg-type]
        parallel.skip_after = prefetcher.skip_after
        decoder = ""
        if first.encoded and raw:
            usable, decoder = self._nvjpeg_usable(first)
            parallel.adaptive = usable and not self._nvjpeg_asked()
            parallel.gpu_decode = usable and not parallel.adaptive
            if parallel.adaptive:
                decoder = "; the workers decode JPEG records while they keep up with the forwards, nvJPEG once they do not"
        if not parallel.try_start(self._auto_workers, "with the prefetch thread"):
            return prefetcher
        log.info("%s: %d data worker processes (%s%s)", self.where, workers,
                 "uint8 batches, transformed on the device" if raw else "transformed in the workers", decoder)
        return parallel

    def _nvjpeg_asked(self) -> bool:
        """Whether ``data_param.gpu_decode`` is written in the file or ``$PYCAFFE_LITE_GPU_DECODE``
        is set: then it decides alone; unset in both, nvJPEG takes over only when the workers'
        host decode cannot keep up (``ParallelBatches.adaptive``)."""
        return self.layer_param.data_param.HasField("gpu_decode") or config.gpu_decode is not None

    def _nvjpeg_usable(self, first: caffe_pb2.Datum) -> tuple[bool, str]:
        """Whether nvJPEG decodes this layer's encoded records (GPU mode, workers), and what the
        workers' log line says of the host decoder (nothing for nvJPEG, whose own line says it
        runs). Yes unless ``data_param.gpu_decode: false`` is written in the file or
        ``$PYCAFFE_LITE_GPU_DECODE=0``, the records are not JPEG (field unset: the first record
        says), or libnvjpeg is not found (a warning where ``gpu_decode: true`` asked for it; the
        host decodes)."""
        dp = self.layer_param.data_param
        written = dp.HasField("gpu_decode")
        if not gpu_decode_chosen(dp.gpu_decode if written else None):
            return False, "; the workers decode the records (gpu_decode off)"
        asked = self._nvjpeg_asked()
        if not asked and nvjpeg.jpeg_header(first.data) is None:
            return False, "; the workers decode the records (not JPEG)"
        try:
            nvjpeg.load_library()
        except nvjpeg.NvJpegError as exc:
            if asked:
                log.warning("%s: %s; JPEG records are decoded on the host", self.where, exc)
            return False, "; the workers decode the records (libnvjpeg not found)"
        return True, ""  # (the decoder's own line names it and its backend at the first device forward)

    def _cache_dataset(self, prefetcher: _Prefetcher) -> None:
        """Load every record (transformed) into device memory; batches are then gathered there."""
        p = self.transformer.param
        if p.mirror or (p.crop_size and self.phase == common.TRAIN):
            prefetcher.cursor.close()
            raise self.error("data_param.cache_on_device needs a deterministic transform (no mirror, no "
                             "TRAIN-phase random crop): the cache holds each record transformed once")
        cursor, start = prefetcher.cursor, prefetcher.position()
        count = len(cursor)
        shape = self.transformer.infer_shape(prefetcher.read_datum())
        nbytes = count * int(np.prod(shape)) * self.dtype.itemsize
        data = np.empty((count, *shape), self.dtype)
        labels = np.empty(count, self.dtype)
        self._keys: list[bytes] = []
        cursor.seek_to_first()
        for i in range(count):
            datum = prefetcher.read_datum()
            self.transformer.transform(self.transformer.decode(datum), out=data[i])
            labels[i] = datum.label
            self._keys.append(bytes(cursor.key()))
            cursor.next()
        cursor.close()
        self._cache = DeviceBatches(data, labels if self.output_labels else None, self.batch_size, start[0],
                                    stride=self.batch_size + prefetcher.skip_after, where=self._where)
        self._host_copy = (data, labels)
        self.traits = self.traits.but(graph_safe=True)  # the gather reads its position from device memory: capturable
        log.info("%s: %d records (%.1f MB) cached on the device", self._where, count, nbytes / 1e6)

    def _install(self, prefetcher: _Prefetcher | _ParallelPrefetcher) -> None:
        self._prefetcher = prefetcher
        self.stop_with_layer(prefetcher.close)
        prefetcher.start()

    def read_state(self) -> tuple[int, bytes, str]:
        """(index, key, transformer random state) of the next record the net will see (saved in
        snapshots so a resumed run reads on from there)."""
        if self._cache is not None:
            index = self._cache.position()
            return index, self._keys[index], ""
        return self._next

    def restore_read_state(self, position: int, key: bytes, rng_state: str, where: str = "") -> None:
        """Continue from a position given by ``read_state`` (batches prefetched so far are dropped).
        Snapshots hold rank 0's position: with several training ranks, rank r starts r batches on."""
        shift = common.solver_rank() * self.batch_size if self.phase == common.TRAIN else 0
        if self._cache is not None:
            if not 0 <= int(position) < len(self._keys) or (key and bytes(key) != self._keys[int(position)]):
                raise DataError(f"{where or self._where}: cannot restore the read position {position}: "
                                "the database does not match the snapshot")
            self._cache.seek(int(position) + shift)
            return
        self._restart(position, key, rng_state, where, shift)

    def _restart(self, position: int, key: bytes, rng_state: str, where: str, shift: int,
                 thread_only: bool = False) -> None:
        """New readers from ``position`` (+ ``shift`` records) with the transformer's random state
        ``rng_state``; workers again if there were (unless ``thread_only``)."""
        old = self._prefetcher
        self.detach_readers()
        old.stop()
        try:
            if shift:  # check the saved record, then move on to this rank's first batch
                old.cursor.seek(position, key)
                position, key = (int(position) + shift) % len(old.cursor), b""
            old.cursor.seek(position, key)
            if rng_state:
                self.transformer.rng.bit_generator.state = json.loads(rng_state)
        except (DataError, ValueError, TypeError, KeyError) as exc:
            old.cursor.close()
            raise DataError(f"{where or self._where}: cannot restore the read position: {exc}") from None
        self._next = (int(position), bytes(key), rng_state)
        fresh: _Prefetcher | _ParallelPrefetcher
        if isinstance(old, _ParallelPrefetcher) and not thread_only:
            fresh = _ParallelPrefetcher(old.cursor, self.transformer, self.batch_size, old.depth, self.dtype,
                                        self._where, old.workers, old.shape, old.raw)
            fresh.gpu_decode = old.gpu_decode or old.handing_over  # (nvJPEG, once it took over, goes on)
            fresh.adaptive = old.adaptive
        else:
            fresh = _Prefetcher(old.cursor, self.transformer, self.batch_size, self.layer_param.data_param.prefetch,
                                self.dtype, self._where)
        fresh.skip_after = old.skip_after  # multi-GPU: keep skipping the other ranks' batches
        self._install(fresh)

    def reshape(self, bottom, top):
        """Tops take the shape of each batch in forward."""

    def forward_cpu(self, bottom, top):
        if self._cache is not None:  # cached for the GPU, run on the CPU: serve the host copy
            data, labels = self._host_copy
            start = self._cache.position()
            idx = (start + np.arange(self.batch_size)) % len(data)
            self._cache.seek(start + self._cache.stride)
            top[0].mutable_cpu_data()[...] = data[idx]
            if self.output_labels:
                top[1].mutable_cpu_data()[...] = labels[idx]
            return
        self._fill(top, gpu=False)

    def _fill(self, top, gpu: bool) -> None:
        try:
            self._next = self._prefetcher.fill(top, gpu)
        except data_workers.ItemShapeError as exc:
            if not self._auto_workers:
                raise
            log.warning("%s; the records' shapes differ, so this layer goes back to the prefetch thread "
                        "(set data_param.workers: 0 to start there)", exc)
            position, key, rng_state = self._next
            self._restart(position, key, rng_state, where="", shift=0, thread_only=True)
            self._next = self._prefetcher.fill(top, gpu)
        self._stats[0] += 1
        self._stats[1] += self.batch_size
        self._stats[2] += self._prefetcher.waited

    def data_stats(self) -> tuple[int, int, float]:
        """(batches, images, seconds waited for them) served by forward so far: how far the
        readers ran behind the net (``pycaffe-lite time`` reports them)."""
        return self._stats[0], self._stats[1], self._stats[2]

    def forward_gpu(self, bottom, top):
        if self._cache is None:  # the host batch is copied (the device copy syncs when read), or
            self._fill(top, gpu=True)  # uint8 items transformed on the device
            return
        self._cache.next_batch(top[0].mutable_gpu_data(), top[1].mutable_gpu_data() if self.output_labels else None)


    def __del__(self) -> None:
        self.close()
