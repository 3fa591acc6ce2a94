"""Log: ``y = log_base(shift + scale · x)`` (``log_param``: base -1 meaning e, scale 1, shift 0).

Any shape; ``base`` must be positive (and not 1) or -1. Backward:
``dx = dy · scale / (ln(base) · (shift + scale · x))``; it reads the input, so not in place.
"""

from __future__ import annotations

import math

import numpy as np

from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("Log")
class LogLayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('bottom',))
    gpu_forward = "y[i] = base_scale * log(shift + scale * x[i])"
    gpu_backward = "dx[i] = dy[i] * num_scale / (shift + scale * x[i])"

    def layer_setup(self, bottom, top):
        p = self.layer_param.log_param
        base = float(p.base)
        if base != -1 and not (base > 0 and base != 1):
            raise self.error(f"log_param.base must be positive and not 1, or -1 (meaning e), got {base}")
        self.base_scale = 1.0 if base == -1 else 1.0 / math.log(base)
        self.scale, self.shift = float(p.scale), float(p.shift)
        self.backward_num_scale = self.scale * self.base_scale

    def gpu_scalars(self):
        return {"base_scale": self.base_scale, "scale": self.scale, "shift": self.shift,
                "num_scale": self.backward_num_scale}

    def cpu_forward(self, x):
        return self.base_scale * np.log(self.shift + self.scale * x)

    def cpu_backward(self, x, y, dy):
        return dy * self.backward_num_scale / (self.shift + self.scale * x)
