"""Threshold: ``y = 1`` where ``x > threshold``, else 0 (``threshold_param.threshold``, default 0).

Any shape; forward only: the step function has no useful gradient, and, as in Caffe, asking for
the bottom gradient is an error.
"""

from __future__ import annotations

from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer


@register_layer("Threshold")
class ThresholdLayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=())
    gpu_forward = "y[i] = x[i] > threshold ? Dtype(1) : Dtype(0)"

    def layer_setup(self, bottom, top):
        self.threshold = float(self.layer_param.threshold_param.threshold)

    def gpu_scalars(self):
        return {"threshold": self.threshold}

    def cpu_forward(self, x):
        return (x > self.dtype.type(self.threshold)).astype(self.dtype)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error(
                "backward is not implemented (a step function has no gradient, as in Caffe); "
                "do not back-propagate through it (e.g. set propagate_down: false on the consumer)"
            )

    backward_gpu = backward_cpu
