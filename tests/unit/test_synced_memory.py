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
