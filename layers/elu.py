"""ELU: ``y = x`` for ``x > 0``, ``alpha · (exp(x) - 1)`` otherwise (``elu_param.alpha``, default 1).

Any shape. Backward: ``dx = dy`` where ``x > 0``, ``dy · (y + alpha)`` elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_name("elementwise_activations.cu")


@register_layer("ELU")
class ELULayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        self.alpha = float(self.layer_param.elu_param.alpha)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        neg = self.alpha * np.expm1(np.minimum(x, 0))
        top[0].mutable_cpu_data()[...] = np.where(x > 0, x, neg)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x, y = bottom[0].cpu_data(), top[0].cpu_data()
        dy = top[0].cpu_diff()
        bottom[0].mutable_cpu_diff()[...] = np.where(x > 0, dy, dy * (y + self.alpha))

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        k = backend.kernel(KERNELS, "elu_forward", self.dtype, "iPPf")
        k(n, n, bottom[0].gpu_data(), top[0].mutable_gpu_data(), self.alpha)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].count
        k = backend.kernel(KERNELS, "elu_backward", self.dtype, "iPPPPf")
        k(n, n, top[0].gpu_diff(), top[0].gpu_data(), bottom[0].gpu_data(), bottom[0].mutable_gpu_diff(),
          self.alpha)
