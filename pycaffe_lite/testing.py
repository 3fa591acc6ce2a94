"""Helpers for building single layers and blobs in tests and scripts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .blob import Blob
from .layer import Layer, create_layer
from .proto import caffe_pb2
from .protoio import parse_text


def layer_param(text: str) -> caffe_pb2.LayerParameter:
    """A LayerParameter from prototxt text (the body of a ``layer { ... }``)."""
    return parse_text(text, caffe_pb2.LayerParameter(), "<layer text>")


def make_layer(text: str, dtype: np.dtype | type = np.float64) -> Layer:
    """Instantiate a layer from prototxt text; ``name`` defaults to its type."""
    param = layer_param(text)
    if not param.name:
        param.name = param.type.lower() or "layer"
    return create_layer(param, dtype)


def blobs(arrays: Sequence[np.ndarray], dtype: np.dtype | type = np.float64) -> list[Blob]:
    """Blobs holding copies of ``arrays``."""
    out = []
    for a in arrays:
        a = np.asarray(a)
        b = Blob(a.shape, dtype)
        b.mutable_cpu_data()[...] = a
        out.append(b)
    return out


def empty_blobs(n: int, dtype: np.dtype | type = np.float64) -> list[Blob]:
    return [Blob((), dtype) for _ in range(n)]
