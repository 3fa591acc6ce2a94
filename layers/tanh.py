"""TanH: ``y = tanh(x)`` element-wise; any shape; works in place.

Backward: ``dx = dy · (1 - y²)`` (reads only the top, so in-place use is safe).
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("TanH")
class TanHLayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('top',))
    gpu_forward = "y[i] = tanh(x[i])"
    gpu_backward = "dx[i] = dy[i] * (Dtype(1) - y[i] * y[i])"

    def cpu_forward(self, x):
        return np.tanh(x)

    def cpu_backward(self, x, y, dy):
        return dy * (1 - y * y)
