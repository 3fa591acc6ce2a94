"""Softmax over one axis: ``y = exp(x - max) / Σ exp(x - max)`` along ``softmax_param.axis``.

bottom viewed as (outer, channels, inner) around the axis; top has the bottom's shape.
Backward: ``dx = (dy - Σ_c dy·y) · y``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("Softmax")
class SoftmaxLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        self.scale = Blob((), self.dtype)  # per-(outer, inner) max / sum / dot, for the GPU path

    def reshape(self, bottom, top):
        self.axis = bottom[0].canonical_axis(self.layer_param.softmax_param.axis)
        top[0].reshape(bottom[0].shape)
        self.outer = bottom[0].count_range(0, self.axis)
        self.channels = bottom[0].shape[self.axis]
        self.inner = bottom[0].count_range(self.axis + 1)
        self.scale.reshape((self.outer, self.inner))

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

    # -- GPU: the kernels of Caffe's softmax, (outer, channels, inner) indexing -----------------
    def _k(self, name: str, argtypes: str) -> backend.Kernel:
        return backend.kernel(KERNELS, name, self.dtype, argtypes)

    def forward_gpu(self, bottom, top):
        O, C, N, dt = self.outer, self.channels, self.inner, self.dtype
        count = bottom[0].count
        x, y, s = bottom[0].gpu_data(), top[0].mutable_gpu_data(), self.scale.mutable_gpu_data()
        gm.copy(count, x, y, dt)
        self._k("softmax_channel_max", "iiiPP")(O * N, O, C, N, y, s)
        self._k("softmax_channel_subtract", "iiiPP")(count, count, C, N, s, y)
        gm.exp(count, y, y, dt)
        self._k("softmax_channel_sum", "iiiPP")(O * N, O, C, N, y, s)
        self._k("softmax_channel_div", "iiiPP")(count, count, C, N, s, y)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        O, C, N, dt = self.outer, self.channels, self.inner, self.dtype
        count = top[0].count
        y, dy = top[0].gpu_data(), top[0].gpu_diff()
        dx, s = bottom[0].mutable_gpu_diff(), self.scale.mutable_gpu_data()
        self._k("softmax_channel_dot", "iiiPPP")(O * N, O, C, N, dy, y, s)
        gm.copy(count, dy, dx, dt)  # in place dx is dy already
        self._k("softmax_channel_subtract", "iiiPP")(count, count, C, N, s, dx)
        gm.mul(count, dx, y, dx, dt)
