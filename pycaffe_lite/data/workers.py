"""Worker processes that read and decode records into shared-memory batches, handed out in order.

The data layers' single prefetch thread decodes under the GIL (839 JPEG images/s on a 16-core
host). Here a pool of forked worker processes does the per-record work instead:

- :class:`SharedBatches`: ``slots`` batches in one ``multiprocessing.shared_memory`` segment; per
  slot ``data`` ``(batch, *item_shape)`` of the item dtype, ``labels`` ``(batch,)`` float64 and
  ``draws`` ``(batch, 3)`` int32 (the transformer's row offset, column offset, mirror flag).
- :class:`WorkerPool`: ``n`` processes, forked at set-up (as PyTorch's ``DataLoader``), each with
  a pipe of its own. A worker runs a :class:`Job` (picklable, layer-specific: read record ``ref``,
  decode, write item ``i`` of a slot) on the contiguous items the parent sends it and answers
  ``done`` or ``error`` with the record named. Workers ignore SIGINT/SIGTERM/SIGHUP (the parent
  decides: Ctrl-C stops training after the iteration) and exit when the parent's pipe closes,
  when their parent process is gone, or when told to.
- :class:`ParallelLoader`: a thread in the parent that plans batches (the layer's ``plan``
  callback reads the cursor and draws the random crop/mirror choices in the parent, in Caffe's
  order, so batches equal the single-thread path's), sends them to the pool, and queues them for
  :meth:`~ParallelLoader.get` in plan order. An error (a corrupt record, a dead worker) is raised
  by ``get`` when its batch is due, and by every later ``get``.

Shutdown: :meth:`ParallelLoader.close` stops the thread, asks the workers to exit, terminates
the ones that do not within a second and unlinks the segment; it runs when the layer is closed or
collected and at interpreter exit. After a SIGKILL of the parent, the workers notice the closed
pipe and exit, and Python's resource tracker unlinks the segment.
"""

from __future__ import annotations

import gc
import logging
import math
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import connection, shared_memory
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..config import config
from ..errors import CaffeError, DataError
from . import db

log = logging.getLogger("pycaffe_lite")

STALL_WARNING_S = 120.0  # a forward waiting this long for its batch logs a warning naming the workers
HEAVY_BATCH_BYTES = 1 << 20  # automatic mode: workers when a batch holds this many pixel bytes (or is encoded)
_ALIGN = 4096


# -- how many --------------------------------------------------------------------------------------
def _cgroup_cpu_limit() -> float | None:
    """The CPU quota (in cores) of this process's cgroup and its ancestors (v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us``/``cpu.cfs_period_us``); None when unlimited or unknown."""
    limits: list[float] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    root = Path("/sys/fs/cgroup")
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel_parts = [p for p in rel.split("/") if p]
        if controllers == "":  # v2
            bases, v2 = [root], True
        elif "cpu" in controllers.split(","):
            bases, v2 = [root / controllers, root / "cpu", root / "cpu,cpuacct"], False
        else:
            continue
        for base in bases:
            for depth in range(len(rel_parts), -1, -1):
                folder = base.joinpath(*rel_parts[:depth])
                try:
                    if v2:
                        quota, period = (folder / "cpu.max").read_text().split()[:2]
                        if quota != "max":
                            limits.append(int(quota) / int(period))
                    else:
                        q = int((folder / "cpu.cfs_quota_us").read_text())
                        p = int((folder / "cpu.cfs_period_us").read_text())
                        if q > 0 and p > 0:
                            limits.append(q / p)
                except (OSError, ValueError):
                    continue
    return min(limits) if limits else None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by its cgroup's CPU quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        n = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        n = min(n, max(1, math.ceil(limit)))
    return max(1, n)


class ItemShapeError(DataError):
    """A record whose shape differs from the first one's (the workers' batches have one shape)."""


def automatic(prototxt_value: int) -> bool:
    """Whether the worker count is the automatic choice (no override, a negative prototxt value)."""
    return config.data_workers is None and int(prototxt_value) < 0


def worker_count(prototxt_value: int, heavy: bool, ranks: int = 1) -> int:
    """Worker processes for a data layer: ``$PYCAFFE_LITE_DATA_WORKERS`` (``config.data_workers``)
    when set, else the prototxt's ``workers``; a negative value is automatic: when the data is
    ``heavy`` (encoded, or a batch holds :data:`HEAVY_BATCH_BYTES` of pixels) the usable cores
    shared by the ``ranks`` training processes of this host, less one for each (it plans and
    copies), else 0 (the single prefetch thread)."""
    chosen = config.data_workers
    n = int(chosen) if chosen is not None else int(prototxt_value)
    if n >= 0:
        return n
    if not heavy or "fork" not in mp.get_all_start_methods():
        return 0
    cores = usable_cores() // max(1, int(ranks))
    return cores - 1 if cores >= 2 else 0


# -- shared batches ------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchLayout:
    """What one slot holds: ``batch`` items of ``item_shape`` and ``item_dtype`` (``dtype.str``)."""

    batch: int
    item_shape: tuple[int, ...]
    item_dtype: str

    def _sizes(self) -> tuple[int, int, int]:
        data = self.batch * int(np.prod(self.item_shape)) * np.dtype(self.item_dtype).itemsize
        return _aligned(data), _aligned(self.batch * 8), _aligned(self.batch * 12)

    @property
    def slot_bytes(self) -> int:
        return sum(self._sizes())


def _aligned(n: int) -> int:
    return max(_ALIGN, -(-n // _ALIGN) * _ALIGN)


class SharedBatches:
    """``slots`` batches of ``layout`` in one shared-memory segment (created when ``name`` is
    None, else attached)."""

    def __init__(self, slots: int, layout: BatchLayout, name: str | None = None, where: str = "") -> None:
        self.slots, self.layout = int(slots), layout
        size = self.slots * layout.slot_bytes
        if name is None:
            try:
                st = os.statvfs("/dev/shm")
                free = st.f_bavail * st.f_frsize
            except OSError:
                free = None
            if free is not None and free < size:
                raise DataError(f"{where}: the data workers' {self.slots} batches need {size / 2**20:.0f} MiB of "
                                f"shared memory, /dev/shm has {free / 2**20:.0f} MiB free (lower data_param."
                                "prefetch, or set workers: 0)")
            self.shm = shared_memory.SharedMemory(create=True, size=size)
        else:
            self.shm = shared_memory.SharedMemory(name=name)
        self.name = self.shm.name
        self.owner = name is None
        assert self.shm.buf is not None
        buf = np.frombuffer(self.shm.buf, np.uint8)
        d, lab, dr = layout._sizes()
        per = layout.slot_bytes
        shape, dtype = (layout.batch, *layout.item_shape), np.dtype(layout.item_dtype)
        count = int(np.prod(shape))
        self.data = [buf[s * per : s * per + count * dtype.itemsize].view(dtype).reshape(shape)
                     for s in range(self.slots)]
        self.labels = [buf[s * per + d : s * per + d + layout.batch * 8].view(np.float64) for s in range(self.slots)]
        self.draws = [buf[s * per + d + lab : s * per + d + lab + layout.batch * 12].view(np.int32).reshape(-1, 3)
                      for s in range(self.slots)]
        self.whole = buf

    def close(self) -> None:
        """Drop the views and unmap; the creator also unlinks the segment."""
        self.data, self.labels, self.draws = [], [], []
        self.whole = np.empty(0, np.uint8)
        try:
            self.shm.close()
        except BufferError:  # views still held elsewhere: the mapping goes with the process
            pass
        if self.owner:
            self.owner = False
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass


# -- workers ---------------------------------------------------------------------------------------
class Job(Protocol):
    """What a worker does (picklable; built in the parent, used in the worker). A job with a
    ``gpu_decode`` attribute gets it set per batch from :attr:`ParallelLoader.device_decode` as the
    batch was planned (leave JPEG records encoded for nvJPEG, or decode them here)."""

    def open(self) -> None:
        """Per-process set-up in the worker (open the database, build the transformer)."""

    def load(self, ref: Any, batches: SharedBatches, slot: int, i: int) -> Any:
        """Read record ``ref`` and write item ``i`` of ``slot`` (data, and label when it has one);
        raise with a message naming the record on failure. What it returns (small, picklable: an
        item's variable-length labels) comes back with the batch; None for nothing."""


def store_item(batches: SharedBatches, slot: int, i: int, item: np.ndarray, label: float, raw: bool,
               transformer: Any) -> None:
    """Write item ``i`` of batch ``slot`` (a job's last step): the decoded uint8 ``item`` as it is
    (``raw``: the device transforms it) or transformed with the draws the loader made for it."""
    if raw:
        batches.data[slot][i] = item
    else:
        h_off, w_off, mirror = batches.draws[slot][i]
        transformer.apply(item, int(h_off), int(w_off), bool(mirror), out=batches.data[slot][i])
    batches.labels[slot][i] = label


def _ignore_signals() -> None:
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)


def _worker_main(conn, close_fds: Sequence[int], batches: SharedBatches, job: Job) -> None:
    """A worker's loop: ``(slot, start, refs)`` messages until ``None``, EOF or the parent is gone.
    ``batches`` is the parent's mapping, inherited through fork (the segment stays the parent's)."""
    batches.owner = False
    _ignore_signals()
    for fd in close_fds:  # the parent's ends of the pool's pipes: their EOF must reach the workers
        try:
            os.close(fd)
        except OSError:
            pass
    parent = os.getppid()
    try:
        job.open()
    except BaseException as exc:
        conn.send(("fatal", -1, f"{type(exc).__name__}: {exc}", 0, None))
        return
    while True:
        try:
            if not conn.poll(1.0):
                if os.getppid() != parent:
                    break
                continue
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        slot, start, refs, device_decode = msg
        if hasattr(job, "gpu_decode"):
            job.gpu_decode = device_decode
        try:
            payloads = [job.load(ref, batches, slot, start + k) for k, ref in enumerate(refs)]
            reply: tuple = ("done", slot, "", start, payloads if any(p is not None for p in payloads) else None)
        except ItemShapeError as exc:
            reply = ("shape", slot, str(exc), start, None)
        except CaffeError as exc:
            reply = ("error", slot, str(exc), start, None)
        except Exception as exc:
            reply = ("error", slot, f"{type(exc).__name__}: {exc}", start, None)
        try:
            conn.send(reply)
        except (OSError, ValueError):
            break


class WorkerPool:
    """``n`` worker processes running ``job`` into ``batches``."""

    def __init__(self, n: int, job: Job, batches: SharedBatches, where: str) -> None:
        self.where = where
        self.batches = batches
        ctx = mp.get_context("fork")
        pipes = [ctx.Pipe(duplex=True) for _ in range(n)]
        parent_fds = [p.fileno() for p, _ in pipes]
        self.conns = [p for p, _ in pipes]
        self.procs: list[Any] = []
        gc.freeze()  # the children never collect (and finalize) the parent's objects
        try:
            with db.quiesced():  # no database operation half done in another thread at the fork
                self._start(ctx, pipes, parent_fds, job, where)
        except BaseException:
            self.close()
            raise
        finally:
            gc.unfreeze()
            for _, child in pipes:
                child.close()

    def _start(self, ctx, pipes, parent_fds: list[int], job: Job, where: str) -> None:
        for k, (_, child) in enumerate(pipes):
            proc = ctx.Process(target=_worker_main, name=f"pycaffe-lite data worker {k} ({where})",
                               args=(child, parent_fds, self.batches, job), daemon=True)
            with warnings.catch_warnings():  # (3.12 warns about fork with threads: the children
                warnings.simplefilter("ignore", DeprecationWarning)  # run only the decode loop)
                proc.start()
            self.procs.append(proc)

    def submit(self, slot: int, refs: Sequence[Any], device_decode: bool = False) -> int:
        """Send ``refs`` (item i of ``slot`` is ``refs[i]``) to the workers in contiguous chunks
        (``device_decode``: the job's ``gpu_decode`` for them); the number of messages sent (each
        answers once)."""
        n = len(self.conns)
        per = -(-len(refs) // n)
        sent = 0
        for k in range(n):
            chunk = refs[k * per : (k + 1) * per]
            if not len(chunk):
                break
            self.conns[k].send((slot, k * per, list(chunk), device_decode))
            sent += 1
        return sent

    def close(self) -> None:
        """Ask the workers to exit; terminate (then kill) those still running after a second."""
        for conn in self.conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 1.0
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []


def _death(proc) -> str:
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class Deferred(Exception):  # noqa: N818 (a signal, not an error)
    """Raised by a plan that must wait for the forward that asks for its batch (it draws from the
    process-wide generator, whose draws must stay in the order the forwards make them). The plan
    is called again with ``now=True`` once every batch before it was taken and the consumer waits
    for this one."""


class _Books:
    """The loader thread's accounts: free slots, slots in plan order, answers still due per slot,
    what each batch hands back, errors per slot, and whether planning goes on."""

    def __init__(self, slots: int) -> None:
        self.free = deque(range(slots))
        self.order: deque[int] = deque()
        self.pending: dict[int, int] = {}
        self.infos: dict[int, Any] = {}
        self.errors: dict[int, BaseException] = {}
        self.planning = True
        self.payloads: dict[int, dict[int, list]] = {}  # slot -> first item of a chunk -> what its items returned
        self.seq = 0  # batches planned (or deferred) so far
        self.deferred: tuple[int, int] | None = None  # (slot, sequence number) of a Deferred batch

    def flush(self, ready: queue.Queue) -> None:
        """Queue the complete batches at the head of the plan order."""
        while self.order and self.pending.get(self.order[0]) == 0:
            slot = self.order.popleft()
            chunks = self.payloads.pop(slot, {})
            payloads = [p for start in sorted(chunks) for p in chunks[start]] if chunks else None
            ready.put((slot, self.infos.pop(slot), self.errors.pop(slot, None), payloads))
            del self.pending[slot]


class ParallelLoader:
    """Plans batches in a thread of the parent and has ``pool`` fill them; :meth:`get` hands them
    out in plan order.

    ``plan(slot, now)`` runs in the loader's thread (it owns the layer's cursor and random state
    while the loader runs): it writes the slot's draws and returns ``(refs, info)``; ``info`` comes
    back with the batch from :meth:`get`. It may raise :class:`Deferred` (``now`` False).
    """

    def __init__(self, n: int, job: Job, layout: BatchLayout, slots: int,
                 plan: Callable[[int, bool], tuple[Sequence[Any], Any]], where: str) -> None:
        self.where = where
        self.plan = plan
        self.batches = SharedBatches(slots, layout, where=where)
        try:
            self.pool = WorkerPool(n, job, self.batches, where)
        except BaseException:
            self.batches.close()
            raise
        self.ready: queue.Queue = queue.Queue()
        self.released: queue.Queue = queue.Queue()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._asked = 0
        self._early: tuple | None = None  # a failed batch try_get saw before it was due
        self.thread = threading.Thread(target=self._run, name=f"data loader {where}", daemon=True)
        self._closed = False
        self.device_decode = False  # sent with each batch planned from now on (Job's gpu_decode)

    def start(self) -> None:
        self.thread.start()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def release(self, slot: int) -> None:
        """Give ``slot`` (handed out by :meth:`get`) back to the workers."""
        self.released.put(slot)
        self._wake()

    def _run(self) -> None:
        books = _Books(self.batches.slots)
        conns = self.pool.conns
        sentinels = {p.sentinel: p for p in self.pool.procs}
        try:
            while not self.stop_event.is_set():
                if books.deferred is not None and self._asked > books.deferred[1]:
                    slot, books.deferred = books.deferred[0], None
                    self._plan(books, slot, now=True)
                while books.planning and books.deferred is None and books.free and not self.stop_event.is_set():
                    slot = books.free.popleft()
                    books.order.append(slot)
                    books.seq += 1
                    self._plan(books, slot, now=False)
                books.flush(self.ready)
                for obj in connection.wait([*conns, *sentinels, self._wake_r], timeout=0.5):
                    if obj == self._wake_r:
                        self._take_released(books)
                    elif obj in sentinels:
                        proc = sentinels[obj]
                        proc.join(1.0)
                        raise DataError(f"{self.where}: data worker process {proc.pid} {_death(proc)} while "
                                        "decoding records (out of memory? a crash in an image decoder?)")
                    else:
                        self._answer(obj, books)
        except BaseException as exc:  # handed to the consumer after the batches before it
            books.flush(self.ready)
            self.ready.put((-1, None, exc, None))

    def _plan(self, books: _Books, slot: int, now: bool) -> None:
        try:
            refs, books.infos[slot] = self.plan(slot, now)
            books.pending[slot] = self.pool.submit(slot, refs, self.device_decode)
        except Deferred:
            books.deferred, books.pending[slot] = (slot, books.seq - 1), -1
        except BaseException as exc:  # the parent's part failed (database changed, ...)
            books.errors[slot], books.infos[slot], books.pending[slot] = exc, None, 0
            books.planning = False

    def _take_released(self, books: _Books) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                books.free.append(self.released.get_nowait())
            except queue.Empty:
                break

    def _answer(self, conn, books: _Books) -> None:
        """One worker's answer: a chunk of a slot done, or failed (the slot's first error is kept)."""
        try:
            kind, slot, text, start, payloads = conn.recv()
        except (EOFError, OSError):
            proc = self.pool.procs[self.pool.conns.index(conn)]
            proc.join(1.0)
            raise DataError(f"{self.where}: data worker process {proc.pid} {_death(proc)} while decoding "
                            "records") from None
        if kind == "fatal":
            raise DataError(f"{self.where}: a data worker could not start: {text}")
        books.pending[slot] -= 1
        if payloads is not None:
            books.payloads.setdefault(slot, {})[start] = payloads
        if kind != "done" and slot not in books.errors:
            books.errors[slot] = ItemShapeError(text) if kind == "shape" else DataError(text)

    def try_get(self) -> tuple[int, Any, list | None] | None:
        """The next batch as :meth:`get` gives it when it is complete now, else None (never waits,
        never has a Deferred batch planned). A batch that failed is kept for :meth:`get` to raise
        when it is due."""
        if self.error is not None or self._early is not None or self.stop_event.is_set():
            return None
        try:
            item = self.ready.get_nowait()
        except queue.Empty:
            return None
        if item[2] is not None:
            self._early = item
            return None
        self._asked += 1
        return item[0], item[1], item[3]

    def get(self) -> tuple[int, Any, list | None]:
        """``(slot, info, payloads)`` of the next batch (``payloads``: what the job's ``load``
        returned per item, or None when it returned nothing); raises the batch's error (and then
        every later call does)."""
        self._asked += 1  # (a Deferred batch is planned once its get has begun)
        self._wake()
        start, warned = time.monotonic(), False
        while True:
            if not warned and time.monotonic() - start > STALL_WARNING_S:
                warned = True
                log.warning("%s: no batch from the data workers for %.0f s (processes %s still running)",
                            self.where, STALL_WARNING_S, [p.pid for p in self.pool.procs if p.is_alive()])
            if self.error is not None:
                raise again(self.error)
            if self.stop_event.is_set():
                raise DataError(f"{self.where}: the data loader is not running (layer closed?)")
            try:
                early, self._early = self._early, None
                slot, info, err, payloads = early if early is not None else self.ready.get(timeout=0.05)
            except queue.Empty:
                if not self.thread.is_alive():
                    raise DataError(f"{self.where}: the data loader thread is not running (layer closed?)") from None
                continue
            if err is not None:
                self.error = err if isinstance(err, CaffeError) else DataError(f"{self.where}: data loader failed: "
                                                                               f"{err!r}")
                raise again(self.error)
            return slot, info, payloads

    def stop(self) -> None:
        """Stop the thread and the workers; unlink the shared memory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.stop_event.set()
        self._wake()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()
        self.pool.close()
        self.batches.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


def again(err: BaseException) -> BaseException:
    """A fresh exception of ``err``'s type and message (raising one instance twice chains oddly)."""
    if isinstance(err, CaffeError):
        fresh = type(err)(str(err))
        fresh.__cause__ = err.__cause__
        return fresh
    return DataError(str(err))
