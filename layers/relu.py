"""ReLU: ``y = max(x, 0) + negative_slope · min(x, 0)``; any shape; works in place.

Backward: Caffe's product ``dx = dy · (x > 0 ? 1 : negative_slope)`` (so an inf/NaN ``dy`` gives NaN
where ``x <= 0``). In place ``x`` is the output: same sign, so the mask is unchanged.
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.layer import RELU, Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("ReLU")
class ReLULayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('bottom',), fuses=frozenset({RELU}))
    gpu_forward = "y[i] = x[i] > 0 ? x[i] : x[i] * negative_slope"
    gpu_backward = "dx[i] = dy[i] * (x[i] > 0 ? Dtype(1) : negative_slope)"

    def layer_setup(self, bottom, top):
        self.negative_slope = self.layer_param.relu_param.negative_slope

    def fuses_as(self, role, bottom=None) -> bool:
        return super().fuses_as(role, bottom) and self.negative_slope == 0

    def gpu_scalars(self):
        return {"negative_slope": self.negative_slope}

    def cpu_forward(self, x):
        y = np.maximum(x, 0)
        if self.negative_slope:
            y += self.negative_slope * np.minimum(x, 0)
        return y

    def cpu_backward(self, x, y, dy):
        if not self.negative_slope:
            return dy * (x > 0)
        return dy * np.where(x > 0, 1.0, self.negative_slope).astype(x.dtype)
