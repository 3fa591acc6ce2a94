"""HingeLoss: one-vs-all hinge loss, L1 or L2 (``hinge_loss_param.norm``), BVLC semantics.

bottom[0]: scores (N, ...) read as (N, D); bottom[1]: N labels in ``{0..D-1}`` (floats truncated
to int). With ``s = -1`` at the label and ``+1`` elsewhere, ``d = max(0, 1 + s·x)``;
top[0]: ``Σ d / N`` (L1) or ``Σ d² / N`` (L2). Gradient, for the scores only:
``s·sign(d)·w/N`` (L1; 0 where d = 0) or ``2·s·d·w/N`` (L2), w = the loss weight.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend, blas
from pycaffe_lite.layer import Layer, register_layer
from pycaffe_lite.proto import caffe_pb2

from .multinomial_logistic_loss import check_same_num, gpu_sum_into, integer_labels

KERNELS = Path(__file__).with_suffix(".cu")
_L2 = caffe_pb2.HingeLossParameter.L2


@register_layer("HingeLoss")
class HingeLossLayer(Layer):
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1
    is_loss = True
    auto_top_blobs = True

    def layer_setup(self, bottom, top):
        self.squared = self.layer_param.hinge_loss_param.norm == _L2
        self.margins = Blob((), self.dtype)  # d = max(0, 1 + s·x), kept for backward

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def reshape(self, bottom, top):
        self.num = check_same_num(self, bottom)
        if bottom[1].count != self.num:
            raise ShapeError(
                f"layer '{self.name}' (HingeLoss): the label blob must hold one value per sample "
                f"({self.num}), got shape {bottom[1].shape}"
            )
        self.dim = bottom[0].count // self.num
        top[0].reshape(())
        self.margins.reshape((self.num, self.dim))

    def _check_backward(self, propagate_down) -> bool:
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom 1)")
        return bool(propagate_down[0])

    def _labels(self, bottom) -> np.ndarray:
        return integer_labels(self, bottom[1].cpu_data().reshape(-1), self.dim)

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data().reshape(self.num, self.dim).copy()
        rows, labels = np.arange(self.num), self._labels(bottom)
        x[rows, labels] *= -1
        d = np.maximum(0, 1 + x)
        self.margins.mutable_cpu_data()[...] = d
        loss = (d * d).sum() if self.squared else d.sum()
        top[0].mutable_cpu_data()[...] = loss / self.num

    def backward_cpu(self, top, propagate_down, bottom):
        if not self._check_backward(propagate_down):
            return
        g = self.margins.cpu_data().copy()
        g[np.arange(self.num), self._labels(bottom)] *= -1
        scale = float(top[0].cpu_diff()) / self.num
        g = 2 * g * scale if self.squared else np.sign(g) * scale
        bottom[0].mutable_cpu_diff()[...] = g.reshape(bottom[0].shape)

    # GPU: margins kernel, a device-side (squared) sum, gradient kernel: no host reads.
    def forward_gpu(self, bottom, top):
        count, dt = bottom[0].count, self.dtype
        d = self.margins.mutable_gpu_data()
        backend.kernel(KERNELS, "hinge_forward", dt, "iPPiP")(
            count, count, bottom[0].gpu_data(), bottom[1].gpu_data(), self.dim, d)
        out = top[0].mutable_gpu_data()
        if self.squared:
            blas.gemm(False, True, 1, 1, count, 1.0 / self.num, d, d, 0.0, out, dt)
        else:
            gpu_sum_into(count, 1.0 / self.num, d, out, dt)

    def backward_gpu(self, top, propagate_down, bottom):
        if not self._check_backward(propagate_down):
            return
        count = bottom[0].count
        backend.kernel(KERNELS, "hinge_backward", self.dtype, "iPPiiPfP")(
            count, count, self.margins.gpu_data(), bottom[1].gpu_data(), self.dim, int(self.squared),
            top[0].gpu_diff(), 1.0 / self.num, bottom[0].mutable_gpu_diff(),
        )
