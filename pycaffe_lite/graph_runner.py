"""Replaying fixed-shape net work as CUDA graphs, so a whole range costs one launch.

A :class:`GraphRunner` runs a piece of GPU work (a callable that queues kernels) the first time
as usual (allocations, compilation, cuBLAS set-up happen then), captures it into a graph the
second time, and replays the graph afterwards while the key (range and blob shapes) is unchanged.
Before each replay every host-newer memory the net can reach is copied to the device (so values a
user wrote through ``blob.data`` are used); after it the memories the work writes are marked
device-newest. Work that cannot be captured (a host read, an allocation, a layer whose host-side
state changes per call) falls back to plain execution for that key, once, with a log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable

from .gpu import backend, cuda_graph
from .synced_memory import Head, SyncedMemory

log = logging.getLogger("pycaffe_lite")


class GraphRunner:
    def __init__(self, memories: Callable[[], Iterable[SyncedMemory]]) -> None:
        """``memories()`` lists every memory the captured work may read (blobs, params, buffers)."""
        self._memories = memories
        self._graphs: dict[Hashable, tuple[cuda_graph.CudaGraph, list[SyncedMemory]]] = {}
        self._warm: set[Hashable] = set()
        self._failed: set[Hashable] = set()
        self.replays = 0
        self.captures = 0
        self.fallbacks: list[str] = []  # why a capture was abandoned, one line each

    def clear(self) -> None:
        """Forget every graph (call when pointers may have changed: reshape, sharing, reload)."""
        self._graphs.clear()
        self._warm.clear()
        self._failed.clear()

    def _sync_to_device(self) -> None:
        for mem in self._memories():
            if mem.head is not Head.HEAD_AT_GPU and mem.head is not Head.SYNCED:
                mem.gpu()

    def run(self, key: Hashable, work: Callable[[], None]) -> None:
        """Queue ``work`` on the stream: plainly, or captured then replayed for a stable ``key``."""
        if key in self._failed:
            work()
            return
        entry = self._graphs.get(key)
        if entry is None:
            if key not in self._warm:
                self._warm.add(key)
                work()
                return
            entry = self._capture(key, work)
            if entry is None:
                work()
                return
        else:
            self._sync_to_device()
        graph, written = entry
        graph.launch()
        for mem in written:
            mem.head = Head.HEAD_AT_GPU
        self.replays += 1

    def _capture(self, key: Hashable, work: Callable[[], None]):
        self._sync_to_device()
        st = backend.state()
        st.capture_written = set()
        heads = {id(m): (m, m.head) for m in self._memories()}
        try:
            with cuda_graph.capture() as holder:
                work()
        except Exception as exc:
            # Nothing ran: restore the head states the aborted capture changed, then run plainly.
            for mem, head in heads.values():
                mem.head = head
            for mem in st.capture_written:
                if id(mem) not in heads:
                    mem.head = Head.HEAD_AT_GPU
            self._failed.add(key)
            self.fallbacks.append(f"{key[0]}: {type(exc).__name__}: {exc}")
            log.info("CUDA graph capture not possible here (%s); running without graphs", exc)
            return None
        entry = (holder.graph, list(st.capture_written))
        st.capture_written = set()
        self._graphs[key] = entry
        self.captures += 1
        return entry
