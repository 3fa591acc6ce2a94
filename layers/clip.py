"""Clip: ``y = max(min, min(x, max))`` (``clip_param.min`` and ``clip_param.max`` required); any shape.

Backward: ``dx = dy`` where ``min <= x <= max``, 0 elsewhere. Reads the input, so not in place.
With ``min > max`` every output is ``min``, as in Caffe.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_name("elementwise_activations.cu")


@register_layer("Clip")
class ClipLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.clip_param
        missing = [f for f in ("min", "max") if not p.HasField(f)]
        if missing:
            raise self.error(f"clip_param.{' and clip_param.'.join(missing)} required")
        self.min, self.max = float(p.min), float(p.max)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        lo, hi = self.dtype.type(self.min), self.dtype.type(self.max)
        top[0].mutable_cpu_data()[...] = np.maximum(lo, np.minimum(bottom[0].cpu_data(), hi))

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = bottom[0].cpu_data()
        lo, hi = self.dtype.type(self.min), self.dtype.type(self.max)
        bottom[0].mutable_cpu_diff()[...] = np.where((x >= lo) & (x <= hi), top[0].cpu_diff(), 0)

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        k = backend.kernel(KERNELS, "clip_forward", self.dtype, "iPPff")
        k(n, n, bottom[0].gpu_data(), top[0].mutable_gpu_data(), self.min, self.max)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].count
        k = backend.kernel(KERNELS, "clip_backward", self.dtype, "iPPPff")
        k(n, n, top[0].gpu_diff(), bottom[0].gpu_data(), bottom[0].mutable_gpu_diff(), self.min, self.max)
