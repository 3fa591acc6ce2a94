"""Weight fillers with Caffe's semantics (``FillerParameter.type``)."""

from __future__ import annotations

import math

import numpy as np

from . import common
from .blob import Blob
from .errors import NetError
from .proto import caffe_pb2

VarianceNorm = caffe_pb2.FillerParameter


def _fans(blob: Blob) -> tuple[int, int]:
    """Caffe's fan_in = count / shape[0], fan_out = count / shape[1]."""
    if blob.num_axes == 0 or blob.shape[0] == 0:
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


def fill(blob: Blob, param: caffe_pb2.FillerParameter | None) -> None:
    """Fill ``blob``'s data according to ``param`` (default: constant 0)."""
    param = param if param is not None else caffe_pb2.FillerParameter()
    rng = common.rng()
    shape = blob.shape
    kind = param.type
    if kind == "constant":
        values = np.full(shape, param.value)
    elif kind == "uniform":
        values = rng.uniform(param.min, param.max, shape)
    elif kind == "gaussian":
        values = rng.normal(param.mean, param.std, shape)
        if param.sparse >= 0:
            if blob.num_axes < 1 or blob.shape[0] == 0:
                raise NetError(f"gaussian filler: sparse needs a blob with outputs, got {shape}")
            keep = param.sparse / blob.shape[0]
            values = values * (rng.random(shape) < keep)
    elif kind == "positive_unitball":
        values = rng.uniform(0.0, 1.0, shape)
        flat = values.reshape(shape[0] if shape else 1, -1)
        flat /= flat.sum(axis=1, keepdims=True)
    elif kind == "xavier":
        scale = math.sqrt(3.0 / _norm(param, blob))
        values = rng.uniform(-scale, scale, shape)
    elif kind == "msra":
        values = rng.normal(0.0, math.sqrt(2.0 / _norm(param, blob)), shape)
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
    blob.mutable_cpu_data()[...] = values
