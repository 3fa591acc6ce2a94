"""Filter (BVLC's FilterLayer): keep the items whose selector is non-zero.

bottoms: K blobs to filter, each (N, ...), then the selector (N,) or (N, 1, ...) with every axis
after the first of size 1. tops: K blobs, top k = bottom k's items n (along axis 0, in order)
where ``selector[n] != 0``, so each top is (S, ...) with S the number of selected items.
Backward copies the top diffs to the selected items and zeroes the others; the selector takes no
gradient. As in BVLC, the first reshape (at set-up, before the selector holds values) gives the
tops N items; every forward re-reads the selector (on the host: the layer is not captured in
CUDA graphs).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("Filter")
class FilterLayer(Layer):
    traits = Traits()  # its output size depends on the data (host reads): never captured
    min_bottom_blobs = 2
    min_top_blobs = 1

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != len(self.layer_param.bottom) - 1

    def layer_setup(self, bottom, top):
        if len(top) != len(bottom) - 1:
            raise self.error(f"needs one top per filtered bottom: {len(bottom) - 1} top(s) for {len(bottom)} "
                             f"bottoms (the last bottom is the selector), got {len(top)}")
        self.first_reshape = True
        self._idx = Blob(dtype=np.float32)  # int32 bits of self.indices, for the kernels
        self._idx_key: tuple | None = None

    def reshape(self, bottom, top):
        sel = bottom[-1]
        if sel.num_axes < 1 or any(d != 1 for d in sel.shape[1:]):
            raise self.error(f"selector (last bottom) must be (N,) or have size 1 on every axis after the first, "
                             f"got shape {sel.shape}")
        for i, b in enumerate(bottom[:-1]):
            if b.num_axes < 1 or b.shape[0] != sel.shape[0]:
                raise self.error(f"bottom {i} {b.shape} must have as many items (axis 0) as the selector "
                                 f"{sel.shape}")
        self.indices = np.flatnonzero(sel.cpu_data().reshape(-1))
        num = sel.shape[0] if self.first_reshape else len(self.indices)
        self.first_reshape = False
        for b, t in zip(bottom[:-1], top):
            t.reshape((num,) + b.shape[1:])

    def forward_cpu(self, bottom, top):
        for b, t in zip(bottom[:-1], top):
            t.mutable_cpu_data()[...] = b.cpu_data()[self.indices]

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[-1]:
            raise self.error("cannot back-propagate to the selector (last bottom)")
        for i, (b, t) in enumerate(zip(bottom[:-1], top)):
            if propagate_down[i]:
                dx = b.mutable_cpu_diff()
                dx[...] = 0
                dx[self.indices] = t.cpu_diff()

    def _idx_ptr(self) -> int:
        key = tuple(self.indices.tolist())
        if key != self._idx_key:
            self._idx.reshape((max(len(key), 1),))
            self._idx.mutable_cpu_data().view(np.int32)[:len(key)] = key
            self._idx_key = key
        return self._idx.gpu_data()

    def forward_gpu(self, bottom, top):
        if not len(self.indices):
            return
        for b, t in zip(bottom[:-1], top):
            dim = b.count_range(1)
            if dim:
                k = backend.kernel(KERNELS, "filter_gather", self.dtype)
                k(t.count, dim, self._idx_ptr(), b.gpu_data(), t.mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[-1]:
            raise self.error("cannot back-propagate to the selector (last bottom)")
        for i, (b, t) in enumerate(zip(bottom[:-1], top)):
            if not propagate_down[i]:
                continue
            dx = b.mutable_gpu_diff()
            backend.memset_zero(dx, b.count * self.dtype.itemsize)
            dim = b.count_range(1)
            if len(self.indices) and dim:
                k = backend.kernel(KERNELS, "filter_scatter", self.dtype)
                k(t.count, dim, self._idx_ptr(), t.gpu_diff(), dx)
