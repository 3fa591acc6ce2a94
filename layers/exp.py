"""Exp: ``y = base ^ (shift + scale · x)`` (``exp_param``: base -1 meaning e, scale 1, shift 0).

Any shape; ``base`` must be positive or -1. Computed as ``outer · exp(inner · x)`` with
``inner = scale · ln(base)`` and ``outer = base^shift``. Backward: ``dx = dy · y · inner`` (reads only
the top, so in-place use is safe).
"""

from __future__ import annotations

import math

import numpy as np

from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("Exp")
class ExpLayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('top',))
    gpu_forward = "y[i] = outer_scale * exp(inner_scale * x[i])"
    gpu_backward = "dx[i] = dy[i] * y[i] * inner_scale"

    def layer_setup(self, bottom, top):
        p = self.layer_param.exp_param
        base = float(p.base)
        if base != -1 and not base > 0:
            raise self.error(f"exp_param.base must be positive or -1 (meaning e), got {base}")
        log_base = 1.0 if base == -1 else math.log(base)
        self.inner_scale = log_base * float(p.scale)
        shift = float(p.shift)
        self.outer_scale = 1.0 if shift == 0 else (math.exp(shift) if base == -1 else base**shift)

    def gpu_scalars(self):
        return {"inner_scale": self.inner_scale, "outer_scale": self.outer_scale}

    def cpu_forward(self, x):
        return self.outer_scale * np.exp(self.inner_scale * x)

    def cpu_backward(self, x, y, dy):
        return dy * y * self.inner_scale
