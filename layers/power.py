"""Power: ``y = (shift + scale · x) ^ power`` (``power_param``: power 1, scale 1, shift 0); any shape.

Backward (Caffe's forms): ``dy/dx = power · scale · (shift + scale·x)^(power-1)``, computed as
``power·scale·y / (shift + scale·x)`` (``power·y/x`` when shift is 0); zero when ``power·scale`` is 0.
Reads both input and output, so it must not run in place.
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("Power")
class PowerLayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('bottom', 'top'))
    gpu_forward = ("const Dtype v = shift + scale * x[i]; "
                   "y[i] = power == Dtype(1) ? v : power == Dtype(2) ? v * v : pow(v, power)")
    gpu_backward = ("dx[i] = dy[i] * (power == Dtype(1) ? diff_scale"
                    " : power == Dtype(2) ? diff_scale * shift + diff_scale * scale * x[i]"
                    " : shift == Dtype(0) ? power * y[i] / x[i] : diff_scale * y[i] / (shift + scale * x[i]))")

    def layer_setup(self, bottom, top):
        p = self.layer_param.power_param
        self.power, self.scale, self.shift = float(p.power), float(p.scale), float(p.shift)
        self.diff_scale = self.power * self.scale
        if self.diff_scale == 0:  # a constant output: 1 for power 0, else shift^power; zero gradient
            self.constant = 1.0 if self.power == 0 else float(np.power(self.dtype.type(self.shift),
                                                                       self.dtype.type(self.power)))
            self.gpu_forward, self.gpu_backward = "y[i] = constant", "dx[i] = Dtype(0)"

    def gpu_scalars(self):
        if self.diff_scale == 0:
            return {"constant": self.constant}
        return {"power": self.power, "scale": self.scale, "shift": self.shift, "diff_scale": self.diff_scale}

    def cpu_forward(self, x):
        if self.diff_scale == 0:
            return self.constant
        v = self.shift + self.scale * x
        return v if self.power == 1 else np.power(v, self.dtype.type(self.power))

    def cpu_backward(self, x, y, dy):
        if self.diff_scale == 0:
            return 0
        if self.power == 1:
            d = self.diff_scale
        elif self.power == 2:
            d = self.diff_scale * self.shift + self.diff_scale * self.scale * x
        elif self.shift == 0:
            d = self.power * y / x
        else:
            d = self.diff_scale * y / (self.shift + self.scale * x)
        return dy * d
