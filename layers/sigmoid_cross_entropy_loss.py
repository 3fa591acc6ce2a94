"""SigmoidCrossEntropyLoss: cross-entropy of ``sigmoid(x)`` against targets in [0, 1] (BVLC master).

bottom[0]: scores x (N, ...); bottom[1]: targets t with the same count. Per element, computed
stably: ``l = max(x, 0) - x·t + log(1 + exp(-|x|))``. top[0]: ``Σ l / normalizer`` over the
elements that count. ``loss_param``: ``ignore_label`` (elements whose target, truncated to int,
equals it give no loss and no gradient) and ``normalization`` (see :mod:`loss_layer`; Caffe's
default here is BATCH_SIZE). Targets are not range-checked. Gradient, for the scores only:
``(sigmoid(x) - t) · w / normalizer`` (0 where ignored; w = the loss weight).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Traits, register_layer

from .loss_layer import LossLayer, Norm

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(LossLayer):
    traits = Traits(graph_safe=True, backward_reads=('bottom',))
    default_normalization = Norm.BATCH_SIZE
    uses_ignore_label = True

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        self._buf = Blob((), self.dtype)  # GPU: data = per-element loss, diff = counted flags

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].count != bottom[1].count:
            raise self.error(
                f"inputs must have the same count, got "
                f"scores {bottom[0].shape} and targets {bottom[1].shape}", ShapeError
            )
        self._buf.reshape(bottom[0].shape)

    # -- CPU --------------------------------------------------------------------------------
    def _valid(self, target: np.ndarray) -> np.ndarray:
        if not self.has_ignore_label:
            return np.ones(target.shape, bool)
        return target.astype(np.int64) != self.ignore_label

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        t = bottom[1].cpu_data().reshape(x.shape)
        valid = self._valid(t)
        loss = np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))
        top[0].mutable_cpu_data()[...] = loss[valid].sum() / self.normalizer(int(valid.sum()))

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = bottom[0].cpu_data()
        t = bottom[1].cpu_data().reshape(x.shape)
        valid = self._valid(t)
        e = np.exp(-np.abs(x))
        sigmoid = np.where(x >= 0, 1 / (1 + e), e / (1 + e))
        scale = self.grad_scale(top, int(valid.sum()))
        bottom[0].mutable_cpu_diff()[...] = np.where(valid, (sigmoid - t) * scale, 0)

    # -- GPU: per-element kernel, LossLayer's reduction, gradient kernel ------------------------
    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        loss, valid = self._buf.mutable_gpu_data(), self._buf.mutable_gpu_diff()
        backend.kernel(KERNELS, "sigmoid_ce_forward", self.dtype)(
            n, bottom[0].gpu_data(), bottom[1].gpu_data(), int(self.has_ignore_label), self.ignore_label,
            loss, valid,
        )
        self.gpu_reduce(n, loss, top, valid if self.has_ignore_label else None)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            backend.kernel(KERNELS, "sigmoid_ce_backward", self.dtype)(
                bottom[0].count, bottom[0].gpu_data(), bottom[1].gpu_data(), int(self.has_ignore_label),
                self.ignore_label, top[0].gpu_diff(), self.gpu_norm(), bottom[0].mutable_gpu_diff(),
            )
