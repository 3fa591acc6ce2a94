"""Swish: ``y = x · sigmoid(beta · x)`` (``swish_param.beta``, default 1); any shape.

Backward: ``dx = dy · (beta·y + s·(1 - beta·y))`` with ``s = sigmoid(beta·x)`` kept from the forward
pass (``sigmoid_output``); it reads only the top and ``s``, so in-place use is safe.
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("Swish")
class SwishLayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('bottom', 'top'))
    gpu_forward = "s[i] = Dtype(0.5) * tanh(Dtype(0.5) * beta * x[i]) + Dtype(0.5); y[i] = x[i] * s[i]"
    gpu_backward = "dx[i] = dy[i] * (beta * y[i] + s[i] * (Dtype(1) - beta * y[i]))"

    def layer_setup(self, bottom, top):
        self.beta = float(self.layer_param.swish_param.beta)
        self.sigmoid_output = Blob((), self.dtype)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.sigmoid_output.reshape(bottom[0].shape)

    def gpu_scalars(self):
        return {"beta": self.beta}

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        s = self.sigmoid_output.mutable_cpu_data()
        s[...] = 0.5 * np.tanh(0.5 * self.beta * x) + 0.5  # stable sigmoid
        top[0].mutable_cpu_data()[...] = x * s

    def cpu_backward(self, x, y, dy):
        by = self.beta * y
        return dy * (by + self.sigmoid_output.cpu_data() * (1 - by))

    def forward_gpu(self, bottom, top):
        self.launch("forward", self.gpu_forward, bottom[0].count, x=bottom[0].gpu_data(),
                    s=self.sigmoid_output.mutable_gpu_data(), y=top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.launch("backward", self.gpu_backward, top[0].count, y=top[0].gpu_data(),
                        s=self.sigmoid_output.gpu_data(), dy=top[0].gpu_diff(), dx=bottom[0].mutable_gpu_diff())
