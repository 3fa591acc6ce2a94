"""BNLL (binomial normal log likelihood): ``y = log(1 + exp(x))``; any shape.

Forward uses the overflow-free form ``x + log1p(exp(-x))`` for ``x > 0``. Backward:
``dx = dy · sigmoid(x)``, with ``exp``'s argument capped at 50 as in Caffe. Reads the input.
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer

BNLL_THRESHOLD = 50.0


@register_layer("BNLL")
class BNLLLayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('bottom',))
    gpu_forward = "y[i] = x[i] > 0 ? x[i] + log1p(exp(-x[i])) : log1p(exp(x[i]))"
    gpu_backward = "const Dtype e = exp(fmin(x[i], threshold)); dx[i] = dy[i] * e / (e + Dtype(1))"

    def gpu_scalars(self):
        return {"threshold": BNLL_THRESHOLD}

    def cpu_forward(self, x):
        return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))

    def cpu_backward(self, x, y, dy):
        e = np.exp(np.minimum(x, BNLL_THRESHOLD))
        return dy * e / (e + 1)
