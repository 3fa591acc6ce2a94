"""TanH: ``y = tanh(x)`` element-wise; any shape; works in place.

Backward: ``dx = dy · (1 - y²)`` (reads only the top, so in-place use is safe).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("TanH")
class TanHLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        top[0].mutable_cpu_data()[...] = np.tanh(bottom[0].cpu_data())

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].cpu_data()
        bottom[0].mutable_cpu_diff()[...] = top[0].cpu_diff() * (1 - y * y)

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        k = backend.kernel(KERNELS, "tanh_forward", self.dtype, "iPP")
        k(n, n, bottom[0].gpu_data(), top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].count
        k = backend.kernel(KERNELS, "tanh_backward", self.dtype, "iPPP")
        k(n, n, top[0].gpu_diff(), top[0].gpu_data(), bottom[0].mutable_gpu_diff())
