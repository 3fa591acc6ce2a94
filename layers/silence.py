"""Silence: consume bottoms that nothing else uses (no tops); backward zeroes their diffs."""

from __future__ import annotations

from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("Silence")
class SilenceLayer(Layer):
    traits = Traits(graph_safe=True)
    min_bottom_blobs = 1
    exact_num_top_blobs = 0

    def reshape(self, bottom, top):
        """No tops to shape."""

    def forward_cpu(self, bottom, top):
        """Nothing to compute."""

    forward_gpu = forward_cpu

    def backward_cpu(self, top, propagate_down, bottom):
        for b, prop in zip(bottom, propagate_down):
            if prop:
                b.mutable_cpu_diff()[...] = 0

    def backward_gpu(self, top, propagate_down, bottom):
        for b, prop in zip(bottom, propagate_down):
            if prop:
                gm.set(b.count, 0.0, b.mutable_gpu_diff(), self.dtype)
