"""SyncedMemory head transitions across host and device, and Blob-level syncing."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.synced_memory import Head, SyncedMemory

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_mode")]

DTYPES = [np.float32, np.float64]


def device_values(mem: SyncedMemory) -> np.ndarray:
    """Read the device copy without going through (and changing) the SyncedMemory."""
    out = np.empty(mem.count, mem.dtype)
    backend.memcpy_dtoh(out, int(mem._gpu))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_first_use_is_zeroed_and_at_gpu(dtype):
    mem = SyncedMemory(10, dtype)
    assert mem.head is Head.UNINITIALIZED and not mem.has_gpu()
    ptr = mem.gpu()
    assert ptr and mem.has_gpu()
    assert mem.head is Head.HEAD_AT_GPU
    np.testing.assert_array_equal(device_values(mem), np.zeros(10, dtype))
    host = mem.cpu()
    assert mem.head is Head.SYNCED
    np.testing.assert_array_equal(host, np.zeros(10, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mutable_gpu_from_uninitialized(dtype):
    mem = SyncedMemory(6, dtype)
    ptr = mem.mutable_gpu()
    assert mem.head is Head.HEAD_AT_GPU
    gm.set(6, 3.0, ptr, dtype)
    np.testing.assert_array_equal(mem.cpu(), np.full(6, 3.0, dtype))
    assert mem.head is Head.SYNCED


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_write_then_gpu_read_syncs(dtype):
    mem = SyncedMemory(8, dtype)
    arr = mem.mutable_cpu()
    assert mem.head is Head.HEAD_AT_CPU
    arr[:] = np.arange(8)
    ptr = mem.gpu()
    assert mem.head is Head.SYNCED
    np.testing.assert_array_equal(device_values(mem), np.arange(8, dtype=dtype))
    # a second read copies nothing and returns the same pointer
    assert mem.gpu() == ptr and mem.head is Head.SYNCED


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_write_then_cpu_read_syncs(dtype):
    mem = SyncedMemory(5, dtype)
    mem.mutable_cpu()[:] = 1.0
    ptr = mem.mutable_gpu()
    assert mem.head is Head.HEAD_AT_GPU
    gm.scale(5, 4.0, ptr, ptr, dtype)
    host = mem.cpu()
    assert mem.head is Head.SYNCED
    np.testing.assert_array_equal(host, np.full(5, 4.0, dtype))


def test_cpu_read_while_synced_does_not_copy_back(monkeypatch):
    mem = SyncedMemory(4, np.float32)
    mem.mutable_cpu()[:] = 2.0
    mem.gpu()
    assert mem.head is Head.SYNCED
    calls = []
    monkeypatch.setattr(backend, "memcpy_dtoh", lambda *a: calls.append(a))
    monkeypatch.setattr(backend, "memcpy_htod", lambda *a: calls.append(a))
    mem.cpu()
    mem.gpu()
    assert calls == []  # synced: neither direction copies


def test_mutable_cpu_after_gpu_write_marks_cpu_head_and_next_gpu_read_uploads():
    mem = SyncedMemory(3, np.float64)
    gm.set(3, 7.0, mem.mutable_gpu(), np.float64)
    arr = mem.mutable_cpu()  # downloads, then the host is the head
    assert mem.head is Head.HEAD_AT_CPU
    np.testing.assert_array_equal(arr, [7.0, 7.0, 7.0])
    arr[1] = -1.0
    mem.gpu()
    assert mem.head is Head.SYNCED
    np.testing.assert_array_equal(device_values(mem), [7.0, -1.0, 7.0])


def test_set_cpu_makes_the_host_head_and_uploads_on_gpu_read():
    mem = SyncedMemory(4, np.float32)
    mem.gpu()
    mem.set_cpu(np.array([1, 2, 3, 4], np.float32))
    assert mem.head is Head.HEAD_AT_CPU
    mem.gpu()
    np.testing.assert_array_equal(device_values(mem), [1, 2, 3, 4])


def test_zero_count_memory():
    mem = SyncedMemory(0, np.float32)
    assert mem.gpu()  # a valid (1-element) allocation so the pointer is never null
    assert mem.cpu().shape == (0,)
    mem.mutable_gpu()
    assert mem.cpu().shape == (0,)


@pytest.mark.parametrize("dtype", DTYPES)
def test_blob_data_and_diff_roundtrip_through_device(dtype):
    b = Blob((2, 3), dtype)
    b.data[...] = np.arange(6).reshape(2, 3)
    gm.scale(6, 2.0, b.gpu_data(), b.mutable_gpu_diff(), dtype)
    np.testing.assert_array_equal(b.cpu_diff(), 2 * np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(b.cpu_data(), np.arange(6).reshape(2, 3))
    # the pycaffe view makes the host newest again, and the device sees the change
    b.data[0, 0] = 100
    out = np.empty(6, dtype)
    backend.memcpy_dtoh(out, b.gpu_data())
    assert out[0] == 100


def test_blob_reshape_within_capacity_keeps_device_memory():
    b = Blob((4, 5), np.float32)
    ptr = b.mutable_gpu_data()
    b.reshape((2, 5))
    assert b.gpu_data() == ptr
    b.reshape((5, 5))  # grows: new memory
    gm.set(25, 1.0, b.mutable_gpu_data(), np.float32)
    np.testing.assert_array_equal(b.cpu_data(), np.ones((5, 5), np.float32))


def test_shared_data_sees_device_writes():
    a, b = Blob((3,), np.float64), Blob((3,), np.float64)
    b.share_data(a)
    gm.set(3, 5.0, a.mutable_gpu_data(), np.float64)
    np.testing.assert_array_equal(b.cpu_data(), [5.0, 5.0, 5.0])


@pytest.mark.parametrize("head", ["cpu", "gpu"])
def test_relocate_keeps_values_at_the_new_address(head):
    mem = SyncedMemory(5, np.float32)
    mem.mutable_cpu()[:] = np.arange(5)
    if head == "gpu":
        mem.mutable_gpu()
    buf = backend.alloc(64 * 4)
    backend.memset_zero(int(buf), 64 * 4)
    mem.relocate(int(buf) + 16 * 4)
    assert mem.gpu() == int(buf) + 16 * 4 and mem.head is Head.HEAD_AT_GPU
    whole = np.empty(64, np.float32)
    backend.memcpy_dtoh(whole, int(buf))
    np.testing.assert_array_equal(whole[16:21], np.arange(5))
    assert not whole[:16].any() and not whole[21:].any()
    np.testing.assert_array_equal(mem.cpu(), np.arange(5))


def _spin_then(mem: SyncedMemory) -> None:
    """Keep the stream busy (a long memset chain) so an upload queued next is still pending."""
    scratch = backend.alloc(256 << 20)
    for _ in range(20):
        backend.memset_zero(int(scratch), 256 << 20)
    mem.gpu()


def test_large_host_copies_are_page_locked_and_small_ones_not():
    big = SyncedMemory(backend.PIN_MIN_BYTES // 4, np.float32)
    small = SyncedMemory(backend.PIN_MIN_BYTES // 4 - 1, np.float32)
    big.cpu(), small.cpu()
    assert big._pinned and not small._pinned
    from pycaffe_lite import using_config
    with using_config(pin_host=False):
        off = SyncedMemory(backend.PIN_MIN_BYTES // 4, np.float32)
        off.cpu()
    assert not off._pinned


@pytest.mark.parametrize("dtype", DTYPES)
def test_page_locked_round_trip_and_write_after_upload(dtype):
    """An upload from page-locked memory is asynchronous: a host write through the API after it waits
    until the copy has read the old values, so the device holds exactly what was there at upload."""
    n = backend.PIN_MIN_BYTES // np.dtype(dtype).itemsize * 3
    mem = SyncedMemory(n, dtype)
    first = np.arange(n, dtype=dtype)
    mem.mutable_cpu()[...] = first
    assert mem._pinned
    _spin_then(mem)  # upload queued behind ~5 GiB of memsets
    mem.mutable_cpu()[...] = -1  # must not reach the queued copy
    np.testing.assert_array_equal(device_values(mem), first)
    mem.gpu()  # the new values go up
    np.testing.assert_array_equal(device_values(mem), np.full(n, -1, dtype))
    ptr = mem.mutable_gpu()
    gm.scale(n, 2.0, ptr, ptr, dtype)
    np.testing.assert_array_equal(mem.cpu(), np.full(n, -2, dtype))  # downloaded into the pinned copy


def test_overwritten_gpu_neither_clears_nor_uploads_shared_storage():
    """A memory pointed into storage another memory holds values in (a gradient memory plan) is
    UNINITIALIZED: ``mutable_gpu`` zero-fills it, ``overwritten_gpu`` leaves the values for the
    writer that reads them first, and the device becomes the head."""
    holder = SyncedMemory(6, np.float32)
    holder.mutable_cpu()[...] = np.arange(6, dtype=np.float32)
    slot = holder.gpu()
    mem = SyncedMemory(6, np.float32)
    mem.mutable_cpu()[...] = 7.0  # a host copy that must not be uploaded over the slot
    mem.use_storage(device=slot)
    assert mem.head is Head.UNINITIALIZED
    assert mem.overwritten_gpu() == slot and mem.head is Head.HEAD_AT_GPU
    np.testing.assert_array_equal(device_values(holder), np.arange(6))
    other = SyncedMemory(6, np.float32)
    other.use_storage(device=slot)
    other.mutable_gpu()
    assert not device_values(holder).any()  # what the plain accessor does
