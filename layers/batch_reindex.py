"""BatchReindex (BVLC's): pick items of a batch by index, repeats allowed.

bottoms: data (N, ...) and indices (M,), integer values in [0, N). top: (M, ...) with
``top[j] = data[indices[j]]``. Backward: ``d data[n] = sum of d top[j] over j with indices[j] == n``
(zero for items never picked); the indices take no gradient. The CPU path refuses indices outside
[0, N); the GPU path (which reads no device data on the host) gives zeros for them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("BatchReindex")
class BatchReindexLayer(Layer):
    traits = Traits(graph_safe=True)
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def reshape(self, bottom, top):
        if bottom[1].num_axes != 1:
            raise self.error(f"bottom 1 (indices) must have 1 axis (M,), got shape {bottom[1].shape}")
        if bottom[0].num_axes < 1:
            raise self.error(f"bottom 0 must have an item axis, got shape {bottom[0].shape}")
        top[0].reshape((bottom[1].shape[0],) + bottom[0].shape[1:])

    def _indices(self, bottom) -> np.ndarray:
        v = bottom[1].cpu_data()
        bad = ~((v >= 0) & (v < bottom[0].shape[0]))  # NaN included
        if bad.any():
            raise self.error(f"index {float(v[bad][0])} is outside the batch of {bottom[0].shape[0]} items")
        return v.astype(np.int64)

    def forward_cpu(self, bottom, top):
        top[0].mutable_cpu_data()[...] = bottom[0].cpu_data()[self._indices(bottom)]

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot back-propagate to the indices (bottom 1)")
        if propagate_down[0]:
            dx = bottom[0].mutable_cpu_diff()
            dx[...] = 0
            np.add.at(dx, self._indices(bottom), top[0].cpu_diff())

    def forward_gpu(self, bottom, top):
        if top[0].count:
            k = backend.kernel(KERNELS, "batch_reindex_forward", self.dtype)
            k(top[0].count, bottom[0].count_range(1), bottom[0].shape[0], bottom[1].gpu_data(),
              bottom[0].gpu_data(), top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot back-propagate to the indices (bottom 1)")
        if propagate_down[0] and bottom[0].count:
            k = backend.kernel(KERNELS, "batch_reindex_backward", self.dtype)
            k(bottom[0].count, bottom[0].count_range(1), bottom[1].shape[0], bottom[1].gpu_data(),
              top[0].gpu_diff(), bottom[0].mutable_gpu_diff())
