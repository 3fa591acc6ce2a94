"""Host/device memory pair with Caffe's head state, so copies happen only when the other side is read.

States: ``UNINITIALIZED`` (nothing allocated), ``HEAD_AT_CPU`` (host copy newest),
``HEAD_AT_GPU`` (device copy newest), ``SYNCED`` (both equal). Reading one side brings it up to
date; asking for a mutable side makes it the head. ``version`` counts the times a side was asked for
to be written (memory plans use it to tell whether values a recomputation needs may have changed).
"""

from __future__ import annotations

import enum
import weakref
from typing import SupportsInt

import numpy as np

from .config import config
from .gpu import backend as _backend  # importing it needs no GPU
from .memcheck import out_of_memory

_WATCHED_WRITES = [0]


def watched_writes() -> int:
    """How many times a memory with ``watched`` set has been asked for for writing (host or device)
    or written by a graph replay: whatever is derived from watched memories is current while this
    count has not moved."""
    return _WATCHED_WRITES[0]


_HOST_NEWER: weakref.WeakSet[SyncedMemory] = weakref.WeakSet()


def host_newer_memories() -> list[SyncedMemory]:
    """Memories whose host copy was made the head since they were last seen here (a superset of
    those with ``host_is_newer()``): what a CUDA-graph replay must upload first, without walking
    every memory of a net."""
    return list(_HOST_NEWER)


def forget_host_newer(mem: SyncedMemory) -> None:
    _HOST_NEWER.discard(mem)


class Head(enum.Enum):
    UNINITIALIZED = 0
    HEAD_AT_CPU = 1
    HEAD_AT_GPU = 2
    SYNCED = 3


class HostAccessDuringCapture(RuntimeError):
    """Host-side work inside a CUDA graph capture (it would not be replayed): capture is abandoned."""


class SyncedMemory:
    """``count`` elements of ``dtype`` on the host (numpy) and, on demand, on the device."""

    __slots__ = ("count", "dtype", "_cpu", "_gpu", "head", "shared", "_pinned", "_upload", "watched", "version",
                 "__weakref__")

    def __init__(self, count: int, dtype: np.dtype, device: SupportsInt | None = None) -> None:
        """``device``: an existing device allocation of at least ``count`` elements to use (memory
        the caller shares between SyncedMemory objects whose values are never live together)."""
        self.count = int(count)
        self.dtype = np.dtype(dtype)
        self._cpu: np.ndarray | None = None
        self._gpu: SupportsInt | None = device  # device allocation (int()-able pointer)
        self.head = Head.UNINITIALIZED
        self.shared = False  # storage from use_storage(), which other SyncedMemory objects use too
        self._pinned = False  # _cpu is page-locked (backend.pinned_array)
        self._upload = None  # event of an asynchronous upload from the page-locked _cpu still reading it
        self.watched = False  # writes count in watched_writes() (parameters something is derived from)
        self.version = 0  # bumped by every request to write (mutable_*, set_cpu, use_storage, ...)

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize

    # -- host side --------------------------------------------------------------------------
    def _to_cpu(self) -> np.ndarray:
        if _backend.recording() is not None:
            raise HostAccessDuringCapture("host access to a blob while a CUDA graph is being captured")
        self._sync_upload()  # the caller may write the host copy: the upload must have read it
        if self.head is Head.UNINITIALIZED:
            self._cpu = self._host_alloc(zero=True)
            self.head = Head.HEAD_AT_CPU
            _HOST_NEWER.add(self)
        elif self.head is Head.HEAD_AT_GPU:
            if self._cpu is None:
                self._cpu = self._host_alloc(zero=False)
            if self.count:
                assert self._gpu is not None  # the device is the head: it holds the data
                _backend.memcpy_dtoh(self._cpu, int(self._gpu))
            self.head = Head.SYNCED
        assert self._cpu is not None
        return self._cpu

    def _host_alloc(self, zero: bool) -> np.ndarray:
        """Host storage: page-locked while a device is in use (``config.pin_host``), else numpy's."""
        pinned = _backend.pinned_array(self.count, self.dtype, zero) if config.pin_host else None
        self._pinned = pinned is not None
        if pinned is not None:
            return pinned
        try:
            return (np.zeros if zero else np.empty)(self.count, self.dtype)
        except MemoryError:
            raise out_of_memory(f"the host memory of a blob ({self.count:,} {self.dtype.name} values)",
                                self.nbytes) from None

    def cpu(self) -> np.ndarray:
        """Up-to-date host array (flat); does not change the head."""
        return self._to_cpu()

    def mutable_cpu(self) -> np.ndarray:
        """Up-to-date host array (flat) that the caller will write: the host becomes the head."""
        arr = self._to_cpu()
        self.head = Head.HEAD_AT_CPU
        _HOST_NEWER.add(self)
        self._wrote()
        return arr

    def set_cpu(self, array: np.ndarray) -> None:
        """Adopt ``array`` (flat, right dtype and size) as the host storage; host becomes head."""
        if array.dtype != self.dtype or array.size != self.count:
            raise ValueError(
                f"set_cpu: expected {self.count} elements of {self.dtype}, got {array.size} of {array.dtype}"
            )
        self._sync_upload()
        self._cpu = array.reshape(-1)
        self._pinned = False
        self.head = Head.HEAD_AT_CPU
        _HOST_NEWER.add(self)
        self._wrote()

    # -- storage a memory plan shares -----------------------------------------------------------
    def use_storage(self, host: np.ndarray | None = None, device: SupportsInt | None = None) -> None:
        """Drop the values; keep the next ones in ``host`` (a flat array of ``count`` elements) or at
        ``device`` (an allocation of at least ``nbytes``), storage a memory plan shares between
        objects whose values are never live together; with neither, in memory of its own again
        (allocated on first use)."""
        self._sync_upload()
        self._cpu, self._gpu, self.head, self._pinned = None, device, Head.UNINITIALIZED, False
        self._wrote()
        if host is not None:
            self.set_cpu(host)
        self.shared = host is not None or device is not None

    def relocate(self, device: SupportsInt) -> None:
        """Keep the values, from now on at ``device`` (an allocation of at least ``nbytes`` that the
        caller keeps alive, for example a slice of one buffer holding several gradients)."""
        values = self._to_gpu()  # (the old allocation stays referenced until the copy is queued)
        old = self._gpu
        if self.count:
            _backend.memcpy_dtod(int(device), values, self.nbytes)
        self._gpu, self.head, self.shared = device, Head.HEAD_AT_GPU, True
        self._wrote()
        del old

    def own_storage(self) -> None:
        """Copy the values out of shared storage (:meth:`use_storage`) into memory of its own."""
        if not self.shared:
            return
        self.shared = False
        if self._cpu is not None:
            self._sync_upload()
            self._cpu, self._pinned = self._cpu.copy(), False
        if self._gpu is not None:
            mine = _backend.alloc(max(self.nbytes, self.dtype.itemsize))
            if self.head in (Head.HEAD_AT_GPU, Head.SYNCED):
                _backend.memcpy_dtod(int(mine), int(self._gpu), self.nbytes)
            self._gpu = mine

    # -- device side ------------------------------------------------------------------------
    def _device_pointer(self) -> int:
        """The device allocation (made on first use), noted as used by a capture in progress (a
        replay uploads host writes only to memories its work uses)."""
        if self._gpu is None:
            self._gpu = _backend.alloc(max(self.nbytes, self.dtype.itemsize))
        recording = _backend.recording()
        if recording is not None:
            recording.touched.add(self)
        return int(self._gpu)

    def _to_gpu(self) -> int:
        ptr = self._device_pointer()
        if self.head is Head.UNINITIALIZED:
            _backend.memset_zero(ptr, self.nbytes)
            self.head = Head.HEAD_AT_GPU
        elif self.head is Head.HEAD_AT_CPU:
            if self.count:
                assert self._cpu is not None  # the host is the head: it holds the data
                done = _backend.memcpy_htod(ptr, self._cpu, pinned=self._pinned)
                self._upload = done if self._pinned else None
            self.head = Head.SYNCED
        return ptr

    def _written_on_device(self, ptr: int) -> int:
        """The caller writes the device copy at ``ptr``: it becomes the head (and, in a capture,
        each replay writes here again: the executor marks it afterwards)."""
        self.head = Head.HEAD_AT_GPU
        self._wrote()
        recording = _backend.recording()
        if recording is not None:
            recording.written.add(self)
        return ptr

    def gpu(self) -> int:
        """Device pointer to up-to-date data; does not change the head."""
        return self._to_gpu()

    def mutable_gpu(self) -> int:
        """Device pointer the caller will write: the device becomes the head."""
        return self._written_on_device(self._to_gpu())

    def overwritten_gpu(self) -> int:
        """Device pointer the caller overwrites whole without reading it: as :meth:`mutable_gpu`,
        but no zero fill or upload first (a fused pass whose output may share storage with one of
        its inputs, :class:`~pycaffe_lite.runtime.shared_diffs.SharedDiffs`, must not clear it
        before reading that input)."""
        return self._written_on_device(self._device_pointer())

    def _wrote(self) -> None:
        """A side was asked for to be written: count it (``version``, :func:`watched_writes`)."""
        self.version += 1
        if self.watched:
            _WATCHED_WRITES[0] += 1

    def _sync_upload(self) -> None:
        if self._upload is not None:
            self._upload.synchronize()
            self._upload = None

    def host_is_newer(self) -> bool:
        """The host copy holds values the device has not seen (uninitialized memory holds none)."""
        return self.head is Head.HEAD_AT_CPU

    def device_is_newer(self) -> bool:
        return self.head is Head.HEAD_AT_GPU

    def mark_device_newest(self) -> None:
        """Device work queued outside this object (a graph replay) wrote the device copy."""
        self.head = Head.HEAD_AT_GPU
        self._wrote()

    def newest_copy(self) -> np.ndarray:
        """A host copy (flat) of the values device work would read: the device copy when it is
        current (a host array written without asking, as pycaffe lets one keep and write
        ``blob.data``, is not what the device holds), else the host copy."""
        if self.head in (Head.HEAD_AT_GPU, Head.SYNCED) and self._gpu is not None and self.count:
            out = np.empty(self.count, self.dtype)  # a temporary: pageable
            _backend.memcpy_dtoh(out, int(self._gpu))
            return out
        return self._to_cpu().copy()

    def has_gpu(self) -> bool:
        return self._gpu is not None
