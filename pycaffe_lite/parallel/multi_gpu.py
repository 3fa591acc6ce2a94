"""Data-parallel training on several GPUs: pycaffe's ``caffe.NCCL`` and the per-rank session.

One process per GPU (a *rank*). Every rank builds the same solver; rank 0's weights are broadcast
(:meth:`NCCL.bcast`); each rank's Data layers read a disjoint share of the records; after backward
the gradients are averaged over the ranks (all-reduce with ``ncclAvg``: the sum times
1/solver_count, as BVLC scales them) and every rank applies the same update. With
``layer_wise_reduce`` (default true) the gradients are reduced in buckets, each queued as soon as
the backward pass has finished the layers it holds, on a stream of its own, so communication
overlaps the rest of backward; the solver's update waits for that stream through an event. Each
bucket's gradients live in one contiguous device buffer (as BVLC's ``GPUParams`` lays them out),
so a bucket is one all-reduce, not one per param: ResNet-50 has 161 params, most of them small,
and NCCL's per-collective latency made the separate calls cost about 1 ms an iteration. All of
it is device work queued without host synchronisation, so the whole iteration, reductions
included, is captured into one CUDA graph by :class:`~pycaffe_lite.runtime.executor.Executor`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, SupportsInt

from .. import common
from ..config import config
from ..errors import CaffeError
from ..gpu import backend, driver
from . import nccl

if TYPE_CHECKING:
    from ..solvers.solver import Solver

log = logging.getLogger("pycaffe_lite")

EXIT_PEER_LOST = 3
FLAT_ALIGN = 64  # elements: each param's gradient starts 256-byte aligned in its bucket's buffer


def plan_buckets(ready: Sequence[int], nbytes: Sequence[int], cap: int | None = None) -> list[tuple[int, list[int]]]:
    """Group params into buckets reduced during backward.

    ``ready[p]``: the layer after whose backward param ``p``'s gradient is final (the lowest index
    of the layers using it; backward runs from the last layer to the first). Buckets close at
    layer boundaries once they hold ``cap`` bytes (default ``config.bucket_mb``), so a layer's params are reduced together.
    Returns ``[(layer, [param ids])]`` in the order backward completes them: bucket k is queued
    after ``layer``'s backward."""
    cap = int(config.bucket_mb * (1 << 20)) if cap is None else cap
    order = sorted(range(len(ready)), key=lambda p: (-ready[p], p))
    buckets: list[tuple[int, list[int]]] = []
    current: list[int] = []
    size = 0
    for k, p in enumerate(order):
        current.append(p)
        size += nbytes[p]
        last = k + 1 == len(order)
        if last or (size >= cap and ready[order[k + 1]] != ready[p]):
            buckets.append((ready[p], current))
            current, size = [], 0
    return buckets


def split_by_dtype(buckets: Sequence[tuple[int, list[int]]], dtypes: Sequence) -> list[tuple[int, list[int]]]:
    """Each bucket of :func:`plan_buckets` split into one per gradient type (``dtypes[p]`` of param
    ``p``; a half net's half and float32 gradients reduce in their own types), order kept."""
    out: list[tuple[int, list[int]]] = []
    for layer, params in buckets:
        groups: dict[str, list[int]] = {}
        for p in params:
            groups.setdefault(str(dtypes[p]), []).append(p)
        out.extend((layer, g) for g in groups.values())
    return out


def bucket_layout(counts: Sequence[int], align: int = FLAT_ALIGN) -> tuple[list[int], int]:
    """Element offsets of params with ``counts`` elements packed in one buffer, each start a
    multiple of ``align`` elements (aligned vector access); returns (offsets, buffer elements)."""
    offsets, end = [], 0
    for c in counts:
        offsets.append(end)
        end += -(-c // align) * align
    return offsets, end


def ready_layers(net) -> list[int]:
    """Per learnable param of ``net``: the lowest layer index using it (see :func:`plan_buckets`)."""
    ready = [len(net.layers)] * len(net.learnable_params)
    for net_param, (layer, _) in enumerate(net.param_layer_indices):
        lid = net.learnable_param_ids[net_param]
        ready[lid] = min(ready[lid], layer)
    return ready


def _require_gpu(what: str) -> None:
    if common.mode() is not common.Mode.GPU:
        raise CaffeError(f"{what} needs GPU mode: call caffe.set_mode_gpu() (and set_device) first")


class NCCL:
    """pycaffe's ``caffe.NCCL(solver, uid)``: this rank's communicator for ``solver``'s train net.

    Use as BVLC's ``python/train.py``: ``nccl.bcast()``; ``solver.add_callback(nccl)``; with
    ``layer_wise_reduce`` also ``solver.net.after_backward(nccl)``. Ranks and their number come
    from ``caffe.set_solver_rank`` / ``set_solver_count``; the current device is used."""

    graph_safe = True  # its hooks only queue device work (see Executor.hooks)

    def __init__(self, solver: Solver, uid: bytes | str) -> None:
        _require_gpu("caffe.NCCL")

        self.solver = solver
        self.net = solver.net
        uid = uid.encode("latin-1") if isinstance(uid, str) else bytes(uid)
        common.set_multiprocess(True)
        self.comm = nccl.Communicator(uid, common.solver_count(), common.solver_rank())
        if nccl.version() < (2, 10, 0):
            raise CaffeError(f"NCCL {'.'.join(map(str, nccl.version()))} is too old: pycaffe-lite needs >= 2.10")
        st = backend.state()
        self._cuda = st.cuda
        self._main = st.stream
        self._side = st.cuda.Stream()  # the reductions' own stream
        flags = st.cuda.event_flags.DISABLE_TIMING
        self._fork, self._join = st.cuda.Event(flags), st.cuda.Event(flags)
        self.params = list(self.net.learnable_params)
        self.layer_wise = bool(solver.param.layer_wise_reduce)
        if self.layer_wise:
            buckets = plan_buckets(ready_layers(self.net), [b.count * b.diff_dtype.itemsize for b in self.params])
        else:  # one all-reduce of every gradient, queued before the update
            buckets = [(-1, list(range(len(self.params))))]
        # gradients reduce in their own storage type: half nets' fp16/bf16 ones in half (NCCL's)
        self.buckets = split_by_dtype(buckets, [b.diff_dtype for b in self.params])
        self._flat = [self._flatten(ps) for _, ps in self.buckets]
        self._at_layer: dict[int, list[int]] = {}
        for k, (layer, _) in enumerate(self.buckets):
            self._at_layer.setdefault(layer, []).append(k)
        self._queued: set[int] = set()  # buckets queued in the current iteration
        self._watchdog = _Watchdog(self)
        self._done = self._watchdog.new_event()  # recorded after each iteration's reductions (also in graphs)

    @staticmethod
    def new_uid() -> bytes:
        """A new NCCL unique id (128 bytes) for ``NCCL(solver, uid)`` on every rank."""
        return nccl.new_unique_id()

    def bcast(self) -> None:
        """Every rank's weights become rank 0's (waits until done)."""
        with self.comm.group():
            for b in self.params:
                self.comm.broadcast(b.mutable_gpu_data(), b.count, b.dtype, self._main.handle)
        self._main.synchronize()

    # -- per-layer hook and solver callbacks ---------------------------------------------------
    def __call__(self, layer: int) -> None:
        """``after_backward`` hook: queue the buckets whose gradients ``layer`` completed."""
        for k in self._at_layer.get(layer, ()):
            self._reduce_bucket(k)

    run = __call__

    def _flatten(self, params: list[int]) -> tuple[SupportsInt, int, list[int]]:
        """Move the gradients of ``params`` into one zeroed device buffer (values kept); returns
        (buffer, its elements, each param's device address in it)."""

        offsets, total = bucket_layout([self.params[p].count for p in params])
        size = self.params[params[0]].diff_dtype.itemsize
        buf = backend.alloc(max(total, 1) * size)
        backend.memset_zero(int(buf), total * size)
        where = []
        for p, off in zip(params, offsets):
            ptr = int(buf) + off * size
            self.params[p].diff_memory.relocate(ptr)
            where.append(ptr)
        return buf, total, where

    def _reduce_bucket(self, k: int) -> None:
        self._fork.record(self._main)  # the reduction waits for the gradients queued so far
        self._side.wait_for_event(self._fork)
        self._queued.add(k)
        buf, total, where = self._flat[k]
        params = [self.params[p] for p in self.buckets[k][1]]
        ptrs = [b.mutable_gpu_diff() for b in params]
        dtype = params[0].diff_dtype
        if ptrs == where:  # still in the bucket's buffer: one collective (padding is zeros)
            self.comm.all_reduce(int(buf), total, dtype, self._side.handle, nccl.AVG)
            return
        with self.comm.group():  # a gradient was given memory of its own since: one per param
            for b, ptr in zip(params, ptrs):
                self.comm.all_reduce(ptr, b.count, dtype, self._side.handle, nccl.AVG)

    def on_start(self) -> None:
        """Solver callback at the start of an iteration (nothing to do)."""

    def on_gradients_ready(self) -> None:
        """Solver callback before the update: reduce what is left, then make the update wait."""
        for k in range(len(self.buckets)):
            if k not in self._queued:
                self._reduce_bucket(k)
        if self._queued:
            self._join.record(self._side)
            self._main.wait_for_event(self._join)
        self._queued.clear()
        self._watchdog.record(self._done, self._main)

    on_start.graph_safe = True  # type: ignore[attr-defined]
    on_gradients_ready.graph_safe = True  # type: ignore[attr-defined]

    def abort(self) -> None:
        """Stop pending collectives (from any thread); the communicator is unusable afterwards."""
        self.comm.abort()


class _Watchdog:
    """Stops this rank (:func:`stop_process`) when waiting cannot end: the parent process is gone
    (an orphaned rank), or a rank on this host has exited while this rank's reductions have been
    waiting for more than ``STUCK_S`` seconds. (Ranks started by ``pycaffe-lite train`` are also
    watched through their rendezvous connections, across machines and faster.)"""

    STUCK_S = 10.0
    _NOT_READY = 600  # CUDA_ERROR_NOT_READY

    def __init__(self, owner: NCCL) -> None:
        import socket
        import zlib

        import numpy as np

        self.owner = owner
        self.lib = driver.lib()
        self.lib.cuEventQuery.argtypes = [ctypes.c_void_p]
        self.lib.cuEventCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        self.lib.cuEventRecordWithFlags.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
        self.lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        self.context = backend.state().context.handle
        n, me = owner.comm.nranks, np.array([zlib.crc32(socket.gethostname().encode()), os.getpid()], np.int64)
        send, recv = backend.alloc(me.nbytes), backend.alloc(me.nbytes * n)
        backend.memcpy_htod(int(send), me)
        owner.comm.all_gather(int(send), int(recv), 2, np.int64, owner._main.handle)
        everyone = np.empty(2 * n, np.int64)
        backend.memcpy_dtoh(everyone, int(recv))
        self.peers = [(r, int(everyone[2 * r + 1])) for r in range(n)
                      if r != owner.comm.rank and everyone[2 * r] == me[0]]
        self.parent = os.getppid()
        threading.Thread(target=self._run, name="nccl watchdog", daemon=True).start()

    def new_event(self) -> ctypes.c_void_p:
        """A driver event (CUevent, timing disabled) the watchdog thread can query."""
        event = ctypes.c_void_p()
        status = self.lib.cuEventCreate(ctypes.byref(event), 2)  # CU_EVENT_DISABLE_TIMING
        if status != 0:
            raise CaffeError(f"cuEventCreate failed with CUDA error {status}")
        return event

    def record(self, event: ctypes.c_void_p, stream) -> None:
        """Record ``event`` on ``stream``; inside a graph capture as a node replays record again."""

        external = 1 if backend.recording() is not None else 0  # CU_EVENT_RECORD_EXTERNAL
        self.lib.cuEventRecordWithFlags(event, ctypes.c_void_p(stream.handle), external)

    def _run(self) -> None:
        self.lib.cuCtxSetCurrent(ctypes.c_void_p(self.context))
        waiting_since = None
        while True:
            time.sleep(0.5)
            if os.getppid() != self.parent:
                stop_process(f"the parent process ({self.parent}) exited", self.owner)
            gone = [r for r, pid in self.peers if not _alive(pid)]
            done = getattr(self.owner, "_done", None)
            stuck = gone and done is not None and self.lib.cuEventQuery(done) == self._NOT_READY
            if not stuck:
                waiting_since = None
            elif waiting_since is None:
                waiting_since = time.monotonic()
            elif time.monotonic() - waiting_since > self.STUCK_S:
                stop_process(f"rank {gone[0]} exited while this rank waits for it in NCCL", self.owner)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def stop_process(message: str, nccl_object: NCCL | None = None) -> None:
    """Log ``message``, abort NCCL (bounded: 5 s), and end this process with EXIT_PEER_LOST."""
    log.error("%s; stopping this rank (%d)", message, common.solver_rank())
    for handler in logging.getLogger("pycaffe_lite").handlers:
        handler.flush()
    if nccl_object is not None:
        t = threading.Thread(target=nccl_object.abort, daemon=True)
        t.start()
        t.join(5.0)
    os._exit(EXIT_PEER_LOST)
