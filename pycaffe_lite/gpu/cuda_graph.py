"""CUDA graph capture and replay of work queued on the backend stream (driver API via ctypes).

``with capture(recording): ...`` records every kernel, copy and cuBLAS call queued on the backend
stream inside the block into a graph instead of running it; ``graph.launch()`` replays it with one
launch. Rules while capturing: no host synchronization (no ``memcpy_dtoh``, no ``blas.dot``), no
device allocation (``backend.alloc`` raises), and every pointer used must stay valid while the graph
lives. Scalars that change between replays must be read by kernels from device memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc

from . import backend
from .driver import check as _check
from .driver import lib as _driver
from .driver import loaded as _driver_loaded

_CAPTURE_MODE_THREAD_LOCAL = 1
class CudaGraph:
    """An instantiated graph; ``launch()`` queues one replay on the backend stream."""

    def __init__(self, graph: ctypes.c_void_p) -> None:
        lib = _driver()
        self._graph = graph
        self._exec = ctypes.c_void_p()
        _check(lib.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), graph, 0), "cuGraphInstantiate")
        count = ctypes.c_size_t(0)
        _check(lib.cuGraphGetNodes(graph, None, ctypes.byref(count)), "cuGraphGetNodes")
        self.num_nodes = int(count.value)

    def launch(self) -> None:
        _check(_driver().cuGraphLaunch(self._exec, ctypes.c_void_p(backend.stream().handle)), "cuGraphLaunch")

    def __del__(self) -> None:
        if not _driver_loaded():
            return
        handles = (self._exec, self._graph)
        try:
            if backend.recording() is not None:  # destroying now would invalidate that capture
                _doomed.append(handles)
            else:
                _destroy(handles)
        except Exception:  # interpreter shutdown
            pass


_doomed: list[tuple[ctypes.c_void_p, ctypes.c_void_p]] = []  # graphs collected during a capture


def _destroy(handles: tuple[ctypes.c_void_p, ctypes.c_void_p]) -> None:
    executable, graph = handles
    if executable:
        _driver().cuGraphExecDestroy(executable)
    if graph:
        _driver().cuGraphDestroy(graph)


class Recording:
    """What one capture produced: the graph (set on a clean exit) and the memories written."""

    def __init__(self) -> None:
        self.graph: CudaGraph | None = None
        self.written: set = set()  # SyncedMemory objects made device-newest by the captured work
        self.touched: set = set()  # every SyncedMemory whose device pointer the captured work took


@contextlib.contextmanager
def capture(recording: Recording):
    """Record the work queued on the backend stream inside the block into ``recording``. While it
    records, :func:`backend.recording` returns it (the one "capturing" fact every module checks).
    An exception inside ends the capture, discards the graph and propagates."""
    lib = _driver()
    st = backend.state()
    stream = ctypes.c_void_p(st.stream.handle)
    # No cyclic garbage collection while recording: an unrelated object freed now (another net's
    # graph, a module) would make a driver call that invalidates the capture.
    collecting = gc.isenabled()
    gc.disable()
    try:
        _check(lib.cuStreamBeginCapture_v2(stream, _CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture")
    except BaseException:
        if collecting:
            gc.enable()
        raise
    st.recording = recording
    graph = ctypes.c_void_p()
    try:
        try:
            yield recording
        except BaseException:
            lib.cuStreamEndCapture(stream, ctypes.byref(graph))
            if graph:
                lib.cuGraphDestroy(graph)
            raise
        finally:
            st.recording = None
        _check(lib.cuStreamEndCapture(stream, ctypes.byref(graph)), "cuStreamEndCapture")
        recording.graph = CudaGraph(graph)
    finally:  # the capture has ended: what was collected meanwhile can go now
        if collecting:
            gc.enable()
        while _doomed:
            _destroy(_doomed.pop())
