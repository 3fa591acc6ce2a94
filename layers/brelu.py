"""BReLU (DehazeNet's bounded ReLU): ``y = min(max(x, minval), maxval)`` (``brelu_param``, defaults
0 and 1); any shape.

Backward: ``dx = dy`` where ``minval <= x <= maxval``, 0 elsewhere (both bounds pass the gradient,
as the fork's layer). With ``minval > maxval`` every output is ``maxval`` (the fork clamps below
first). NaN inputs stay NaN. Reads the input in backward, so not in place.
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("BReLU")
class BReLULayer(NeuronLayer):
    traits = Traits(graph_safe=True, backward_reads=("bottom",))
    gpu_forward = "const Dtype lower = x[i] < lo ? lo : x[i]; y[i] = hi < lower ? hi : lower"
    gpu_backward = "dx[i] = (x[i] >= lo && x[i] <= hi) ? dy[i] : Dtype(0)"

    def layer_setup(self, bottom, top):
        p = self.layer_param.brelu_param
        self.minval, self.maxval = float(p.minval), float(p.maxval)
        if not (np.isfinite(self.minval) and np.isfinite(self.maxval)):
            raise self.error(f"brelu_param minval {self.minval} and maxval {self.maxval} must be finite")

    def gpu_scalars(self):
        return {"lo": self.minval, "hi": self.maxval}

    def cpu_forward(self, x):
        return np.minimum(np.maximum(x, self.dtype.type(self.minval)), self.dtype.type(self.maxval))

    def cpu_backward(self, x, y, dy):
        lo, hi = self.dtype.type(self.minval), self.dtype.type(self.maxval)
        return np.where((x >= lo) & (x <= hi), dy, 0)
