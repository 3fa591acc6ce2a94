"""AbsVal: ``y = |x|``; any shape. Backward: ``dx = sign(x) · dy`` (0 at 0). Not in place (as Caffe)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_name("elementwise_activations.cu")


@register_layer("AbsVal")
class AbsValLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("does not allow in-place computation (its backward needs the input)")
        top[0].reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        top[0].mutable_cpu_data()[...] = np.abs(bottom[0].cpu_data())

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].mutable_cpu_diff()[...] = np.sign(bottom[0].cpu_data()) * top[0].cpu_diff()

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        k = backend.kernel(KERNELS, "absval_forward", self.dtype, "iPP")
        k(n, n, bottom[0].gpu_data(), top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].count
        k = backend.kernel(KERNELS, "absval_backward", self.dtype, "iPPP")
        k(n, n, top[0].gpu_diff(), bottom[0].gpu_data(), bottom[0].mutable_gpu_diff())
