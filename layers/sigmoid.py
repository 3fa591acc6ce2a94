"""Sigmoid: ``y = 1 / (1 + exp(-x))`` element-wise (as ``0.5·tanh(0.5·x) + 0.5``, which cannot
overflow); any shape; works in place. Backward: ``dx = dy · y · (1 - y)`` (reads only the top).
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("Sigmoid")
class SigmoidLayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('top',))
    gpu_forward = "y[i] = Dtype(0.5) * tanh(Dtype(0.5) * x[i]) + Dtype(0.5)"
    gpu_backward = "dx[i] = dy[i] * y[i] * (Dtype(1) - y[i])"

    def cpu_forward(self, x):
        return 0.5 * np.tanh(0.5 * x) + 0.5

    def cpu_backward(self, x, y, dy):
        return dy * y * (1 - y)
