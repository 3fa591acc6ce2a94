"""Reverse (CTPN's caffe fork): reverse the order of the entries along ``reverse_param.axis``.

Any shape with at least one axis; ``axis`` in [0, num_axes) (default 0: the time axis of a
(T, N, ...) sequence, as CTPN uses it to run an LSTM backwards). top has the bottom's shape,
``top = flip(bottom, axis)``; backward flips the top diff back. Not in place (as in the fork).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("Reverse")
class ReverseLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=())
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        if bottom[0] is top[0]:
            raise self.error("does not work in place (give the top another name)")
        self.axis = self.layer_param.reverse_param.axis

    def reshape(self, bottom, top):
        b = bottom[0]
        if not 0 <= self.axis < b.num_axes:
            raise self.error(f"reverse_param.axis {self.axis} must be in [0, {b.num_axes}) for bottom shape {b.shape}")
        top[0].reshape(b.shape)
        self.inner = b.count_range(self.axis + 1)
        self.axis_count = b.shape[self.axis]

    def forward_cpu(self, bottom, top):
        top[0].mutable_cpu_data()[...] = np.flip(bottom[0].cpu_data(), self.axis)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].mutable_cpu_diff()[...] = np.flip(top[0].cpu_diff(), self.axis)

    def _run(self, src: int, dst: int, count: int) -> None:
        if count:
            k = backend.kernel(KERNELS, "reverse_axis", self.dtype)
            k(count, self.axis_count, self.inner, src, dst)

    def forward_gpu(self, bottom, top):
        self._run(bottom[0].gpu_data(), top[0].mutable_gpu_data(), bottom[0].count)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self._run(top[0].gpu_diff(), bottom[0].mutable_gpu_diff(), bottom[0].count)
