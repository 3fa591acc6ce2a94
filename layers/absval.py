"""AbsVal: ``y = |x|``; any shape. Backward: ``dx = sign(x) · dy`` (0 at 0). Not in place (as Caffe)."""

from __future__ import annotations

import numpy as np

from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("AbsVal")
class AbsValLayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('bottom',))
    allow_in_place = False
    gpu_forward = "y[i] = fabs(x[i])"
    gpu_backward = "dx[i] = dy[i] * Dtype((Dtype(0) < x[i]) - (x[i] < Dtype(0)))"

    def cpu_forward(self, x):
        return np.abs(x)

    def cpu_backward(self, x, y, dy):
        return np.sign(x) * dy
