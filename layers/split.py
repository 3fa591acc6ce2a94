"""Split: hand one bottom to several consumers. Every top shares the bottom's data; backward sums
the top diffs into the bottom diff. The Net inserts these automatically for blobs used twice.
"""

from __future__ import annotations

from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import SPLIT_SUM, Layer, Traits, register_layer


@register_layer("Split")
class SplitLayer(Layer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=(), fuses=frozenset({SPLIT_SUM}))
    exact_num_bottom_blobs = 1
    min_top_blobs = 1

    def reshape(self, bottom, top):
        for i, t in enumerate(top):
            if t is bottom[0]:
                raise self.error(f"top {i} is the bottom: Split cannot be used in place")
            t.reshape(bottom[0].shape)
            t.share_data(bottom[0])


    def forward_cpu(self, bottom, top):
        """Nothing to do: the tops share the bottom's data."""

    forward_gpu = forward_cpu

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        total = top[0].cpu_diff().copy()
        for t in top[1:]:
            total += t.cpu_diff()
        bottom[0].mutable_cpu_diff()[...] = total

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            gm.weighted_sum(bottom[0].count, [t.gpu_diff() for t in top], [1.0] * len(top),
                            bottom[0].mutable_gpu_diff(), self.dtype)
