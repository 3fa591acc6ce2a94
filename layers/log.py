"""Log: ``y = log_base(shift + scale · x)`` (``log_param``: base -1 meaning e, scale 1, shift 0).

Any shape; ``base`` must be positive (and not 1) or -1. Backward:
``dx = dy · scale / (ln(base) · (shift + scale · x))``; it reads the input, so not in place.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_name("elementwise_activations.cu")


@register_layer("Log")
class LogLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.log_param
        base = float(p.base)
        if base != -1 and not (base > 0 and base != 1):
            raise self.error(f"log_param.base must be positive and not 1, or -1 (meaning e), got {base}")
        self.base_scale = 1.0 if base == -1 else 1.0 / math.log(base)
        self.scale, self.shift = float(p.scale), float(p.shift)
        self.backward_num_scale = self.scale * self.base_scale

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        top[0].mutable_cpu_data()[...] = self.base_scale * np.log(self.shift + self.scale * x)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = bottom[0].cpu_data()
        bottom[0].mutable_cpu_diff()[...] = top[0].cpu_diff() * self.backward_num_scale / (self.shift + self.scale * x)

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        k = backend.kernel(KERNELS, "log_forward", self.dtype, "iPPfff")
        k(n, n, bottom[0].gpu_data(), top[0].mutable_gpu_data(), self.base_scale, self.scale, self.shift)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].count
        k = backend.kernel(KERNELS, "log_backward", self.dtype, "iPPPfff")
        k(n, n, top[0].gpu_diff(), bottom[0].gpu_data(), bottom[0].mutable_gpu_diff(), self.backward_num_scale,
          self.scale, self.shift)
