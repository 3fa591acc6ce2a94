"""SmoothL1Loss (Fast / Faster R-CNN's box regression loss).

Bottoms: prediction ``p``, target ``t`` (same shape), and optionally both ``w_in`` and ``w_out``
(same shape; the inside and outside weights: 3 bottoms is an error, as in the fork). With
``d = w_in · (p - t)`` (``w_in = 1`` without weights) and ``s = smooth_l1_loss_param.sigma``:

    f(d) = 0.5 · (s·d)²           if |d| < 1 / s²
           |d| - 0.5 / s²         otherwise
    loss = Σ w_out · f(d) / num       (num = p.shape[0]; loss_param's normalization is ignored)

Backward (to ``p`` with +, to ``t`` with -; never to the weights: as in the fork, a request for
their gradient is ignored, since py-faster-rcnn's nets compute them from layers that need one):
``dp = ± loss_weight / num · f'(d) · w_in · w_out`` with ``f'(d) = s²·d`` inside, ``sign(d)`` outside.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob, math_dtype
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Traits, register_layer

from .loss_layer import REDUCE_THREADS, LossLayer, reduce_blocks

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("SmoothL1Loss")
class SmoothL1LossLayer(LossLayer):
    traits = Traits(graph_safe=True, backward_reads=('bottom',))
    exact_num_bottom_blobs = None
    min_bottom_blobs = 2
    max_bottom_blobs = 4
    label_bottoms = ()  # prediction and target both may take a gradient; the weights never do

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index < 2

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        if len(bottom) == 3:
            raise self.error("with weights, both the inside and the outside weights are needed (4 bottoms), "
                             "got 3 bottoms")
        sigma = float(np.float32(self.layer_param.smooth_l1_loss_param.sigma))
        if sigma <= 0:
            raise self.error(f"smooth_l1_loss_param.sigma must be positive, got {sigma}")
        self.sigma2 = sigma * sigma
        self.has_weights = len(bottom) == 4
        self.diff = Blob((), self.dtype)  # w_in * (p - t), kept for backward

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != bottom[0].shape:
                raise self.error(f"bottom {i} must have the shape of "
                                 f"bottom 0 {bottom[0].shape}, got {b.shape}", ShapeError)
        self.diff.reshape(bottom[0].shape)

    def _d(self, bottom):
        d = bottom[0].cpu_data() - bottom[1].cpu_data()
        return bottom[2].cpu_data() * d if self.has_weights else d

    def forward_cpu(self, bottom, top):
        d = self._d(bottom)
        self.diff.mutable_cpu_data()[...] = d
        a = np.abs(d)
        f = np.where(a < 1.0 / self.sigma2, 0.5 * self.sigma2 * d * d, a - 0.5 / self.sigma2)
        if self.has_weights:
            f = bottom[3].cpu_data() * f
        top[0].mutable_cpu_data()[...] = float(f.sum()) / self.normalizer()

    def backward_cpu(self, top, propagate_down, bottom):
        d = self.diff.cpu_data()
        g = np.where(np.abs(d) < 1.0 / self.sigma2, self.sigma2 * d, np.sign(d))
        if self.has_weights:
            g = g * bottom[2].cpu_data() * bottom[3].cpu_data()
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                bottom[i].mutable_cpu_diff()[...] = (sign * self.grad_scale(top)) * g

    def forward_gpu(self, bottom, top):
        n, blocks = bottom[0].count, reduce_blocks(bottom[0].count)
        (partials,) = backend.workspace(blocks * math_dtype(self.dtype).itemsize, slot="reduce")  # Mtype sums
        w_in = bottom[2].gpu_data() if self.has_weights else bottom[0].gpu_data()
        w_out = bottom[3].gpu_data() if self.has_weights else bottom[0].gpu_data()
        backend.kernel(KERNELS, "smooth_l1_forward", self.dtype)(
            n, bottom[0].gpu_data(), bottom[1].gpu_data(), w_in, w_out, int(self.has_weights), self.sigma2,
            self.diff.mutable_gpu_data(), partials, grid=blocks, block=REDUCE_THREADS,
        )
        self.gpu_finish(blocks, partials, top)

    def backward_gpu(self, top, propagate_down, bottom):
        k = backend.kernel(KERNELS, "smooth_l1_backward", self.dtype)
        w_in = bottom[2].gpu_data() if self.has_weights else self.diff.gpu_data()
        w_out = bottom[3].gpu_data() if self.has_weights else self.diff.gpu_data()
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                k(bottom[i].count, sign, top[0].gpu_diff(), self.gpu_norm(), self.diff.gpu_data(), w_in, w_out,
                  int(self.has_weights), self.sigma2, bottom[i].mutable_gpu_diff())
