"""ELU: ``y = x`` for ``x > 0``, ``alpha · (exp(x) - 1)`` otherwise (``elu_param.alpha``, default 1).

Any shape. Backward: ``dx = dy`` where ``x > 0``, ``dy · (y + alpha)`` elsewhere.
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("ELU")
class ELULayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('bottom', 'top'))
    gpu_forward = "y[i] = x[i] > 0 ? x[i] : alpha * expm1(x[i])"
    gpu_backward = "dx[i] = x[i] > 0 ? dy[i] : dy[i] * (y[i] + alpha)"

    def layer_setup(self, bottom, top):
        self.alpha = float(self.layer_param.elu_param.alpha)

    def gpu_scalars(self):
        return {"alpha": self.alpha}

    def cpu_forward(self, x):
        return np.where(x > 0, x, self.alpha * np.expm1(np.minimum(x, 0)))

    def cpu_backward(self, x, y, dy):
        return np.where(x > 0, dy, dy * (y + self.alpha))
