"""Blob and SyncedMemory: shapes, legacy accessors, sharing, protobuf round trips, head states."""

import numpy as np
import pytest

from pycaffe_lite import Blob
from pycaffe_lite.blob import proto_shape
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.synced_memory import Head, SyncedMemory


def test_construct_and_shape_properties():
    b = Blob((2, 3, 4, 5))
    assert b.shape == (2, 3, 4, 5)
    assert b.num_axes == 4
    assert b.count == 120
    assert b.dtype == np.float32
    assert b.data.shape == (2, 3, 4, 5) and b.diff.shape == (2, 3, 4, 5)
    np.testing.assert_array_equal(b.data, 0)  # fresh memory reads as zeros
    assert Blob((), np.float64).count == 1  # scalar blob
    assert Blob((3, 0)).count == 0


def test_reshape_forms_and_errors():
    b = Blob()
    b.reshape(2, 3)
    assert b.shape == (2, 3)
    b.reshape([4])
    assert b.shape == (4,)
    b.reshape((1, 2, 3))
    assert b.shape == (1, 2, 3)
    with pytest.raises(ShapeError, match="negative"):
        b.reshape(2, -1)
    with pytest.raises(ShapeError, match="axes"):
        b.reshape((1,) * 33)
    with pytest.raises(TypeError, match="float32, float64, float16 or bfloat16"):
        Blob((2,), np.int32)


def test_reshape_keeps_memory_when_shrinking_and_grows_when_needed():
    b = Blob((4, 5))
    b.data[...] = np.arange(20).reshape(4, 5)
    mem = b.data_memory
    b.reshape(2, 3)
    assert b.data_memory is mem
    np.testing.assert_array_equal(b.data.ravel(), np.arange(6))  # same storage, first elements
    b.reshape(4, 5)  # back to the capacity: still the same memory
    assert b.data_memory is mem
    b.reshape(5, 5)
    assert b.data_memory is not mem
    assert b.count == 25 and b.data.shape == (5, 5)


def test_reshape_like():
    a, b = Blob((2, 7)), Blob()
    b.reshape_like(a)
    assert b.shape == (2, 7)


def test_legacy_accessors():
    b = Blob((2, 3, 4, 5))
    assert (b.num, b.channels, b.height, b.width) == (2, 3, 4, 5)
    b = Blob((6, 7))
    assert (b.num, b.channels, b.height, b.width) == (6, 7, 1, 1)
    b = Blob((9,))
    assert (b.num, b.channels, b.height, b.width) == (9, 1, 1, 1)
    with pytest.raises(ShapeError, match="legacy"):
        _ = Blob((1, 2, 3, 4, 5)).num


def test_count_range():
    b = Blob((2, 3, 4, 5))
    assert b.count_range(0) == 120
    assert b.count_range(1) == 60
    assert b.count_range(1, 3) == 12
    assert b.count_range(2, 2) == 1
    assert b.count_range(4) == 1


def test_canonical_axis():
    b = Blob((2, 3, 4))
    assert [b.canonical_axis(a) for a in (0, 2, -1, -3)] == [0, 2, 2, 0]
    for bad in (3, -4, 10):
        with pytest.raises(ShapeError, match=f"axis {bad}") as exc:
            b.canonical_axis(bad)
        assert "(2, 3, 4)" in str(exc.value)


def test_cpu_views_are_read_only_and_mutable_views_write():
    b = Blob((2, 2))
    with pytest.raises(ValueError):
        b.cpu_data()[0, 0] = 1
    b.mutable_cpu_data()[0, 0] = 3
    b.mutable_cpu_diff()[1, 1] = 4
    assert b.cpu_data()[0, 0] == 3 and b.cpu_diff()[1, 1] == 4
    b.data = 7  # pycaffe setter
    np.testing.assert_array_equal(b.data, 7)
    b.diff = np.ones((2, 2))
    np.testing.assert_array_equal(b.cpu_diff(), 1)


def test_share_data_and_diff():
    a, b = Blob((2, 3)), Blob((3, 2))
    b.share_data(a)
    assert b.data_memory is a.data_memory
    assert b.diff_memory is not a.diff_memory
    a.data[...] = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(b.data, np.arange(6).reshape(3, 2))
    b.share_diff(a)
    b.diff[...] = 5
    np.testing.assert_array_equal(a.diff, 5)


@pytest.mark.parametrize("other", [Blob((7,)), Blob((2, 3), np.float64)])
def test_share_mismatch_errors(other):
    b = Blob((2, 3))
    with pytest.raises(ShapeError, match="cannot share"):
        b.share_data(other)
    with pytest.raises(ShapeError, match="cannot share"):
        b.share_diff(other)


# -- protobuf ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_proto_round_trip_with_shape(dtype):
    rng = np.random.default_rng(0)
    b = Blob((2, 3, 4), dtype)
    b.data[...] = rng.standard_normal((2, 3, 4))
    b.diff[...] = rng.standard_normal((2, 3, 4))
    proto = b.to_proto(write_diff=True)
    assert list(proto.shape.dim) == [2, 3, 4]
    if dtype == np.float64:
        assert len(proto.double_data) == 24 and len(proto.data) == 0 and len(proto.double_diff) == 24
    else:
        assert len(proto.data) == 24 and len(proto.double_data) == 0 and len(proto.diff) == 24
    c = Blob((), dtype)
    c.from_proto(caffe_pb2.BlobProto.FromString(proto.SerializeToString()))
    assert c.shape == (2, 3, 4)
    np.testing.assert_array_equal(c.data, b.data)
    np.testing.assert_array_equal(c.diff, b.diff)


def test_to_proto_without_diff_and_float64_precision():
    b = Blob((2,), np.float64)
    b.data[...] = [1 + 1e-12, -3.0]
    proto = b.to_proto()
    assert len(proto.double_diff) == 0
    assert proto.double_data[0] == 1 + 1e-12  # not rounded through float32
    existing = caffe_pb2.BlobProto(data=[9, 9, 9])
    b.to_proto(proto=existing)
    assert len(existing.data) == 0 and list(existing.double_data) == [1 + 1e-12, -3.0]


def test_from_proto_double_data_into_float32_blob():
    proto = caffe_pb2.BlobProto(double_data=[0.5, 1.5])
    proto.shape.dim.extend([2])
    b = Blob()
    b.from_proto(proto)
    assert b.dtype == np.float32
    np.testing.assert_array_equal(b.data, [0.5, 1.5])


def test_from_proto_legacy_4d_fields():
    proto = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=3, data=list(range(6)))
    assert proto_shape(proto) == (1, 2, 1, 3)
    b = Blob()
    b.from_proto(proto)
    assert b.shape == (1, 2, 1, 3)
    np.testing.assert_array_equal(b.data.ravel(), np.arange(6))


def test_legacy_proto_matches_lower_dim_blob_without_reshape():
    # Caffe's ShapeEquals: legacy (1, 1, 1, N) matches a blob of shape (N,); (1, 1, M, N) matches (M, N).
    bias = Blob((4,))
    bias.from_proto(caffe_pb2.BlobProto(num=1, channels=1, height=1, width=4, data=[1, 2, 3, 4]), reshape=False)
    assert bias.shape == (4,)
    np.testing.assert_array_equal(bias.data, [1, 2, 3, 4])
    w = Blob((2, 3))
    w.from_proto(caffe_pb2.BlobProto(num=1, channels=1, height=2, width=3, data=range(6)), reshape=False)
    assert w.shape == (2, 3)
    with pytest.raises(ShapeError, match="shape mismatch") as exc:
        Blob((4,)).from_proto(
            caffe_pb2.BlobProto(num=1, channels=1, height=2, width=2, data=[1, 2, 3, 4]), reshape=False,
            where="layer 'ip' param 1",
        )
    assert "layer 'ip' param 1" in str(exc.value) and "(4,)" in str(exc.value)


def test_from_proto_shape_mismatch_and_count_errors():
    proto = caffe_pb2.BlobProto(data=[1, 2, 3, 4, 5, 6])
    proto.shape.dim.extend([2, 3])
    with pytest.raises(ShapeError, match="shape mismatch"):
        Blob((3, 2)).from_proto(proto, reshape=False)
    bad = caffe_pb2.BlobProto(data=[1, 2, 3])
    bad.shape.dim.extend([2, 2])
    with pytest.raises(ShapeError, match="3 values"):
        Blob().from_proto(bad)


# -- SyncedMemory head states (CPU only) ------------------------------------------------------
def test_synced_memory_cpu_heads():
    m = SyncedMemory(4, np.float32)
    assert m.head is Head.UNINITIALIZED and not m.has_gpu()
    arr = m.cpu()
    assert m.head is Head.HEAD_AT_CPU
    np.testing.assert_array_equal(arr, 0)
    m.mutable_cpu()[:] = 2
    assert m.head is Head.HEAD_AT_CPU
    np.testing.assert_array_equal(m.cpu(), 2)
    m.set_cpu(np.ones(4, np.float32))
    assert m.head is Head.HEAD_AT_CPU and m.cpu()[0] == 1
    with pytest.raises(ValueError, match="expected 4"):
        m.set_cpu(np.ones(3, np.float32))
    assert m.nbytes == 16


def test_blob_head_transitions_on_cpu():
    b = Blob((3,))
    assert b.data_memory.head is Head.UNINITIALIZED
    b.cpu_data()
    assert b.data_memory.head is Head.HEAD_AT_CPU
    assert b.diff_memory.head is Head.UNINITIALIZED  # diff untouched


# -- GPU synchronisation ----------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_sync_host_to_device_and_back(gpu_mode, dtype):
    from pycaffe_lite.gpu import backend
    from pycaffe_lite.gpu import math_functions as gm

    b = Blob((2, 3), dtype)
    mem = b.data_memory
    b.data[...] = np.arange(6).reshape(2, 3)
    assert mem.head is Head.HEAD_AT_CPU
    ptr = b.gpu_data()
    assert mem.head is Head.SYNCED
    out = np.empty(6, dtype)
    backend.memcpy_dtoh(out, ptr)
    np.testing.assert_array_equal(out, np.arange(6))
    # mutate on the device, read on the host
    gm.set(6, 2.5, b.mutable_gpu_data(), dtype)
    assert mem.head is Head.HEAD_AT_GPU
    np.testing.assert_array_equal(b.cpu_data(), 2.5)
    assert mem.head is Head.SYNCED
    # a host write after that is seen on the device
    b.data[0, 0] = -1
    assert mem.head is Head.HEAD_AT_CPU
    backend.memcpy_dtoh(out, b.gpu_data())
    assert out[0] == -1 and out[1] == 2.5


@pytest.mark.gpu
def test_gpu_uninitialized_memory_is_zero(gpu_mode):
    from pycaffe_lite.gpu import backend

    m = SyncedMemory(5, np.float32)
    ptr = m.gpu()
    assert m.head is Head.HEAD_AT_GPU and m.has_gpu()
    out = np.full(5, 7, np.float32)
    backend.memcpy_dtoh(out, ptr)
    np.testing.assert_array_equal(out, 0)
    np.testing.assert_array_equal(m.cpu(), 0)
    assert m.head is Head.SYNCED
    m.mutable_cpu()
    assert m.head is Head.HEAD_AT_CPU


@pytest.mark.gpu
def test_gpu_shared_blobs_see_device_writes(gpu_mode):
    from pycaffe_lite.gpu import math_functions as gm

    a, b = Blob((4,)), Blob((2, 2))
    b.share_data(a)
    gm.set(4, 1.25, a.mutable_gpu_data(), np.float32)
    np.testing.assert_array_equal(b.data, 1.25)


# -- half storage (docs/precision.md) --------------------------------------------------------------
def test_half_blob_storage_types_and_item_sizes():
    h = Blob((2, 3), np.float16)
    b = Blob((2, 3), "bfloat16", diff_dtype=np.float32)
    assert h.dtype == np.float16 and h.diff_dtype == np.float16
    assert b.dtype == np.uint16 and b.diff_dtype == np.float32
    assert h.data_memory.nbytes == 12 and b.data_memory.nbytes == 12 and b.diff_memory.nbytes == 24
    assert b.data_type == caffe_pb2.BFLOAT16 and b.diff_type == caffe_pb2.FLOAT and b.is_half
    assert not Blob((2,)).is_half and repr(b) == "Blob(shape=(2, 3), dtype=bfloat16, diff_dtype=float32)"
    assert h.cpu_data().dtype == np.float16 and b.cpu_data().dtype == np.uint16


@pytest.mark.parametrize("dtype, eps", [(np.float16, 2.0 ** -11), ("bfloat16", 2.0 ** -8)])
def test_half_math_views_round_to_nearest_even(dtype, eps):
    b = Blob((5,), dtype)
    values = np.array([1.0, 1.0 + eps, 1.0 + 3 * eps, -2.5, 1e-3], np.float32)  # two exact ties
    b.set_math_data(values)
    got = b.math_data()
    assert got.dtype == np.float32
    # ties to even: 1+eps -> 1, 1+3eps -> 1+4eps
    np.testing.assert_array_equal(got[:4], [1.0, 1.0, 1.0 + 4 * eps, -2.5])
    assert abs(got[4] - 1e-3) <= 1e-3 * eps
    b.set_math_diff(np.float32(0.5))  # broadcast
    np.testing.assert_array_equal(b.math_diff(), 0.5)


def test_float_blobs_math_views_are_the_storage():
    b = Blob((3,), np.float64)
    b.data[...] = [1, 2, 3]
    assert b.math_data().dtype == np.float64
    np.testing.assert_array_equal(b.math_data(), [1, 2, 3])


@pytest.mark.parametrize("dtype, raw", [(np.float16, caffe_pb2.FLOAT16), ("bfloat16", caffe_pb2.BFLOAT16)])
def test_half_blob_proto_round_trip_raw_and_old_format(dtype, raw):
    b = Blob((2, 2), dtype)
    b.set_math_data(np.array([[0.1, -3.0], [1e4, 7.25]], np.float32))
    b.set_math_diff(np.array([[1, 2], [3, 4]], np.float32))
    proto = b.to_proto(write_diff=True)
    assert proto.raw_data_type == raw and len(proto.raw_data) == 8 and not len(proto.data)
    assert proto.raw_diff_type == raw
    c = Blob((), dtype)
    c.from_proto(proto)
    np.testing.assert_array_equal(c.cpu_data(), b.cpu_data())  # bit for bit
    np.testing.assert_array_equal(c.cpu_diff(), b.cpu_diff())
    old = b.to_proto(old_format=True)
    assert len(old.data) == 4 and not old.HasField("raw_data")
    np.testing.assert_array_equal(np.asarray(old.data, np.float32).reshape(2, 2), b.math_data())
    f = Blob((), np.float32)  # a float32 blob reads the half file exactly
    f.from_proto(proto)
    np.testing.assert_array_equal(f.cpu_data(), b.math_data())


def test_float32_proto_unchanged_by_half_support():
    b = Blob((3,))
    b.data[...] = [0.1, 0.2, 0.3]
    proto = b.to_proto()
    assert list(proto.data) == [float(np.float32(v)) for v in (0.1, 0.2, 0.3)] and not proto.HasField("raw_data")


def test_share_checks_data_and_diff_types_apart():
    a = Blob((4,), np.float16, diff_dtype=np.float32)
    b = Blob((4,), np.float16)
    b.share_data(a)
    with pytest.raises(ShapeError, match="float32"):
        b.share_diff(a)


def test_pycaffe_setters_store_float_values_in_half_storage():
    b = Blob((3,), "bfloat16")
    b.data = [1.0, -2.5, 3.0]  # values, not bit patterns
    np.testing.assert_array_equal(b.math_data(), [1.0, -2.5, 3.0])
    b.diff = 0.5
    np.testing.assert_array_equal(b.math_diff(), 0.5)
