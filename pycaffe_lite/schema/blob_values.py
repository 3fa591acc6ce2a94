"""The values of a BlobProto in every form a file may hold them (docs/precision.md).

BVLC writes float32 values in ``data``/``diff`` and float64 ones in ``double_data``/``double_diff``;
NVCaffe adds ``raw_data``/``raw_diff``: the values as little-endian bytes of ``raw_data_type``
(FLOAT16 weights at half the size). Readers take ``double_*``, then the float field, then the raw
one (NVCaffe's order), the data and the diff independently. bfloat16 has no numpy dtype: its values
travel as the uint16 bit patterns (the top half of a float32), converted here with
round-to-nearest-even.
"""

from __future__ import annotations

import numpy as np

from ..errors import PrototxtError, ShapeError
from . import caffe_pb2

#: raw Type -> the little-endian numpy dtype of its bytes (BFLOAT16: bit patterns).
RAW_DTYPES: dict[int, np.dtype] = {
    caffe_pb2.DOUBLE: np.dtype("<f8"),
    caffe_pb2.FLOAT: np.dtype("<f4"),
    caffe_pb2.FLOAT16: np.dtype("<f2"),
    caffe_pb2.BFLOAT16: np.dtype("<u2"),
}


def type_name(value: int) -> str:
    """``caffe.Type`` value -> its name (the number itself for a value the schema lacks)."""
    try:
        return caffe_pb2.Type.Name(value)
    except ValueError:
        return str(value)


# -- bfloat16 -------------------------------------------------------------------------------------
def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16, any shape) -> float32 of that shape (exact)."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"bfloat16 values travel as uint16 bit patterns, not {bits.dtype}")
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float values (any shape) -> bfloat16 bit patterns (uint16), rounded to nearest, ties to even.

    Values first become float32 (float64 input rounds once there). Infinities stay infinite, a
    finite value past bfloat16's largest rounds to infinity as IEEE rounding says, and every NaN
    stays a NaN (quiet, its sign kept)."""
    f32 = np.ascontiguousarray(values, dtype=np.float32)
    u = f32.view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds the dropped half to nearest, ties to even.
    rounded = ((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
    nan = np.isnan(f32)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return rounded


# -- reading --------------------------------------------------------------------------------------
def _raw(proto: caffe_pb2.BlobProto, diff: bool, where: str) -> np.ndarray:
    name = "raw_diff" if diff else "raw_data"
    if not proto.HasField(f"{name}_type"):
        raise PrototxtError(f"{where}: BlobProto has {name} but no {name}_type")
    raw_type = getattr(proto, f"{name}_type")
    dtype = RAW_DTYPES.get(raw_type)
    if dtype is None:
        raise PrototxtError(f"{where}: BlobProto {name}_type {type_name(raw_type)} is not a float type "
                            "(expected FLOAT16, BFLOAT16, FLOAT or DOUBLE)")
    raw = getattr(proto, name)
    if len(raw) % dtype.itemsize:
        raise ShapeError(f"{where}: BlobProto {name} holds {len(raw)} bytes, not a whole number of "
                         f"{type_name(raw_type)} values ({dtype.itemsize} bytes each)")
    values = np.frombuffer(raw, dtype)
    if raw_type == caffe_pb2.BFLOAT16:
        return bfloat16_to_float32(values)
    return values


def read_values(proto: caffe_pb2.BlobProto, diff: bool = False, where: str = "blob") -> np.ndarray | None:
    """The data (or diff) of ``proto`` as a flat array, None where it holds none.

    float64 from ``double_*``, float32 from ``data``/``diff``, else ``raw_*`` in its own type
    (FLOAT16 as float16, BFLOAT16 as float32; read-only views of the message's bytes). A raw field
    without its type, of a type that is not a float, or of a length that is not a whole number of
    values is an error naming ``where``."""
    doubles = proto.double_diff if diff else proto.double_data
    if len(doubles):
        return np.asarray(doubles, np.float64)
    floats = proto.diff if diff else proto.data
    if len(floats):
        return np.asarray(floats, np.float32)
    if proto.HasField("raw_diff" if diff else "raw_data"):
        return _raw(proto, diff, where)
    return None


def value_count(proto: caffe_pb2.BlobProto) -> int:
    """How many data values ``proto`` holds, in whichever field holds them."""
    n = len(proto.double_data) or len(proto.data)
    if n or not proto.HasField("raw_data"):
        return n
    dtype = RAW_DTYPES.get(proto.raw_data_type)
    return len(proto.raw_data) // dtype.itemsize if dtype is not None else 0


# -- writing --------------------------------------------------------------------------------------
def write_values(proto: caffe_pb2.BlobProto, values: np.ndarray, diff: bool = False,
                 raw_type: int | None = None) -> None:
    """Store ``values`` (flattened) as ``proto``'s data (or diff), replacing what it held there.

    ``raw_type`` None: BVLC's form, float64 arrays in ``double_*`` and any other in the float
    field (as float32), byte for byte what BVLC writes. Otherwise the raw field in that Type
    (FLOAT16, BFLOAT16, FLOAT or DOUBLE): values are rounded to it to nearest, ties to even."""
    flat = np.asarray(values).ravel()
    double, single, raw = (("double_diff", "diff", "raw_diff") if diff else ("double_data", "data", "raw_data"))
    for name in (double, single, raw, f"{raw}_type"):
        proto.ClearField(name)
    if raw_type is None:
        if flat.dtype == np.float64:
            getattr(proto, double).extend(flat.tolist())
        else:
            getattr(proto, single).extend(flat.astype(np.float32, copy=False).tolist())
        return
    dtype = RAW_DTYPES.get(raw_type)
    if dtype is None:
        raise ValueError(f"cannot store blob values raw as {type_name(raw_type)}: "
                         "expected FLOAT16, BFLOAT16, FLOAT or DOUBLE")
    stored = float32_to_bfloat16(flat) if raw_type == caffe_pb2.BFLOAT16 else flat.astype(dtype)
    setattr(proto, f"{raw}_type", raw_type)
    setattr(proto, raw, stored.tobytes())


def store_raw(net: caffe_pb2.NetParameter, raw_type: int | None, diff: bool = False) -> None:
    """Rewrite every layer blob of ``net`` (a ``.caffemodel``'s NetParameter) in place: raw in
    ``raw_type`` (FLOAT16 halves a float32 file), or with None back to BVLC's float fields (float64
    values stay in ``double_*``, all others become float32 ``data``: what BVLC reads, and what
    NVCaffe's ``store_blobs_in_old_format`` writes). The diff, where present, only with ``diff``."""
    for layer in net.layer:
        for i, blob in enumerate(layer.blobs):
            where = f"layer '{layer.name}' blob {i}"
            parts = [False, True] if diff else [False]
            for is_diff in parts:
                values = read_values(blob, is_diff, where)
                if values is not None:
                    write_values(blob, values, is_diff, raw_type)


def snapshot_raw_type(storage_type: int, old_format: bool) -> int | None:
    """How a snapshot stores a blob kept in ``storage_type`` (a ``caffe.Type``): None for BVLC's
    float fields, else the raw Type. float32 and float64 blobs always take BVLC's fields, so our
    fp32 files stay byte-identical to BVLC's; half blobs (FLOAT16, BFLOAT16) go raw at two bytes a
    value unless ``old_format`` (SolverParameter.store_blobs_in_old_format) asks for float32
    ``data`` that BVLC reads. (NVCaffe writes even float32 blobs raw when the flag is off.)"""
    if old_format or storage_type in (caffe_pb2.FLOAT, caffe_pb2.DOUBLE):
        return None
    if storage_type not in RAW_DTYPES:
        raise ValueError(f"blobs are stored as FLOAT16, BFLOAT16, FLOAT or DOUBLE, not {type_name(storage_type)}")
    return storage_type
