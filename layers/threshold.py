"""Threshold: ``y = 1`` where ``x > threshold``, else 0 (``threshold_param.threshold``, default 0).

Any shape; forward only: the step function has no useful gradient, and, as in Caffe, asking for
the bottom gradient is an error.
"""

from __future__ import annotations

from pathlib import Path

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_name("elementwise_activations.cu")


@register_layer("Threshold")
class ThresholdLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        self.threshold = float(self.layer_param.threshold_param.threshold)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        top[0].mutable_cpu_data()[...] = (x > self.dtype.type(self.threshold)).astype(self.dtype)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error(
                "backward is not implemented (a step function has no gradient, as in Caffe); "
                "do not back-propagate through it (e.g. set propagate_down: false on the consumer)"
            )

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        k = backend.kernel(KERNELS, "threshold_forward", self.dtype, "iPPf")
        k(n, n, bottom[0].gpu_data(), top[0].mutable_gpu_data(), self.threshold)

    def backward_gpu(self, top, propagate_down, bottom):
        self.backward_cpu(top, propagate_down, bottom)
