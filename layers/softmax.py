"""Softmax over one axis: ``y = exp(x - max) / Σ exp(x - max)`` along ``softmax_param.axis``.

bottom viewed as (outer, channels, inner) around the axis; top has the bottom's shape.
Backward: ``dx = (dy - Σ_c dy·y) · y``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("Softmax")
class SoftmaxLayer(Layer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('top',))
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def reshape(self, bottom, top):
        self.axis = bottom[0].canonical_axis(self.layer_param.softmax_param.axis)
        top[0].reshape(bottom[0].shape)
        self.outer = bottom[0].count_range(0, self.axis)
        self.channels = bottom[0].shape[self.axis]
        self.inner = bottom[0].count_range(self.axis + 1)

    def _view(self, a: np.ndarray) -> np.ndarray:
        return a.reshape(self.outer, self.channels, self.inner)

    def forward_cpu(self, bottom, top):
        x = self._view(bottom[0].cpu_data())
        e = np.exp(x - x.max(axis=1, keepdims=True))
        top[0].mutable_cpu_data()[...] = (e / e.sum(axis=1, keepdims=True)).reshape(top[0].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = self._view(top[0].cpu_data())
        dy = self._view(top[0].cpu_diff())
        dot = (dy * y).sum(axis=1, keepdims=True)
        bottom[0].mutable_cpu_diff()[...] = ((dy - dot) * y).reshape(bottom[0].shape)

    # -- GPU: one thread per (outer, inner) position -----------------------------------------
    def forward_gpu(self, bottom, top):
        if self.inner == 1:  # one warp per row
            backend.kernel(KERNELS, "softmax_forward_rows", self.dtype)(
                self.outer * 32, self.channels, bottom[0].gpu_data(), top[0].mutable_gpu_data())
            return
        backend.kernel(KERNELS, "softmax_forward", self.dtype)(
            self.outer * self.inner, self.channels, self.inner, bottom[0].gpu_data(),
            top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0] and self.inner == 1:
            backend.kernel(KERNELS, "softmax_backward_rows", self.dtype)(
                self.outer * 32, self.channels, top[0].gpu_data(), top[0].gpu_diff(), bottom[0].mutable_gpu_diff())
        elif propagate_down[0]:
            backend.kernel(KERNELS, "softmax_backward", self.dtype)(
                self.outer * self.inner, self.channels, self.inner, top[0].gpu_data(), top[0].gpu_diff(),
                bottom[0].mutable_gpu_diff())
