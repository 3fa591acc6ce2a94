"""BNLL (binomial normal log likelihood): ``y = log(1 + exp(x))``; any shape.

Forward uses the overflow-free form ``x + log1p(exp(-x))`` for ``x > 0``. Backward:
``dx = dy · sigmoid(x)``, with ``exp``'s argument capped at 50 as in Caffe. Reads the input.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_name("elementwise_activations.cu")
BNLL_THRESHOLD = 50.0


@register_layer("BNLL")
class BNLLLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        top[0].mutable_cpu_data()[...] = np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        e = np.exp(np.minimum(bottom[0].cpu_data(), BNLL_THRESHOLD))
        bottom[0].mutable_cpu_diff()[...] = top[0].cpu_diff() * e / (e + 1)

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        k = backend.kernel(KERNELS, "bnll_forward", self.dtype, "iPP")
        k(n, n, bottom[0].gpu_data(), top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].count
        k = backend.kernel(KERNELS, "bnll_backward", self.dtype, "iPPP")
        k(n, n, top[0].gpu_diff(), bottom[0].gpu_data(), bottom[0].mutable_gpu_diff())
