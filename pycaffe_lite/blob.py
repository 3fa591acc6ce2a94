"""Blob: an N-d array of data and its gradient (diff), each held in a :class:`SyncedMemory`.

Shapes follow Caffe: any number of axes, with the legacy 4-d accessors ``num``, ``channels``,
``height``, ``width``. ``data`` and ``diff`` (pycaffe names) are writable numpy views of the host
copies and make the host side newest; layer code reads through ``cpu_data()`` / ``gpu_data()`` and
writes through the ``mutable_*`` variants, as in Caffe.

Storage types (docs/precision.md): data and diff each have one, float32 or float64 as in Caffe, or
a half type: float16 (numpy's), bfloat16 held as uint16 bit patterns (``dtype="bfloat16"`` or
``np.uint16``). ``cpu_data()`` & co. return the storage arrays; :meth:`Blob.math_data` /
:meth:`Blob.set_math_data` (and the diff's) read float32 (float64 for float64 blobs) values and
store them back rounded to nearest, ties to even.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from . import common, memcheck, precision
from .errors import ShapeError
from .gpu import backend
from .schema import blob_values, caffe_pb2
from .synced_memory import SyncedMemory

MAX_BLOB_AXES = 32
#: Storage dtypes a Blob takes (uint16: bfloat16 bit patterns).
STORAGE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(np.uint16))


def storage_dtype(dtype: np.dtype | type | str) -> np.dtype:
    """The host storage dtype for ``dtype`` ("bfloat16" -> uint16 bit patterns); TypeError for one
    that is no float storage."""
    dt = np.dtype(np.uint16) if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16") else np.dtype(dtype)
    if dt not in STORAGE_DTYPES:
        raise TypeError(f"Blob dtype must be float32, float64, float16 or bfloat16 (uint16 bits), got {dt}")
    return dt


def math_dtype(dtype: np.dtype) -> np.dtype:
    """What values stored in ``dtype`` are computed in: float32 for the half types, else itself."""
    return backend.math_dtype(dtype)


def to_math(values: np.ndarray) -> np.ndarray:
    """Storage array -> its math values (float32 for float16 and bfloat16 bits; others as they are)."""
    if values.dtype == np.uint16:
        return precision.bfloat16_to_float32(values)
    if values.dtype == np.float16:
        return values.astype(np.float32)
    return values


def store_math(out: np.ndarray, values: np.ndarray) -> None:
    """Write float ``values`` into storage array ``out``, rounded to nearest, ties to even."""
    if out.dtype == np.uint16:
        out[...] = precision.float32_to_bfloat16(np.broadcast_to(values, out.shape))
    else:
        out[...] = values


def _readonly(view: np.ndarray) -> np.ndarray:
    view = view.view()
    view.flags.writeable = False
    return view


def shape_generation() -> int:
    """Bumped whenever any blob changes shape (work recorded for the old shapes is stale):
    ``common.context().shape_generation``."""
    return common.context().shape_generation


class Blob:
    """Data and diff of one named value in a net. ``Blob(shape, dtype=np.float32, diff_dtype=None)``:
    ``dtype`` stores the data, ``diff_dtype`` (default: ``dtype``) the diff."""

    def __init__(self, shape: Sequence[int] = (), dtype: np.dtype | type | str = np.float32,
                 diff_dtype: np.dtype | type | str | None = None) -> None:
        self.dtype = storage_dtype(dtype)
        self.diff_dtype = self.dtype if diff_dtype is None else storage_dtype(diff_dtype)
        self._shape: tuple[int, ...] = ()
        self._count = 0
        self._capacity = 0
        self._data = SyncedMemory(0, self.dtype)  # (allocates nothing; reshape sizes it)
        self._diff = SyncedMemory(0, self.diff_dtype)
        # told of user access through the data/diff properties: on_access(blob, what), what is "data"
        # or "diff" (the getters: the user may read or write) or "set_data"/"set_diff" (the setters)
        self.on_access: Callable[[Blob, str], None] | None = None
        self.reshape(shape)

    # -- shape ------------------------------------------------------------------------------
    def reshape(self, *shape) -> None:
        """Change the shape; memory is kept when the new count fits the current capacity."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        shape = tuple(int(d) for d in shape)
        if len(shape) > MAX_BLOB_AXES:
            raise ShapeError(f"blob shape {shape} has more than {MAX_BLOB_AXES} axes")
        if any(d < 0 for d in shape):
            raise ShapeError(f"blob shape {shape} has a negative dimension")
        count = math.prod(shape)  # a 0-axis (scalar) blob holds one value, as in Caffe
        if count > self._capacity:  # refused before anything changes (memory is taken lazily)
            # in GPU mode the blob lives on the device: the host check is against the machine's memory only
            gpu = common.mode() is common.Mode.GPU
            memcheck.check_fits("", f"a blob of shape {shape} ({self.dtype.name})", count, self.dtype.itemsize,
                                limit=memcheck.host_memory_bytes() if gpu else None, device=gpu)
            if not gpu:  # (a net being built adds up its params: memcheck.net_build)
                memcheck.note_blob(shape, (count - self._capacity) * self.dtype.itemsize)
        if shape != self._shape:
            common.context().shape_generation += 1
        self._shape = shape
        self._count = count
        if count > self._capacity:
            self._capacity = count
            self._data = SyncedMemory(count, self.dtype)
            self._diff = SyncedMemory(count, self.diff_dtype)

    def reshape_like(self, other: Blob) -> None:
        self.reshape(other.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def num_axes(self) -> int:
        return len(self._shape)

    @property
    def count(self) -> int:
        return self._count

    def count_range(self, start: int, end: int | None = None) -> int:
        """Product of dimensions ``start`` (inclusive) to ``end`` (exclusive, default: last)."""
        end = self.num_axes if end is None else end
        return math.prod(self._shape[start:end])

    def canonical_axis(self, axis: int) -> int:
        """Map a possibly negative axis into ``[0, num_axes)`` with a clear error."""
        n = self.num_axes
        if not -n <= axis < n:
            raise ShapeError(f"axis {axis} out of range for a {n}-axis blob of shape {self._shape}")
        return axis + n if axis < 0 else axis

    def _legacy(self, index: int) -> int:
        if self.num_axes > 4:
            raise ShapeError(f"legacy accessor on a blob with {self.num_axes} (> 4) axes")
        if index >= self.num_axes:
            return 1
        return self._shape[index]

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    # -- host access ------------------------------------------------------------------------
    def _view(self, flat: np.ndarray) -> np.ndarray:
        return flat[: self._count].reshape(self._shape)

    def cpu_data(self) -> np.ndarray:
        """Read-only host view of the data (synced from the device if it is newer there)."""
        return _readonly(self._view(self._data.cpu()))

    def cpu_diff(self) -> np.ndarray:
        return _readonly(self._view(self._diff.cpu()))

    def mutable_cpu_data(self) -> np.ndarray:
        """Writable host view of the data; the host copy becomes the newest."""
        return self._view(self._data.mutable_cpu())

    def mutable_cpu_diff(self) -> np.ndarray:
        return self._view(self._diff.mutable_cpu())

    # -- math views (storage <-> the values computed with) ------------------------------------
    @property
    def data_type(self) -> int:
        """``caffe_pb2.Type`` of the data storage (FLOAT, DOUBLE, FLOAT16, BFLOAT16)."""
        return precision.type_of_dtype(self.dtype)

    @property
    def diff_type(self) -> int:
        return precision.type_of_dtype(self.diff_dtype)

    @property
    def is_half(self) -> bool:
        """Whether data or diff is stored in a half type."""
        return math_dtype(self.dtype) != self.dtype or math_dtype(self.diff_dtype) != self.diff_dtype

    def math_data(self) -> np.ndarray:
        """The data as math values: float32 for half storage (a new array), else the read-only
        storage view itself. A user's read like ``data`` (the net's memory plans are told, so a
        blob whose memory a later layer reused is recomputed first)."""
        self._user_access("data")
        return to_math(self.cpu_data())

    def math_diff(self) -> np.ndarray:
        """The diff as math values (see :meth:`math_data`)."""
        self._user_access("diff")
        return to_math(self.cpu_diff())

    def set_math_data(self, values: np.ndarray) -> None:
        """Store ``values`` (broadcast to the shape) as the data, rounded to the storage type."""
        store_math(self.mutable_cpu_data(), values)

    def set_math_diff(self, values: np.ndarray) -> None:
        store_math(self.mutable_cpu_diff(), values)

    # pycaffe's properties are the user's access: a net that shares memory between blobs is told
    # (``on_access``, see shared_data.SharedData and SharedDiffs); layers use the methods above.
    def _user_access(self, what: str) -> None:
        if self.on_access is not None:
            self.on_access(self, what)

    @property
    def data(self) -> np.ndarray:
        """pycaffe: writable host array of the data (marks the host copy newest): the storage
        array, so float16 in an fp16 blob and uint16 bit patterns in a bfloat16 one
        (:meth:`math_data` reads float32 values; assigning ``blob.data = values`` rounds them in)."""
        self._user_access("data")
        return self.mutable_cpu_data()

    @data.setter
    def data(self, value) -> None:
        """``blob.data = values``: float values, stored rounded to the storage type (bfloat16 too)."""
        self._user_access("set_data")
        store_math(self.mutable_cpu_data(), np.asarray(value))

    @property
    def diff(self) -> np.ndarray:
        """pycaffe: writable host array of the diff (marks the host copy newest)."""
        self._user_access("diff")
        return self.mutable_cpu_diff()

    @diff.setter
    def diff(self, value) -> None:
        self._user_access("set_diff")
        store_math(self.mutable_cpu_diff(), np.asarray(value))

    # -- device access (pointers) -----------------------------------------------------------
    def gpu_data(self) -> int:
        """Device pointer to the data, synced from the host if it is newer there."""
        return self._data.gpu()

    def gpu_diff(self) -> int:
        return self._diff.gpu()

    def mutable_gpu_data(self) -> int:
        """Device pointer to the data that the caller writes: the device copy becomes the newest."""
        return self._data.mutable_gpu()

    def mutable_gpu_diff(self) -> int:
        return self._diff.mutable_gpu()

    def overwritten_gpu_diff(self) -> int:
        """Device pointer to the diff that the caller overwrites whole without reading it
        (``SyncedMemory.overwritten_gpu``: no zero fill or upload first)."""
        return self._diff.overwritten_gpu()

    # pycaffe's names (BVLC's _caffe.cpp): the device address as an int, for handing a blob to other
    # CUDA code. As in BVLC they take the mutable pointer: the device copy becomes the newest.
    @property
    def _gpu_data_ptr(self) -> int:
        return int(self.mutable_gpu_data())

    @property
    def _gpu_diff_ptr(self) -> int:
        return int(self.mutable_gpu_diff())

    @property
    def data_memory(self) -> SyncedMemory:
        return self._data

    @property
    def diff_memory(self) -> SyncedMemory:
        return self._diff

    # -- sharing ----------------------------------------------------------------------------
    def share_data(self, other: Blob) -> None:
        """Make this blob use ``other``'s data memory (counts must match)."""
        self._check_share(other)
        self._data = other._data
        self._capacity = min(self._capacity, other._capacity) if self._capacity else other._capacity

    def share_diff(self, other: Blob) -> None:
        self._check_share(other, diff=True)
        self._diff = other._diff

    def _check_share(self, other: Blob, diff: bool = False) -> None:
        mine, theirs = (self.diff_dtype, other.diff_dtype) if diff else (self.dtype, other.dtype)
        if other.count != self.count or mine != theirs:
            raise ShapeError(
                f"cannot share memory between blobs of shape {self._shape} ({mine}) and "
                f"{other.shape} ({theirs})"
            )

    # -- protobuf ---------------------------------------------------------------------------
    def shape_equals_proto(self, proto: caffe_pb2.BlobProto) -> bool:
        """Caffe's ShapeEquals: legacy 4-d fields index from the end (a bias (N) is (1,1,1,N))."""
        legacy = ("num", "channels", "height", "width")
        if proto.HasField("shape") or not any(proto.HasField(f) for f in legacy):
            return tuple(proto.shape.dim) == self._shape
        if self.num_axes > 4:
            return False
        padded = (1,) * (4 - self.num_axes) + self._shape
        return padded == (proto.num, proto.channels, proto.height, proto.width)

    def from_proto(self, proto: caffe_pb2.BlobProto, reshape: bool = True, where: str = "blob") -> None:
        """Load from a BlobProto (``shape`` or legacy num/channels/height/width form).

        With ``reshape=False`` the proto's shape must equal this blob's (Caffe's rule for legacy
        shapes applies) and a ShapeError names ``where`` and both shapes otherwise.
        """
        if reshape:
            self.reshape(proto_shape(proto))
        elif not self.shape_equals_proto(proto):
            raise ShapeError(
                f"{where}: shape mismatch: net has {self._shape}, file has {proto_shape(proto)}"
            )
        count = self._count
        values = blob_values.read_values(proto, False, where)
        n = 0 if values is None else values.size
        if n != count:
            raise ShapeError(f"{where}: BlobProto holds {n} values but shape {self._shape} needs {count}")
        if values is not None:
            _store_read(self.mutable_cpu_data(), values.reshape(self._shape))
        dvalues = blob_values.read_values(proto, True, where)
        if dvalues is not None and dvalues.size == count:
            _store_read(self.mutable_cpu_diff(), dvalues.reshape(self._shape))

    def to_proto(self, write_diff: bool = False, proto: caffe_pb2.BlobProto | None = None,
                 raw_type: int | None = None, old_format: bool = False) -> caffe_pb2.BlobProto:
        """Serialize into a BlobProto with a ``shape`` (float32 -> data, float64 -> double_data, as
        BVLC writes), or with ``raw_type`` (a ``caffe_pb2.Type``: FLOAT16, BFLOAT16...) as NVCaffe's
        raw bytes of that type, rounded to nearest even. A half blob without ``raw_type`` goes raw
        in its own storage type (two bytes a value), or with ``old_format`` as float32 ``data``
        that BVLC reads (``blob_values.snapshot_raw_type``)."""
        proto = caffe_pb2.BlobProto() if proto is None else proto
        proto.Clear()
        proto.shape.dim.extend(self._shape)
        for diff, values, vtype in ((False, self.cpu_data(), self.data_type),
                                    (True, self.cpu_diff(), self.diff_type)):
            if diff and not write_diff:
                continue
            rtype = raw_type if raw_type is not None else blob_values.snapshot_raw_type(vtype, old_format)
            if values.dtype == np.uint16 and rtype == caffe_pb2.BFLOAT16:  # the bits as they are
                proto_field = "raw_diff" if diff else "raw_data"
                setattr(proto, f"{proto_field}_type", rtype)
                setattr(proto, proto_field, np.ascontiguousarray(values, "<u2").tobytes())
                continue
            blob_values.write_values(proto, to_math(values), diff, rtype)
        return proto

    def __repr__(self) -> str:
        diff = "" if self.diff_dtype == self.dtype else f", diff_dtype={_dtype_name(self.diff_dtype)}"
        return f"Blob(shape={self._shape}, dtype={_dtype_name(self.dtype)}{diff})"


def _dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if dtype == np.uint16 else dtype.name


def _store_read(out: np.ndarray, values: np.ndarray) -> None:
    """Values read from a file (float64, float32 or float16) into storage ``out``: one rounding
    (float64 into bfloat16 rounds through float32)."""
    if out.dtype == np.uint16:
        out[...] = precision.float32_to_bfloat16(values)
    else:
        out[...] = values.astype(out.dtype, copy=False)


def proto_shape(proto: caffe_pb2.BlobProto) -> tuple[int, ...]:
    """Shape of a BlobProto: its ``shape`` field, else the legacy 4-d fields."""
    if proto.HasField("shape"):
        return tuple(int(d) for d in proto.shape.dim)
    if proto.HasField("num") or proto.HasField("channels") or proto.HasField("height") or proto.HasField("width"):
        return (proto.num, proto.channels, proto.height, proto.width)
    n = blob_values.value_count(proto)
    return (n,) if n else ()


def weighted_sum(tops: Sequence[Blob]) -> float:
    """Σ over ``tops`` of vdot(data, diff) (loss tops hold their loss weight in the diff).

    On the GPU, device-newest data is gathered into one staging buffer and read with one sync."""
    if not tops:
        return 0.0
    on_device = [b for b in tops if b.data_memory.device_is_newer()]
    values: dict[int, np.ndarray] = {}
    if on_device:
        dtype = on_device[0].dtype
        total = sum(b.count for b in on_device)
        staging = backend.device_cache("blob.staging")  # dtype -> (device buffer, host buffer)
        have = staging.get(dtype.str)
        if have is None or have[1].size < total:
            have = staging[dtype.str] = (backend.alloc(total * dtype.itemsize), np.empty(total, dtype))
        dev, host = have
        offset = 0
        for b in on_device:
            backend.memcpy_dtod(int(dev) + offset * dtype.itemsize, b.gpu_data(), b.count * dtype.itemsize)
            offset += b.count
        backend.memcpy_dtoh(host[:total], int(dev))
        offset = 0
        for b in on_device:
            values[id(b)] = host[offset:offset + b.count]
            offset += b.count
    total_loss = 0.0
    for b in tops:
        data = values.get(id(b))
        data = b.cpu_data().ravel() if data is None else data
        total_loss += float(np.vdot(to_math(data), to_math(b.cpu_diff().ravel())))
    return total_loss
