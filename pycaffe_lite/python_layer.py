"""User-facing base class of Python layers (``caffe.Layer``), as in BVLC's pycaffe.

A prototxt layer ``type: "Python"`` with ``python_param { module: "m" layer: "C" param_str: "..." }``
instantiates class ``C`` of module ``m`` (found on ``sys.path``). ``C`` subclasses :class:`Layer`
and overrides ``setup``, ``reshape``, ``forward`` and ``backward``; it reads and writes
``bottom[i].data``, ``top[i].diff``, calls ``top[i].reshape(...)``, and may add learnable
parameters with ``self.blobs.add_blob(*shape)``. Before ``setup`` the net sets ``param_str``
(str) and ``phase`` (``caffe.TRAIN`` or ``caffe.TEST``). In GPU mode the blobs sync to the host
when user code touches ``.data`` / ``.diff``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .blob import Blob


class BlobVec(list):
    """A layer's parameter blobs: a list with BVLC's ``add_blob(*shape)``."""

    def __init__(self, iterable=(), dtype: np.dtype | type = np.float32) -> None:
        super().__init__(iterable)
        self.dtype = np.dtype(dtype)

    def add_blob(self, *shape: int) -> Blob:
        """Append a new zero-filled blob of ``shape`` (in the layer's dtype) and return it."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        blob = Blob(tuple(int(d) for d in shape), self.dtype)
        self.append(blob)
        return blob


class Layer:
    """Base class of user-written Python layers; every hook is a no-op by default.

    ``__init__(layer_param)`` receives the layer's ``LayerParameter`` (BVLC passes it too), kept
    as ``self.layer_param``. Attributes set by the net: ``param_str``, ``phase``, ``blobs``.
    """

    def __init__(self, layer_param=None) -> None:
        self.layer_param = layer_param
        self.param_str = ""
        self.phase = 0
        self.blobs = BlobVec()

    @property
    def type(self) -> str:
        return "Python"

    def setup(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        """Called once: read ``self.param_str``, check bottoms, add param blobs."""

    def reshape(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        """Called before every forward: shape the tops."""

    def forward(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        """Compute ``top[i].data`` from ``bottom[i].data``."""

    def backward(self, top: Sequence[Blob], propagate_down: Sequence[bool], bottom: Sequence[Blob]) -> None:
        """Write ``bottom[i].diff`` where ``propagate_down[i]``; accumulate into param diffs."""
