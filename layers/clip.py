"""Clip: ``y = max(min, min(x, max))`` (``clip_param.min`` and ``clip_param.max`` required); any shape.

Backward: ``dx = dy`` where ``min <= x <= max``, 0 elsewhere. Reads the input, so not in place.
With ``min > max`` every output is ``min``, as in Caffe. NaN inputs stay NaN.
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("Clip")
class ClipLayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('bottom',))
    gpu_forward = "const Dtype upper = x[i] > hi ? hi : x[i]; y[i] = upper < lo ? lo : upper"
    gpu_backward = "dx[i] = (x[i] >= lo && x[i] <= hi) ? dy[i] : Dtype(0)"

    def layer_setup(self, bottom, top):
        p = self.layer_param.clip_param
        missing = [f for f in ("min", "max") if not p.HasField(f)]
        if missing:
            raise self.error(f"clip_param.{' and clip_param.'.join(missing)} required")
        self.min, self.max = float(p.min), float(p.max)

    def gpu_scalars(self):
        return {"lo": self.min, "hi": self.max}

    def cpu_forward(self, x):
        return np.maximum(self.dtype.type(self.min), np.minimum(x, self.dtype.type(self.max)))

    def cpu_backward(self, x, y, dy):
        lo, hi = self.dtype.type(self.min), self.dtype.type(self.max)
        return np.where((x >= lo) & (x <= hi), dy, 0)
