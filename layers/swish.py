"""Swish: ``y = x · sigmoid(beta · x)`` (``swish_param.beta``, default 1); any shape.

Backward: ``dx = dy · (beta·y + s·(1 - beta·y))`` with ``s = sigmoid(beta·x)`` kept from the forward
pass; it reads only the top and ``s``, so in-place use is safe.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_name("elementwise_activations.cu")


@register_layer("Swish")
class SwishLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        self.beta = float(self.layer_param.swish_param.beta)
        self.sigmoid_output = Blob((), self.dtype)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)
        self.sigmoid_output.reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        s = 0.5 * np.tanh(0.5 * self.beta * x) + 0.5  # stable sigmoid
        self.sigmoid_output.mutable_cpu_data()[...] = s
        top[0].mutable_cpu_data()[...] = x * s

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y, s = top[0].cpu_data(), self.sigmoid_output.cpu_data()
        by = self.beta * y
        bottom[0].mutable_cpu_diff()[...] = top[0].cpu_diff() * (by + s * (1 - by))

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        k = backend.kernel(KERNELS, "swish_forward", self.dtype, "iPPPf")
        k(n, n, bottom[0].gpu_data(), self.sigmoid_output.mutable_gpu_data(), top[0].mutable_gpu_data(),
          self.beta)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].count
        k = backend.kernel(KERNELS, "swish_backward", self.dtype, "iPPPPf")
        k(n, n, top[0].gpu_diff(), top[0].gpu_data(), self.sigmoid_output.gpu_data(),
          bottom[0].mutable_gpu_diff(), self.beta)
