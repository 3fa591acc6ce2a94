"""Exp: ``y = base ^ (shift + scale · x)`` (``exp_param``: base -1 meaning e, scale 1, shift 0).

Any shape; ``base`` must be positive or -1. Computed as ``outer · exp(inner · x)`` with
``inner = scale · ln(base)`` and ``outer = base^shift``. Backward: ``dx = dy · y · inner`` (reads only
the top, so in-place use is safe).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_name("elementwise_activations.cu")


@register_layer("Exp")
class ExpLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.exp_param
        base = float(p.base)
        if base != -1 and not base > 0:
            raise self.error(f"exp_param.base must be positive or -1 (meaning e), got {base}")
        log_base = 1.0 if base == -1 else math.log(base)
        self.inner_scale = log_base * float(p.scale)
        shift = float(p.shift)
        self.outer_scale = 1.0 if shift == 0 else (math.exp(shift) if base == -1 else base**shift)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        top[0].mutable_cpu_data()[...] = self.outer_scale * np.exp(self.inner_scale * x)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        bottom[0].mutable_cpu_diff()[...] = top[0].cpu_diff() * top[0].cpu_data() * self.inner_scale

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        k = backend.kernel(KERNELS, "exp_forward", self.dtype, "iPPff")
        k(n, n, bottom[0].gpu_data(), top[0].mutable_gpu_data(), self.inner_scale, self.outer_scale)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].count
        k = backend.kernel(KERNELS, "exp_backward", self.dtype, "iPPPf")
        k(n, n, top[0].gpu_diff(), top[0].gpu_data(), bottom[0].mutable_gpu_diff(), self.inner_scale)
