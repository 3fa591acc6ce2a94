"""Storage and math types of layers: NVCaffe's rule, as one pure function (docs/precision.md).

A layer has four types (``caffe_pb2.Type``): ``forward_type`` stores its tops' data,
``backward_type`` their diffs, ``forward_math``/``backward_math`` say what its computation runs in.
:func:`layer_precision` gives them from the NetParameter's defaults and the layer's own fields the
way NVCaffe 0.17's ``Net::Init`` does, plus this project's rules: data layers stay in float32 and
BatchNorm's running statistics in float32. :func:`storage_dtype` maps a Type to the numpy dtype of
host arrays (bfloat16: uint16 bit patterns, see ``proto.blob_values``). :func:`apply_precision`
is the user's switch (``--precision``, ``caffe.set_precision``) as a NetParameter rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import NetError
from .schema import caffe_pb2
from .schema.blob_values import bfloat16_to_float32, float32_to_bfloat16, type_name

__all__ = [
    "DOUBLE", "FLOAT", "FLOAT16", "BFLOAT16", "HALF_TYPES", "FLOAT_TYPES", "DATA_LAYER_TYPES",
    "STATISTICS_LAYER_TYPES", "LayerPrecision", "layer_precision", "storage_dtype", "type_of_dtype",
    "kernel_math_type", "to_float32", "from_float32", "bfloat16_to_float32", "float32_to_bfloat16",
    "type_name", "PRECISIONS", "HALF_PRECISIONS", "ADAPTIVE_INITIAL_SCALE", "check_precision_name",
    "type_fields", "apply_precision",
]

DOUBLE, FLOAT, FLOAT16, BFLOAT16 = caffe_pb2.DOUBLE, caffe_pb2.FLOAT, caffe_pb2.FLOAT16, caffe_pb2.BFLOAT16
HALF_TYPES = frozenset({FLOAT16, BFLOAT16})
FLOAT_TYPES = frozenset({DOUBLE, FLOAT, FLOAT16, BFLOAT16})  # INT, UINT and BOOL hold no layer's values

#: Layer types that read data from outside the net: their tops stay float32 (or float64 in a
#: float64 net) whatever the net's defaults; a layer with a ``transform_param`` counts too (NVCaffe).
DATA_LAYER_TYPES = frozenset({"Data", "ImageData", "HDF5Data", "MemoryData", "WindowData", "DummyData", "Input",
                              "AnnotatedData", "VideoData"})
#: Layer types whose running statistics (mean, variance, moving-average factor) stay float32.
STATISTICS_LAYER_TYPES = frozenset({"BatchNorm", "BN"})

_DTYPES: dict[int, np.dtype] = {
    DOUBLE: np.dtype(np.float64),
    FLOAT: np.dtype(np.float32),
    FLOAT16: np.dtype(np.float16),
    BFLOAT16: np.dtype(np.uint16),  # bit patterns: numpy has no bfloat16
}


@dataclass(frozen=True)
class LayerPrecision:
    """A layer's types (``caffe_pb2.Type`` values).

    ``statistics_type`` is the storage of running statistics (BatchNorm's mean and variance) and
    None for layers that keep none. ``note`` says why a type the file asked for was replaced (a
    half type on a data layer), None when nothing was."""

    forward_type: int
    backward_type: int
    forward_math: int
    backward_math: int
    statistics_type: int | None = None
    note: str | None = None

    @property
    def is_half(self) -> bool:
        """Whether any of the four types is FLOAT16 or BFLOAT16."""
        return bool(HALF_TYPES & {self.forward_type, self.backward_type, self.forward_math, self.backward_math})


def is_data_layer(layer: caffe_pb2.LayerParameter) -> bool:
    """A layer whose tops come from outside the net (by type, or NVCaffe's test: a transform_param)."""
    return layer.type in DATA_LAYER_TYPES or layer.HasField("transform_param")


def _check(value: int, field: str, where: str) -> int:
    if value not in FLOAT_TYPES:
        raise NetError(f"{where}: {field} {type_name(value)} is not a float type "
                       "(expected FLOAT16, BFLOAT16, FLOAT or DOUBLE)")
    return value


def layer_precision(net: caffe_pb2.NetParameter, layer: caffe_pb2.LayerParameter,
                    fallback: int = FLOAT) -> LayerPrecision:
    """The storage and math types of ``layer`` in ``net``.

    NVCaffe's rule: a storage type the layer does not set is the net's ``default_forward_type`` /
    ``default_backward_type``; a math type the layer does not set is the layer's own storage type
    where it sets that, else the net's ``default_*_math``, else the net's ``default_*_type``. A
    default the file leaves out is ``fallback`` (FLOAT; DOUBLE for a float64 net: NVCaffe's
    tests do the same). Then this project's rules: a data layer's types that would be half are
    FLOAT (``note`` says so when the layer itself asked for half; NVCaffe only made their
    backward type FLOAT), and BatchNorm's statistics are stored in FLOAT when its storage is half
    (else in its storage type). A type that is not a float type (INT, UINT, BOOL) is a NetError
    naming the layer.
    """
    where = f"layer '{layer.name}' ({layer.type})"
    _check(fallback, "fallback type", where)

    def net_default(field: str) -> int:
        return _check(getattr(net, field), field, f"net '{net.name}'") if net.HasField(field) else fallback

    def own(field: str) -> int | None:
        return _check(getattr(layer, field), field, where) if layer.HasField(field) else None

    default_ftype, default_btype = net_default("default_forward_type"), net_default("default_backward_type")
    default_fmath = (net_default("default_forward_math") if net.HasField("default_forward_math")
                     else default_ftype)
    default_bmath = (net_default("default_backward_math") if net.HasField("default_backward_math")
                     else default_btype)
    own_ftype, own_btype = own("forward_type"), own("backward_type")
    own_fmath, own_bmath = own("forward_math"), own("backward_math")
    ftype = default_ftype if own_ftype is None else own_ftype
    btype = default_btype if own_btype is None else own_btype
    fmath = own_fmath if own_fmath is not None else own_ftype if own_ftype is not None else default_fmath
    bmath = own_bmath if own_bmath is not None else own_btype if own_btype is not None else default_bmath

    note = None
    if is_data_layer(layer):
        asked = [f for f, v in (("forward_type", own_ftype), ("backward_type", own_btype),
                                ("forward_math", own_fmath), ("backward_math", own_bmath)) if v in HALF_TYPES]
        if asked:
            note = f"{where}: data layers stay in FLOAT; its {', '.join(asked)} ignored"
        ftype, btype = (FLOAT if t in HALF_TYPES else t for t in (ftype, btype))
        fmath, bmath = ftype, btype
    statistics = None
    if layer.type in STATISTICS_LAYER_TYPES:
        statistics = FLOAT if ftype in HALF_TYPES else ftype
    return LayerPrecision(ftype, btype, fmath, bmath, statistics, note)


def kernel_math_type(storage: int) -> int:
    """The type a kernel computes and accumulates in for values stored in ``storage``: FLOAT for
    the half types, else the storage type itself (the ``Mtype`` of the kernel prelude)."""
    _check(storage, "storage type", "kernel")
    return FLOAT if storage in HALF_TYPES else storage


def storage_dtype(value: int) -> np.dtype:
    """numpy dtype of host arrays holding ``value``'s values (BFLOAT16: uint16 bit patterns)."""
    dtype = _DTYPES.get(value)
    if dtype is None:
        raise ValueError(f"no float storage for {type_name(value)} (expected FLOAT16, BFLOAT16, FLOAT or DOUBLE)")
    return dtype


def type_of_dtype(dtype: np.dtype | type | str) -> int:
    """``caffe_pb2.Type`` of host arrays of ``dtype`` (uint16 reads as BFLOAT16 bit patterns)."""
    dtype = np.dtype(dtype)
    for value, known in _DTYPES.items():
        if known == dtype:
            return value
    raise ValueError(f"no Type stores {dtype} (expected float16, uint16 bfloat16 bits, float32 or float64)")


def to_float32(values: np.ndarray, value_type: int) -> np.ndarray:
    """Host storage array of ``value_type`` -> float32 values (exact for the half types)."""
    if value_type == BFLOAT16:
        return bfloat16_to_float32(values)
    return np.asarray(values, storage_dtype(value_type)).astype(np.float32)


def from_float32(values: np.ndarray, value_type: int) -> np.ndarray:
    """Float values -> host storage array of ``value_type`` (rounded to nearest, ties to even)."""
    if value_type == BFLOAT16:
        return float32_to_bfloat16(values)
    return np.asarray(values).astype(storage_dtype(value_type))


# -- the user's switch: --precision / caffe.set_precision ------------------------------------------
#: The names ``--precision`` and ``caffe.set_precision`` take: exact float32, float32 with TF32
#: tensor cores allowed, and the two half types (storage half, math float32).
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
#: The half names and the storage type each asks for.
HALF_PRECISIONS = {"fp16": FLOAT16, "bf16": BFLOAT16}
#: The loss scale an fp16 net starts from when the switch turns adaptive scaling on
#: (PyTorch AMP's ``GradScaler`` starts at 2**16 too).
ADAPTIVE_INITIAL_SCALE = 65536.0

_NET_TYPE_FIELDS = ("default_forward_type", "default_backward_type", "default_forward_math", "default_backward_math")
_LAYER_TYPE_FIELDS = ("forward_type", "backward_type", "forward_math", "backward_math")


def check_precision_name(name: str | None) -> str | None:
    """``name`` lower-cased if it is one of :data:`PRECISIONS` (None: the file decides), else a
    ValueError listing the four."""
    if name is None:
        return None
    if isinstance(name, str) and name.strip().lower() in PRECISIONS:
        return name.strip().lower()
    raise ValueError(f"unknown precision {name!r}: expected one of {', '.join(PRECISIONS)}")


def type_fields(net: caffe_pb2.NetParameter) -> list[tuple[str, int]]:
    """The type fields ``net`` sets itself, as (where, Type) pairs: the four net defaults
    (``default_forward_type`` ...), then every layer's ``forward_type`` ... (``layer 'x'
    forward_type``), phase rules ignored. Empty for a file that leaves the types to the runtime."""
    found = [(f, getattr(net, f)) for f in _NET_TYPE_FIELDS if net.HasField(f)]
    for layer in net.layer:
        found += [(f"layer '{layer.name}' {f}", getattr(layer, f)) for f in _LAYER_TYPE_FIELDS if layer.HasField(f)]
    return found


def apply_precision(net: caffe_pb2.NetParameter, name: str | None, dtype: np.dtype | type = np.float32,
                    source: str | None = None) -> caffe_pb2.NetParameter:
    """``net`` as the precision switch ``name`` builds it (a copy; ``net`` is not changed).

    - None, ``fp32``, ``tf32``: the types the file says (TF32 is a runtime setting, not a type).
    - ``fp16`` / ``bf16`` on a file that sets none of the type fields (:func:`type_fields`): the
      net's ``default_forward_type`` and ``default_backward_type`` become FLOAT16 / BFLOAT16 and
      ``default_forward_math`` / ``default_backward_math`` FLOAT, so every layer stores its values
      in half and computes in float32 under :func:`layer_precision`'s rule (data layers, losses,
      BatchNorm statistics and layers without a half path stay float32 as always). ``fp16``
      also turns adaptive loss scaling on, from :data:`ADAPTIVE_INITIAL_SCALE`, unless the file
      sets ``global_grad_scale`` or ``global_grad_scale_adaptive`` itself.
    - A file that sets type fields keeps them, and the name must agree with them: ``fp16`` /
      ``bf16`` need FLOAT16 / BFLOAT16 among them and not the other half type; ``fp32`` /
      ``tf32`` need no half type. A name that contradicts the file is a NetError naming the file
      (``source``, else the net's name) and the fields.
    - ``fp16`` / ``bf16`` on a float64 net (``dtype``) is a NetError: half storage computes in
      float32, which a float64 net exists to avoid.
    An unknown name is a ValueError listing :data:`PRECISIONS`.
    """
    name = check_precision_name(name)
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    if name is None:
        return out
    where = source or f"net '{net.name}'"
    if name in HALF_PRECISIONS and np.dtype(dtype) == np.float64:
        raise NetError(f"{where}: precision {name} on a float64 net (dtype float64): half storage computes in "
                       "float32; build the net in float32, or leave the precision unset")
    fields = type_fields(net)
    if name not in HALF_PRECISIONS:
        half = [f"{f}: {type_name(v)}" for f, v in fields if v in HALF_TYPES]
        if half:
            raise NetError(f"{where}: precision {name} asks for float32, but the file sets {', '.join(half)}; "
                           "the file's types decide (leave the precision unset, or remove the fields)")
        return out
    want = HALF_PRECISIONS[name]
    if fields:
        other = [f"{f}: {type_name(v)}" for f, v in fields if v in HALF_TYPES and v != want]
        if other or not any(v == want for _, v in fields):
            said = ", ".join(other or [f"{f}: {type_name(v)}" for f, v in fields])
            raise NetError(f"{where}: precision {name} asks for {type_name(want)}, but the file sets {said}; "
                           "the file's types decide (leave the precision unset, or remove the fields)")
        return out
    out.default_forward_type = out.default_backward_type = want
    out.default_forward_math = out.default_backward_math = FLOAT
    if want == FLOAT16 and not out.HasField("global_grad_scale") and not out.HasField("global_grad_scale_adaptive"):
        out.global_grad_scale = ADAPTIVE_INITIAL_SCALE
        out.global_grad_scale_adaptive = True
    return out
