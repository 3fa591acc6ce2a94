"""ReLU6 (MobileNet / SSDLite ports): ``y = min(max(x, 0), 6)``; any shape; works in place.

Backward: ``dx = dy`` where ``0 < x < 6``, else 0 (the forks' mask; at exactly 0 and 6 the gradient
is 0). In place ``x`` is the output, which lies strictly inside (0, 6) exactly where the input did.
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("ReLU6")
class ReLU6Layer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('bottom',))
    gpu_forward = "y[i] = x[i] > Dtype(0) ? (x[i] < Dtype(6) ? x[i] : Dtype(6)) : Dtype(0)"
    gpu_backward = "dx[i] = (x[i] > Dtype(0) && x[i] < Dtype(6)) ? dy[i] : Dtype(0)"

    def cpu_forward(self, x):
        return np.clip(x, 0, 6)

    def cpu_backward(self, x, y, dy):
        return np.where((x > 0) & (x < 6), dy, 0).astype(dy.dtype)
