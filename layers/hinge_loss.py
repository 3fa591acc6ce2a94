"""HingeLoss: one-vs-all hinge loss, L1 or L2 (``hinge_loss_param.norm``), BVLC semantics.

bottom[0]: scores (N, ...) read as (N, D); bottom[1]: N labels in ``{0..D-1}`` (floats truncated
to int). With ``s = -1`` at the label and ``+1`` elsewhere, ``d = max(0, 1 + s·x)``;
top[0]: ``Σ d / N`` (L1) or ``Σ d² / N`` (L2). Gradient, for the scores only:
``s·sign(d)·w/N`` (L1; 0 where d = 0) or ``2·s·d·w/N`` (L2), w = the loss weight.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob, math_dtype
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

from .loss_layer import REDUCE_THREADS, LossLayer, reduce_blocks

KERNELS = Path(__file__).with_suffix(".cu")
_L2 = caffe_pb2.HingeLossParameter.L2


@register_layer("HingeLoss")
class HingeLossLayer(LossLayer):
    traits = Traits(graph_safe=True, backward_reads=('bottom',))

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        self.squared = self.layer_param.hinge_loss_param.norm == _L2
        self.margins = Blob((), self.dtype)  # d = max(0, 1 + s·x), kept for backward

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[1].count != self.outer:
            raise self.error(
                f"the label blob must hold one value per sample "
                f"({self.outer}), got shape {bottom[1].shape}", ShapeError
            )
        self.classes = self.inner
        self.margins.reshape((self.outer, self.inner))

    def _at_labels(self, bottom) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(self.outer), self.class_labels(bottom[1].cpu_data().reshape(-1))[0]

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data().reshape(self.outer, self.inner).copy()
        x[self._at_labels(bottom)] *= -1
        d = np.maximum(0, 1 + x)
        self.margins.mutable_cpu_data()[...] = d
        loss = (d * d).sum() if self.squared else d.sum()
        top[0].mutable_cpu_data()[...] = loss / self.normalizer()

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        g = self.margins.cpu_data().copy()
        g[self._at_labels(bottom)] *= -1
        scale = self.grad_scale(top)
        g = 2 * g * scale if self.squared else np.sign(g) * scale
        bottom[0].mutable_cpu_diff()[...] = g.reshape(bottom[0].shape)

    # GPU: margins fused with the first reduction stage, LossLayer's finish, gradient kernel.
    def forward_gpu(self, bottom, top):
        count, blocks = bottom[0].count, reduce_blocks(bottom[0].count)
        (partials,) = backend.workspace(blocks * math_dtype(self.dtype).itemsize, slot="reduce")  # Mtype sums
        backend.kernel(KERNELS, "hinge_forward", self.dtype)(
            count, bottom[0].gpu_data(), bottom[1].gpu_data(), self.inner, int(self.squared),
            self.margins.mutable_gpu_data(), partials, self.gpu_status(), grid=blocks, block=REDUCE_THREADS,
        )
        self.gpu_finish(blocks, partials, top)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            backend.kernel(KERNELS, "hinge_backward", self.dtype)(
                bottom[0].count, self.margins.gpu_data(), bottom[1].gpu_data(), self.inner, int(self.squared),
                top[0].gpu_diff(), self.gpu_norm(), bottom[0].mutable_gpu_diff(),
            )
