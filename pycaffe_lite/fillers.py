"""Weight fillers with Caffe's semantics (``FillerParameter.type``)."""

from __future__ import annotations

import math

import numpy as np

from . import common
from .blob import Blob
from .errors import NetError
from .schema import caffe_pb2

VarianceNorm = caffe_pb2.FillerParameter


def _uniform(rng: np.random.Generator, lo: float, hi: float, shape, dt: np.dtype,
             out: np.ndarray | None = None) -> np.ndarray:
    """Uniform in [lo, hi) drawn directly in ``dt`` (float32 or float64), into ``out`` when given."""
    out = np.empty(shape, dt) if out is None else out
    rng.random(out=out, dtype=out.dtype)
    out *= out.dtype.type(hi - lo)
    out += out.dtype.type(lo)
    return out


def _normal(rng: np.random.Generator, mean: float, std: float, shape, dt: np.dtype,
            out: np.ndarray | None = None) -> np.ndarray:
    out = np.empty(shape, dt) if out is None else out
    rng.standard_normal(out=out, dtype=out.dtype)
    out *= out.dtype.type(std)
    out += out.dtype.type(mean)
    return out


def _fans(blob: Blob) -> tuple[int, int]:
    """Caffe's fan_in = count / shape[0], fan_out = count / shape[1]."""
    if blob.num_axes == 0 or blob.count == 0:
        raise NetError(f"filler: cannot compute fan-in of a blob of shape {blob.shape}")
    fan_in = blob.count // blob.shape[0]
    fan_out = blob.count // blob.shape[1] if blob.num_axes > 1 else blob.count
    return fan_in, fan_out


def _norm(param: caffe_pb2.FillerParameter, blob: Blob) -> float:
    fan_in, fan_out = _fans(blob)
    if param.variance_norm == VarianceNorm.AVERAGE:
        return (fan_in + fan_out) / 2.0
    if param.variance_norm == VarianceNorm.FAN_OUT:
        return float(fan_out)
    return float(fan_in)


def fill(blob: Blob, param: caffe_pb2.FillerParameter | None, where: str = "") -> None:
    """Fill ``blob``'s data according to ``param`` (default: constant 0), drawing in the blob's
    dtype (no float64 copy of a float32 blob). Errors start with ``where`` when given (a layer's
    set-up adds the layer's name itself)."""
    try:
        _fill(blob, param if param is not None else caffe_pb2.FillerParameter())
    except NetError as exc:
        raise (NetError(f"{where}: {exc}") if where else exc) from None


def _fill(blob: Blob, param: caffe_pb2.FillerParameter) -> None:
    rng = common.rng()
    # half blobs (float16, bfloat16 bits) draw in float32 and store rounded, as a host half layer's
    # float32 params are stored: the same draws and values whichever mode built the net
    half = np.dtype(blob.dtype).itemsize == 2
    dt = (np.dtype(np.float32) if half else
          np.dtype(blob.dtype) if np.dtype(blob.dtype).kind == "f" else np.dtype(np.float64))
    shape = blob.shape
    kind = param.type
    # float blobs are drawn straight into their host array: no full-size temporary
    into = (blob.mutable_cpu_data() if dt == blob.dtype and kind in ("uniform", "gaussian", "xavier", "msra")
            else None)
    if kind == "constant":
        if half:
            blob.set_math_data(np.full(shape, param.value, np.float32))
        else:
            blob.mutable_cpu_data()[...] = param.value
        return
    if kind == "uniform":
        values = _uniform(rng, param.min, param.max, shape, dt, into)
    elif kind == "gaussian":
        values = _normal(rng, param.mean, param.std, shape, dt, into)
        if param.sparse >= 0:
            if blob.num_axes < 1 or blob.shape[0] == 0:
                raise NetError(f"gaussian filler: sparse needs a blob with outputs, got {shape}")
            keep = param.sparse / blob.shape[0]
            values *= rng.random(shape, dtype=np.float32 if dt == np.float32 else np.float64) < keep
    elif kind == "positive_unitball":
        values = _uniform(rng, 0.0, 1.0, shape, dt)
        flat = values.reshape(shape[0] if shape else 1, -1)
        flat /= flat.sum(axis=1, keepdims=True)
    elif kind == "xavier":
        scale = math.sqrt(3.0 / _norm(param, blob))
        values = _uniform(rng, -scale, scale, shape, dt, into)
    elif kind == "msra":
        values = _normal(rng, 0.0, math.sqrt(2.0 / _norm(param, blob)), shape, dt, into)
    elif kind == "bilinear":
        if blob.num_axes != 4 or shape[2] != shape[3]:
            raise NetError(f"bilinear filler needs a 4-axis blob with height == width, got {shape}")
        k = shape[3]
        f = math.ceil(k / 2.0)
        c = (k - 1) / (2.0 * f)
        x = np.arange(k)
        w1 = 1 - np.abs(x / f - c)
        values = np.broadcast_to(np.outer(w1, w1), shape)
    else:
        raise NetError(
            f"unknown filler type '{kind}' (known: constant, uniform, gaussian, positive_unitball, "
            "xavier, msra, bilinear)"
        )
    if half:
        blob.set_math_data(np.ascontiguousarray(values, np.float32))
    elif values is not into:
        blob.mutable_cpu_data()[...] = values
