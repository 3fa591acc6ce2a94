"""ReLU: ``y = max(x, 0) + negative_slope * min(x, 0)``; works in place."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("ReLU")
class ReLULayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        self.negative_slope = self.layer_param.relu_param.negative_slope

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        y = np.maximum(x, 0)
        if self.negative_slope:
            y += self.negative_slope * np.minimum(x, 0)
        top[0].mutable_cpu_data()[...] = y

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = bottom[0].cpu_data()  # in place, x is the output: same sign, so the mask is unchanged
        dy = top[0].cpu_diff()
        dx = bottom[0].mutable_cpu_diff()
        if self.negative_slope:
            dx[...] = dy * np.where(x > 0, 1.0, self.negative_slope).astype(x.dtype)
        else:  # Caffe's dy * (x > 0): a product, so an inf/NaN dy gives NaN at x <= 0 as in Caffe
            np.multiply(dy, x > 0, out=dx)

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        k = backend.kernel(KERNELS, "relu_forward", self.dtype, "iPPf")
        k(n, n, bottom[0].gpu_data(), top[0].mutable_gpu_data(), self.negative_slope)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].count
        k = backend.kernel(KERNELS, "relu_backward", self.dtype, "iPPPf")
        k(n, n, top[0].gpu_diff(), bottom[0].gpu_data(), bottom[0].mutable_gpu_diff(), self.negative_slope)
