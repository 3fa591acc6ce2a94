"""Power: ``y = (shift + scale · x) ^ power`` (``power_param``: power 1, scale 1, shift 0); any shape.

Backward (Caffe's forms): ``dy/dx = power · scale · (shift + scale·x)^(power-1)``, computed as
``power·scale·y / (shift + scale·x)`` (``power·y/x`` when shift is 0); zero when ``power·scale`` is 0.
Reads both input and output, so it must not run in place.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_name("elementwise_activations.cu")


@register_layer("Power")
class PowerLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.power_param
        self.power, self.scale, self.shift = float(p.power), float(p.scale), float(p.shift)
        self.diff_scale = self.power * self.scale

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def _constant(self) -> float:
        """The output when ``power · scale == 0``: 1 for power 0, else shift^power."""
        return 1.0 if self.power == 0 else float(np.power(self.dtype.type(self.shift), self.dtype.type(self.power)))

    def forward_cpu(self, bottom, top):
        if self.diff_scale == 0:
            top[0].mutable_cpu_data()[...] = self._constant()
            return
        v = self.shift + self.scale * bottom[0].cpu_data()
        top[0].mutable_cpu_data()[...] = v if self.power == 1 else np.power(v, self.dtype.type(self.power))

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].mutable_cpu_diff()
        if self.diff_scale == 0:
            dx[...] = 0
            return
        x, y, dy = bottom[0].cpu_data(), top[0].cpu_data(), top[0].cpu_diff()
        if self.power == 1:
            d = self.diff_scale
        elif self.power == 2:
            d = self.diff_scale * self.shift + self.diff_scale * self.scale * x
        elif self.shift == 0:
            d = self.power * y / x
        else:
            d = self.diff_scale * y / (self.shift + self.scale * x)
        dx[...] = dy * d

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        if self.diff_scale == 0:
            gm.set(n, self._constant(), top[0].mutable_gpu_data(), self.dtype)
            return
        k = backend.kernel(KERNELS, "power_forward", self.dtype, "iPPfff")
        k(n, n, bottom[0].gpu_data(), top[0].mutable_gpu_data(), self.power, self.scale, self.shift)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].count
        if self.diff_scale == 0:
            gm.set(n, 0.0, bottom[0].mutable_gpu_diff(), self.dtype)
            return
        k = backend.kernel(KERNELS, "power_backward", self.dtype, "iPPPPfff")
        k(n, n, top[0].gpu_diff(), bottom[0].gpu_data(), top[0].gpu_data(), bottom[0].mutable_gpu_diff(),
          self.power, self.scale, self.shift)
