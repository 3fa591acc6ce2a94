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
import queue
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import config
from ..errors import CaffeError, DataError
from ..schema import caffe_pb2
from . import nvjpeg
from . import workers as data_workers
from .transformer import DataTransformer, decode_image

log = logging.getLogger("pycaffe_lite")

KERNELS = Path(__file__).with_name("transform.cu")


@dataclass
class _Staged:
    """A batch queued on the copy stream: its slot, where the batch after it starts, the workers'
    answers, the device buffer (0 or 1) it goes to, and the event recorded after it."""

    slot: int
    position: Any
    payloads: list | None
    buffer: int
    ready: Any


def _clear_frames(exc: BaseException) -> None:
    """Drop the locals of the finished frames in the tracebacks of ``exc`` and its causes and contexts."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        err = todo.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        traceback.clear_frames(err.__traceback__)
        todo += [err.__cause__, err.__context__]


class _Stager:
    """The thread that stages a ``gpu_decode`` layer's batches (:meth:`ParallelBatches.fill` starts
    it at the first device forward): it takes each batch from the loader as the workers finish it
    and queues its nvJPEG decode (or the host's, where nvJPEG fails), its other items' and its
    draws' uploads on the copy stream into the next of the two device buffers, once the forward has
    queued the kernel that last read that buffer (:meth:`consumed`); the forward only takes the
    staged batch (:meth:`take`) and has the compute stream wait on its event. The thread keeps the
    device's context current while it runs; it never touches the compute stream and synchronizes
    nothing but the copy stream and events, so a CUDA graph may be captured on the main thread
    meanwhile. Its error is raised by :meth:`take` when the batch it failed on is due, and by every
    later call."""

    def __init__(self, owner: ParallelBatches, buffers: int = 2) -> None:
        self.owner = owner
        self.where = owner.where
        self.ready: queue.Queue[_Staged | BaseException] = queue.Queue()
        self.free = buffers  # device buffers the thread may stage into
        self.changed = threading.Condition()
        self.stopping = threading.Event()
        self.error: BaseException | None = None  # the thread's failure, raised by take from then on
        self.orphan: int | None = None  # the slot of a batch whose staging failed (stop releases it)
        self.deferred_stop = False  # stop was asked from this thread itself: it finishes on its way out
        self.thread = threading.Thread(target=self._run, name=f"nvJPEG stager {owner.where}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _acquire(self) -> bool:
        """Wait for a free device buffer and take it; False when stopping."""
        with self.changed:
            while self.free <= 0 and not self.stopping.is_set():
                self.changed.wait(0.1)
            if self.stopping.is_set():
                return False
            self.free -= 1
            return True

    def consumed(self) -> None:
        """The forward has queued the last read of the oldest staged buffer: it may be staged into again."""
        with self.changed:
            self.free += 1
            self.changed.notify_all()

    def _run(self) -> None:
        from pycaffe_lite.gpu import backend

        try:
            with backend.current_in_thread():  # (the device objects the thread drops go while it is current)
                try:
                    self._loop()
                except BaseException as exc:
                    self._failed(exc)
                finally:
                    if self.deferred_stop:  # (the layer was collected by a garbage collection in this thread)
                        self.owner._finish_stop()
        except BaseException as exc:  # (no context, or the deferred stop failed)
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        """Hand ``exc`` to the forward (ignored when stopping)."""
        if not self.stopping.is_set():
            log.debug("%s: the nvJPEG staging thread failed", self.where, exc_info=exc)
        _clear_frames(exc)  # (their locals hold views of the shared batches, which the stop unmaps)
        self.ready.put(exc)

    def _loop(self) -> None:
        owner = self.owner
        while self._acquire():
            assert owner.loader is not None
            slot, position, payloads = owner.loader.get()
            self.orphan = slot
            self.ready.put(owner._stage(slot, position, payloads))
            self.orphan = None

    def take(self) -> tuple[_Staged, float, bool]:
        """The next staged batch, the seconds waited for it, and whether it was staged before it
        was asked for; the thread's error (naming the layer) when that is what comes next."""
        if self.error is not None:
            raise self._fresh(self.error)
        start = time.perf_counter()
        try:
            item = self.ready.get_nowait()
            ahead = True
        except queue.Empty:
            ahead = False
            while True:
                try:
                    item = self.ready.get(timeout=0.05)
                    break
                except queue.Empty:
                    if not self.thread.is_alive() and self.ready.empty():
                        raise DataError(f"{self.where}: the nvJPEG staging thread is not running "
                                        "(layer closed?)") from None
        if isinstance(item, BaseException):
            self.error = item
            raise self._fresh(item)
        return item, time.perf_counter() - start, ahead

    def _fresh(self, err: BaseException) -> BaseException:
        """A new exception for ``err`` (of its type for the framework's errors, which name the layer
        and the record; else a DataError naming the layer)."""
        if isinstance(err, CaffeError):
            return data_workers.again(err)
        fresh = DataError(f"{self.where}: the nvJPEG staging thread failed: {err!r}")
        fresh.__cause__ = err
        return fresh

    def stop(self) -> bool:
        """Stop the thread and wait for it; False when asked from the thread itself (it then
        finishes the owner's stop on its way out)."""
        self.stopping.set()
        if self.owner.loader is not None:  # (a thread waiting for the loader's next batch returns)
            self.owner.loader.stop_event.set()
        with self.changed:
            self.changed.notify_all()
        if self.thread is threading.current_thread():
            self.deferred_stop = True
            return False
        while self.thread.is_alive():
            self.thread.join(timeout=0.05)
        return True

    def staged(self) -> list[_Staged]:
        """The batches staged and not taken (after :meth:`stop`)."""
        out: list[_Staged] = []
        while True:
            try:
                item = self.ready.get_nowait()
            except queue.Empty:
                return out
            if isinstance(item, _Staged):
                out.append(item)


class StopsReaders:
    """Mixin of the data layers whose readers (a prefetch thread, worker processes) run beside
    them: :meth:`stop_with_layer` ties the readers' ``stop`` to the layer's collection, and
    :meth:`close` runs it now."""

    _finalizer: weakref.finalize | None = None

    def stop_with_layer(self, stop: Callable[[], object]) -> None:
        """Run ``stop`` when the layer is collected or closed (once)."""
        self._finalizer = weakref.finalize(self, stop)

    def detach_readers(self) -> None:
        """Forget the readers' ``stop`` (the caller stops or replaces them itself)."""
        if self._finalizer is not None:
            self._finalizer.detach()

    def close(self) -> None:
        """Stop the layer's readers (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()


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


WATCH_SKIP = 16  # adaptive decode: forwards not watched at first (start-up, autotune, capture)
WATCH_WINDOW = 16  # forwards per judgement
WATCH_SHARE = 0.1  # the share of the time forwards may wait for the host decode


def gpu_decode_chosen(prototxt_value: bool | None) -> bool:
    """Whether JPEG records are to be decoded on the device by nvJPEG (in GPU mode):
    ``$PYCAFFE_LITE_GPU_DECODE`` (``config.gpu_decode``) when set, else the prototxt's
    ``data_param.gpu_decode`` (field 1002) when written there, else yes (``prototxt_value`` None:
    the field is unset, the default)."""
    chosen = config.gpu_decode
    if chosen is not None:
        return bool(chosen)
    return True if prototxt_value is None else bool(prototxt_value)


def leave_encoded(batches: data_workers.SharedBatches, slot: int, i: int, encoded: bytes, label: float,
                  shape: tuple[int, int, int], force_color: bool, force_gray: bool) -> int | None:
    """A worker's part of a device decode: when nvJPEG gives this JPEG as the host would
    (:func:`nvjpeg.gpu_decodable`) and its bytes fit in the item's ``C*H*W`` bytes, write them there
    and the label, and return their length (the worker's answer for the item); else None (the
    worker decodes it on the host)."""
    n = len(encoded)
    item = batches.data[slot][i].reshape(-1)
    if n > item.size or not nvjpeg.gpu_decodable(nvjpeg.jpeg_header(encoded), shape, force_color, force_gray):
        return None
    item[:n] = np.frombuffer(encoded, np.uint8)
    batches.labels[slot][i] = label
    return n


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
        self._held: list[tuple[int, Any]] = []  # (slot, event): slots handed out, kept until their upload is done
        self._staged: _Staged | None = None  # the next batch, queued on the copy stream
        self._device: dict[str, Any] = {}
        self.staged_ahead = 0  # batches queued on the copy stream a forward before they were due
        self.gpu_decode = False  # JPEG items left encoded by the workers, decoded by nvJPEG (set before start)
        self.adaptive = False  # the workers decode JPEG until forwards wait for them, then nvJPEG (set before start)
        self._watch: tuple[int, float, float] = (0, 0.0, 0.0)  # adaptive: (forwards, window start, waited in it)
        self.handing_over = False  # adaptive: nvJPEG takes the batches planned from now on (see fill)
        self.decoder: nvjpeg.Decoder | None = None
        self._stager: _Stager | None = None  # the gpu_decode path's staging thread (from the first device forward)

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
        self.loader.device_decode = self.gpu_decode
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

    def _hold(self, slot: int, event: Any) -> None:
        """Keep ``slot`` from the workers until ``event`` (the upload or decode that reads it) has
        completed; give back the slots whose event has (the oldest waited for when more than two
        are held)."""
        assert self.loader is not None
        self._held.append((slot, event))
        while self._held and (len(self._held) > 2 or self._held[0][1] is None or self._held[0][1].query()):
            slot, event = self._held.pop(0)
            if event is not None:
                event.synchronize()
            self.loader.release(slot)

    def _release_all(self) -> None:
        """Wait for every queued upload from the shared batches and every kernel reading the
        device buffers (which go back to the pool); give the slots back."""
        staged, self._staged = self._staged, None
        held = self._held + ([(staged.slot, staged.ready)] if staged is not None else [])
        self._held = []
        for event in self._device.get("consumed", ()):
            if event is not None:
                event.synchronize()
        for slot, event in held:
            if event is not None:
                event.synchronize()
            if self.loader is not None:
                self.loader.release(slot)

    def _take(self) -> tuple[int, Any, list | None, _Staged | None]:
        """The next batch: the staging thread's (``gpu_decode``), or the one already staged on the
        device, else the loader's (waiting for it: :attr:`waited`). ``(slot, position, payloads,
        staged)``."""
        assert self.loader is not None
        if self._stager is not None:
            taken, self.waited, ahead = self._stager.take()
            self.staged_ahead += int(ahead)
            return taken.slot, taken.position, taken.payloads, taken
        staged, self._staged = self._staged, None
        if staged is not None:
            self.waited = 0.0
            self._watch_host_decode()
            return staged.slot, staged.position, staged.payloads, staged
        start = time.perf_counter()
        slot, position, payloads = self.loader.get()
        self.waited = time.perf_counter() - start
        self._watch_host_decode()
        return slot, position, payloads, None

    def _watch_host_decode(self) -> None:
        """:attr:`adaptive` (the workers decode, batches staged as for raw records): after
        :data:`WATCH_SKIP` forwards, over each :data:`WATCH_WINDOW` of them, the share of the time
        the forwards waited for batches; above :data:`WATCH_SHARE` the workers cannot keep up, and
        the batches planned from then on are left encoded for nvJPEG, which :meth:`fill` starts
        (for good; one INFO line). While they keep up, decoding on the host leaves the device to the net."""
        assert self.loader is not None
        if not self.adaptive or self.loader.device_decode:
            return
        count, start, waited = self._watch
        now = time.perf_counter()
        count += 1
        if count <= WATCH_SKIP:
            self._watch = (count, now, 0.0)
            return
        waited += self.waited
        if count - WATCH_SKIP < WATCH_WINDOW:
            self._watch = (count, start, waited)
            return
        share = waited / max(now - start, 1e-9)
        if share > WATCH_SHARE:
            self.loader.device_decode = self.handing_over = True
            log.info("%s: the forwards waited %.0f %% of the time for the workers' host decode: JPEG records "
                     "are decoded on the device by nvJPEG from now on", self.where, share * 100)
        self._watch = (WATCH_SKIP, now, 0.0)

    def fill(self, top, gpu: bool) -> tuple[int, bytes, str]:
        """The next batch into the tops: on the device by the kernel (``gpu`` and uint8 items), else
        on the host; where the next batch starts. On the device, the batch after it is uploaded
        (or decoded) on the copy stream now if the workers have it ready, so that its copy runs while
        the net computes on this one; with :attr:`gpu_decode` a thread of the layer's own (started
        by the first device forward) decodes the batches ahead on the copy stream instead."""
        assert self.loader is not None
        if self.handing_over and self._staged is None:  # (a batch staged ahead goes first)
            self.handing_over, self.gpu_decode = False, True
            if self._device and self.decoder is None:
                self._open_decoder(start=0)
        if gpu and self.raw and self.gpu_decode and self._stager is None:
            self._start_stager()
        slot, position, payloads, staged = self._take()
        batches = self.loader.batches
        data, labels, draws = batches.data[slot], batches.labels[slot], batches.draws[slot]
        top[0].reshape((self.batch_size, *self.out_shape))
        if len(top) > 1:
            top[1].reshape((self.batch_size,))
            top[1].mutable_cpu_data()[...] = labels
        if gpu and self.raw:
            if staged is None:
                staged = self._stage(slot, position, payloads)
            self._transform_staged(staged, top[0])
            self._hold(slot, staged.ready)
            if self._stager is not None:
                self._stager.consumed()
            elif not self.handing_over:
                self._stage_ahead()
            return position
        if self._stager is not None and staged is not None:  # (its buffer is not read: stage into it again)
            self._stager.consumed()
        try:
            if self.raw:  # (a GPU-mode layer run on the CPU) the host transform, item by item
                if staged is not None:  # (its upload or decode reads the slot)
                    staged.ready.synchronize()
                self._decode_on_host(data, nvjpeg.encoded_items(payloads), nvjpeg.item_keys(payloads))
                out = top[0].mutable_cpu_data()
                for i in range(self.batch_size):
                    self.transformer.apply(data[i], int(draws[i, 0]), int(draws[i, 1]), bool(draws[i, 2]), out=out[i])
            else:
                top[0].mutable_cpu_data()[...] = data
        finally:
            self._hold(slot, staged.ready if staged is not None else None)
        return position

    # -- the device path: uploads (or nvJPEG decodes) on the copy stream into two buffers in turn ----
    def _device_setup(self, data: np.ndarray, draws: np.ndarray) -> None:
        """Once: page-lock the shared batches, two device buffers for batches and draws, the mean,
        the kernel, and the nvJPEG decoder when :attr:`gpu_decode` asks for one."""
        from pycaffe_lite.gpu import backend, driver

        dev = self._device
        assert self.loader is not None
        try:  # page-lock the shared batches: uploads run at the bus's rate, asynchronously
            self._registered = driver.register_host(self.loader.batches.whole)
        except Exception as exc:  # (the driver may refuse: pageable copies then)
            log.info("%s: shared batches not page-locked (%s): pageable uploads", self.where, exc)
            self._registered = None
            self.register_error = f"{type(exc).__name__}: {exc}"
        dev["data"] = [backend.alloc(data.nbytes) for _ in range(2)]
        dev["draws"] = [backend.alloc(draws.nbytes) for _ in range(2)]
        dev["consumed"] = [None, None]  # per buffer: the compute stream's event after its last read
        dev["ready"] = [None, None]  # per buffer: the copy stream's event after its last upload
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
        dev["turn"] = 0
        if self.gpu_decode:
            self._open_decoder(start=0)

    def _start_stager(self) -> None:
        """Set the device up here (allocations, the kernel, the decoder, the copy stream: none of
        it in the thread), then start the staging thread."""
        from pycaffe_lite.gpu import backend

        assert self.loader is not None
        if self.loader.stop_event.is_set():
            raise DataError(f"{self.where}: the data loader is not running (layer closed?)")
        batches = self.loader.batches
        if not self._device:
            self._device_setup(batches.data[0], batches.draws[0])
        backend.copy_stream()
        self._stager = _Stager(self)
        self._stager.start()

    def _open_decoder(self, start: int) -> None:
        """An nvJPEG decoder with the first backend from ``nvjpeg.BACKENDS[start]`` on, or None (a warning)."""
        try:
            self.decoder = nvjpeg.Decoder(states=2, start=start)
            log.info("%s: JPEG records decoded on the device by nvJPEG (%s backend, %s)", self.where,
                     self.decoder.backend, self.decoder.path)
        except nvjpeg.NvJpegError as exc:
            self.decoder = None
            log.warning("%s: %s; JPEG records are decoded on the host", self.where, exc)

    def _stage(self, slot: int, position: Any, payloads: list | None) -> _Staged:
        """Queue the batch of ``slot`` on the copy stream into the next device buffer (after the
        compute stream's last read of it): its uint8 items uploaded, or its JPEG items decoded by
        nvJPEG and the others uploaded; then its draws; an event after them."""
        from pycaffe_lite.gpu import backend

        assert self.loader is not None
        batches = self.loader.batches
        data, draws = batches.data[slot], batches.draws[slot]
        dev = self._device
        if not dev:
            self._device_setup(data, draws)
        k = dev["turn"]
        dev["turn"] = 1 - k
        copy = backend.copy_stream()
        if dev["consumed"][k] is not None:
            copy.wait_for_event(dev["consumed"][k])
        pinned = self._registered is not None
        jpegs = nvjpeg.encoded_items(payloads)
        if jpegs:
            self._decode_on_device(k, data, jpegs, nvjpeg.item_keys(payloads), copy)
        else:
            backend.memcpy_htod(int(dev["data"][k]), data, pinned=pinned, on=copy)
        backend.memcpy_htod(int(dev["draws"][k]), np.ascontiguousarray(draws), on=copy)
        ready = backend.record_event(copy)
        dev["ready"][k] = ready
        return _Staged(slot, position, payloads, k, ready)

    def _decode_on_device(self, k: int, data: np.ndarray, jpegs: list[tuple[int, int]], keys: list, copy) -> None:
        """Items ``jpegs`` (item, encoded length) of ``data`` decoded by nvJPEG into buffer ``k``,
        the others uploaded one by one. When nvJPEG fails, the host decodes the batch (a corrupt
        record is an error naming its key, from ``keys``), and the next of ``nvjpeg.BACKENDS``
        takes over for later batches; when none is left the host decodes them all."""
        from pycaffe_lite.gpu import backend

        dev = self._device
        base, item_bytes = int(dev["data"][k]), int(np.prod(self.shape))
        encoded = {i for i, _ in jpegs}
        for i in range(self.batch_size):
            if i not in encoded:
                backend.memcpy_htod(base + i * item_bytes, data[i], pinned=self._registered is not None, on=copy)
        if self.decoder is not None:
            previous = dev["ready"][k]
            if previous is not None:  # the state's last decode, two batches ago, has finished
                previous.synchronize()
            host = data.ctypes.data
            try:
                self.decoder.decode(k, [host + i * item_bytes for i, _ in jpegs], [n for _, n in jpegs],
                                    [nvjpeg.plane_pointers(base, i, self.shape) for i, _ in jpegs], self.shape[2],
                                    nvjpeg.output_format(self.shape[0]), copy.handle)
                return
            except nvjpeg.NvJpegError as exc:
                failure = str(exc)
        else:
            failure = ""
        copy.synchronize()  # (the item uploads above read data before it is overwritten)
        self._decode_on_host(data, jpegs, keys)  # (a corrupt record raises here, named)
        for i, _ in jpegs:
            backend.memcpy_htod(base + i * item_bytes, data[i], on=copy)
        if failure and self.decoder is not None:  # the host decoded what nvJPEG failed on: next backend
            level = self.decoder.level
            self.decoder.close()
            self.decoder = None
            log.warning("%s: %s (the host decoded the batch)", self.where, failure)
            if level + 1 < len(nvjpeg.BACKENDS):
                self._open_decoder(start=level + 1)
            if self.decoder is None:
                log.warning("%s: JPEG records are decoded on the host from now on", self.where)

    def _decode_on_host(self, data: np.ndarray, jpegs: list[tuple[int, int]], keys: list) -> None:
        """Decode the JPEG items the workers left encoded (``(item, length)``; ``keys[i]`` names
        item ``i``'s record) into their pixels, in place."""
        p = self.transformer.param
        for i, n in jpegs:
            flat = data[i].reshape(-1)
            where = f"{self.where}: record {keys[i]!r}"
            values = decode_image(bytes(flat[:n]), p.force_color, p.force_gray, where)
            if values.shape != tuple(self.shape):
                raise DataError(f"{where} decodes to shape {values.shape}, the batch has {tuple(self.shape)}")
            data[i] = values

    def _transform_staged(self, staged: _Staged, top) -> None:
        """The compute stream waits for the staged batch, then one kernel writes it transformed into ``top``."""
        from pycaffe_lite.gpu import backend

        dev = self._device
        k = staged.buffer
        compute = backend.stream()
        compute.wait_for_event(staged.ready)
        c, h, w = self.shape
        _, oh, ow = self.out_shape
        scale = float(self.transformer.param.scale)
        dev["kernel"](self.batch_size * c * oh * ow, int(dev["data"][k]), int(dev["draws"][k]), int(dev["mean"]),
                      dev["mean_kind"], int(scale != 1), scale, c, h, w, oh, ow, top.mutable_gpu_data())
        dev["consumed"][k] = backend.record_event()

    def _stage_ahead(self) -> None:
        """Stage the next batch now if the workers have finished it (and a slot is left for them)."""
        if self._staged is not None or self.depth < 3 or self.loader is None:
            return
        got = self.loader.try_get()
        if got is not None:
            slot, position, payloads = got
            self._staged = self._stage(slot, position, payloads)
            self.staged_ahead += 1

    def stop(self) -> None:
        """Stop the staging thread and the workers, free the shared memory (the cursor stays open)."""
        if self._stager is not None and not self._stager.stop():
            return  # (asked from the staging thread: it finishes the stop on its way out)
        self._finish_stop()

    def _finish_stop(self) -> None:
        """:meth:`stop` once the staging thread has ended (or from it, on its way out)."""
        stager, self._stager = self._stager, None
        if stager is not None:  # its staged batches and the one it failed on go back to the loader
            self._held += [(st.slot, st.ready) for st in stager.staged()]
            if stager.orphan is not None:
                try:
                    from pycaffe_lite.gpu import backend

                    backend.copy_stream().synchronize()  # (what it queued for that batch reads the slot)
                except Exception:  # (the device context may be gone at exit)
                    pass
                self._held.append((stager.orphan, None))
        try:
            self._release_all()
        except Exception:  # (the device context may be gone at exit)
            self._held, self._staged = [], None
        if self.decoder is not None:
            try:
                self.decoder.close()
            except Exception:  # (the device context may be gone at exit)
                pass
            self.decoder = None
        if self._registered is not None:
            try:
                self._registered()
            except Exception:  # (the device context may be gone at exit)
                pass
            self._registered = None
        self._device.clear()
        if self.loader is not None:
            self.loader.stop()
