"""MultinomialLogisticLoss: ``loss = -Σ_n log(max(p[n, label_n], 1e-20)) / N`` on given probabilities.

bottom[0]: probabilities (N, ...) read as (N, D), D = count / N (no softmax is applied);
bottom[1]: labels, N values in ``{0..D-1}`` (floats truncated to int), legacy shape (N, 1, 1, 1)
or (N,). top[0]: scalar. Gradient, for the probabilities only: ``-w / N / max(p, 1e-20)`` at each
label position and 0 elsewhere (w = the loss weight). ``1e-20`` is Caffe's ``kLOG_THRESHOLD``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Traits, register_layer

from .loss_layer import LOG_THRESHOLD, LossLayer

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(LossLayer):
    traits = Traits(graph_safe=True, backward_reads=('bottom',))

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        self._loss = Blob((), self.dtype)  # GPU: per-sample losses

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        lab = bottom[1]
        if lab.num_axes > 4 or (lab.channels, lab.height, lab.width) != (1, 1, 1):
            raise self.error(
                f"the label blob must hold one value per "
                f"sample, shape (N, 1, 1, 1) or (N,), got {lab.shape}", ShapeError
            )
        self.classes = self.inner
        self._loss.reshape((self.outer,))

    def _rows_labels(self, bottom) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(self.outer), self.class_labels(bottom[1].cpu_data().reshape(-1))[0]

    def forward_cpu(self, bottom, top):
        prob = bottom[0].cpu_data().reshape(self.outer, self.inner)
        p = np.maximum(prob[self._rows_labels(bottom)], self.dtype.type(LOG_THRESHOLD))
        top[0].mutable_cpu_data()[...] = -np.log(p).sum() / self.normalizer()

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        prob = bottom[0].cpu_data().reshape(self.outer, self.inner)
        at = self._rows_labels(bottom)
        diff = np.zeros((self.outer, self.inner), self.dtype)
        diff[at] = -self.grad_scale(top) / np.maximum(prob[at], self.dtype.type(LOG_THRESHOLD))
        bottom[0].mutable_cpu_diff()[...] = diff.reshape(bottom[0].shape)

    # GPU: a per-sample loss kernel, LossLayer's reduction, a per-element gradient kernel.
    def forward_gpu(self, bottom, top):
        backend.kernel(KERNELS, "mll_forward", self.dtype)(
            self.outer, bottom[0].gpu_data(), bottom[1].gpu_data(), self.inner, self._loss.mutable_gpu_data(),
            self.gpu_status())
        self.gpu_reduce(self.outer, self._loss.gpu_data(), top)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            backend.kernel(KERNELS, "mll_backward", self.dtype)(
                bottom[0].count, bottom[0].gpu_data(), bottom[1].gpu_data(), self.inner, top[0].gpu_diff(),
                self.gpu_norm(), bottom[0].mutable_gpu_diff())
