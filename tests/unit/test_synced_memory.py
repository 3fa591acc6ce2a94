"""SyncedMemory's host-side bookkeeping that needs no GPU."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from pycaffe_lite.synced_memory import SyncedMemory, forget_host_newer, host_newer_memories


def test_host_writes_are_listed_for_the_next_replay_and_forgotten_with_the_memory():
    """A CUDA-graph replay uploads only memories listed here (host copy made the head), not every
    memory of the net; the list holds them weakly."""
    mem = SyncedMemory(4, np.float32)
    mem.mutable_cpu()[...] = 1.0
    assert any(m is mem for m in host_newer_memories())
    forget_host_newer(mem)
    assert not any(m is mem for m in host_newer_memories())
    mem.set_cpu(np.zeros(4, np.float32))
    assert any(m is mem for m in host_newer_memories())
    ref = weakref.ref(mem)
    del mem
    gc.collect()
    assert ref() is None


class _FakeDevice:
    """The backend calls SyncedMemory makes for its device side, on host bytes: allocations are
    numpy buffers addressed by their pointers; every call is logged."""

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}
        self.calls: list[str] = []
        self.capture = None

    def alloc(self, nbytes):
        buf = np.full(nbytes, 0x7F, np.uint8)
        self.buffers[buf.ctypes.data] = buf
        self.calls.append("alloc")
        return buf.ctypes.data

    def memset_zero(self, ptr, nbytes):
        self.buffers[ptr][:nbytes] = 0
        self.calls.append("memset")

    def memcpy_htod(self, ptr, host, pinned=False):
        self.buffers[ptr][:host.nbytes] = host.view(np.uint8).ravel()
        self.calls.append("htod")

    def recording(self):
        return self.capture

    def pinned_array(self, count, dtype, zero):  # config.pin_host off: pageable host copies
        return None


def test_device_pointers_by_intent(monkeypatch):
    """``gpu()`` fills or uploads first and keeps the head; ``mutable_gpu()`` as well, then the device
    is the head; ``overwritten_gpu()`` neither fills nor uploads; inside a capture every pointer
    taken is recorded as touched and the two writers' memories as written."""
    import types

    from pycaffe_lite import synced_memory

    dev = _FakeDevice()
    monkeypatch.setattr(synced_memory, "_backend", dev)
    monkeypatch.setattr(synced_memory.config, "pin_host", False)
    fresh = SyncedMemory(4, np.float32)
    fresh.gpu()
    assert dev.calls == ["alloc", "memset"] and fresh.head.name == "HEAD_AT_GPU"
    host, reader, over = (SyncedMemory(4, np.float32) for _ in range(3))
    for mem, value in ((host, 3.0), (reader, 1.0), (over, 7.0)):
        mem.mutable_cpu()[...] = value  # host writes before the capture starts
    dev.capture = types.SimpleNamespace(written=set(), touched=set())
    dev.calls.clear()
    version = host.version
    host.mutable_gpu()
    assert dev.calls == ["alloc", "htod"] and host.head.name == "HEAD_AT_GPU" and host.version == version + 1
    assert host in dev.capture.written and host in dev.capture.touched
    reader.gpu()
    assert reader.head.name == "SYNCED" and reader in dev.capture.touched and reader not in dev.capture.written
    dev.calls.clear()
    version = over.version
    ptr = over.overwritten_gpu()
    assert dev.calls == ["alloc"] and (dev.buffers[ptr] == 0x7F).all()  # neither filled nor uploaded
    assert over.head.name == "HEAD_AT_GPU" and over.version == version + 1
    assert over in dev.capture.written and over in dev.capture.touched
