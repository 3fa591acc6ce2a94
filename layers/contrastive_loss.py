"""ContrastiveLoss (Hadsell et al. 2006), BVLC semantics.

bottom[0], bottom[1]: feature pairs a, b (N, C, 1, 1) or (N, C); bottom[2]: similarity y, N values
(nonzero after truncation to int = similar). With ``d² = ||a - b||²`` and ``m = margin``:
``loss = Σ_n [y ? d² : max(m - d, 0)²] / (2N)``, or with ``legacy_version`` the dissimilar term
``max(m - d², 0)``. Gradients for a (b gets the negative), w = the loss weight, ``α = w/N``:
similar ``α·(a - b)``; dissimilar, when the margin term is positive, ``-α·(a - b)`` (legacy) or
``-α·(m - d)/(d + 1e-4)·(a - b)`` (Caffe's epsilon, so the gradient is slightly inexact);
0 otherwise. No gradient for y.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Traits, register_layer

from .loss_layer import LossLayer

KERNELS = Path(__file__).with_suffix(".cu")
EPSILON = 1e-4


@register_layer("ContrastiveLoss")
class ContrastiveLossLayer(LossLayer):
    traits = Traits(graph_safe=True, backward_reads=('bottom',))
    exact_num_bottom_blobs = 3
    label_bottoms = (2,)

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        p = self.layer_param.contrastive_loss_param
        self.margin = float(p.margin)
        self.legacy = bool(p.legacy_version)
        self.diff = Blob((), self.dtype)  # a - b
        self.dist_sq = Blob((), self.dtype)  # data: ||a - b||² per pair; diff: per-pair loss (GPU)

    def reshape(self, bottom, top):
        a, b, y = bottom
        ok = (a.num_axes in (2, 4) and a.shape == b.shape and a.count_range(2) == 1 and y.num_axes >= 1
              and y.shape[0] == a.shape[0] and y.count == a.shape[0])
        if not ok:
            raise self.error(
                f"expected features (N, C, 1, 1) or (N, C) of one "
                f"shape and N similarity labels, got {a.shape}, {b.shape} and {y.shape}", ShapeError
            )
        super().reshape(bottom, top)
        self.channels = a.shape[1]
        self.diff.reshape((self.outer, self.channels))
        self.dist_sq.reshape((self.outer,))

    # -- CPU --------------------------------------------------------------------------------
    def _similar(self, bottom) -> np.ndarray:
        return bottom[2].cpu_data().reshape(-1).astype(np.int64) != 0

    def forward_cpu(self, bottom, top):
        d = bottom[0].cpu_data().reshape(self.outer, -1) - bottom[1].cpu_data().reshape(self.outer, -1)
        self.diff.mutable_cpu_data()[...] = d
        dist_sq = (d * d).sum(axis=1)
        self.dist_sq.mutable_cpu_data()[...] = dist_sq
        if self.legacy:
            apart = np.maximum(self.margin - dist_sq, 0)
        else:
            apart = np.maximum(self.margin - np.sqrt(dist_sq), 0) ** 2
        loss = np.where(self._similar(bottom), dist_sq, apart).sum()
        top[0].mutable_cpu_data()[...] = loss / self.normalizer() / 2

    def backward_cpu(self, top, propagate_down, bottom):
        d = self.diff.cpu_data()
        dist_sq = self.dist_sq.cpu_data()
        if self.legacy:
            mdist = self.margin - dist_sq
            beta = np.full(self.outer, -1.0)
        else:
            dist = np.sqrt(dist_sq)
            mdist = self.margin - dist
            beta = -mdist / (dist + EPSILON)
        factor = np.where(self._similar(bottom), 1.0, np.where(mdist > 0, beta, 0.0))  # per pair, times α
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                g = (sign * self.grad_scale(top)) * factor[:, None] * d
                bottom[i].mutable_cpu_diff()[...] = g.reshape(bottom[i].shape)

    # -- GPU: a per-pair kernel (a - b, distance, loss), LossLayer's reduction, a gradient kernel --
    def forward_gpu(self, bottom, top):
        backend.kernel(KERNELS, "contrastive_forward", self.dtype)(
            self.outer, self.channels, bottom[0].gpu_data(), bottom[1].gpu_data(), bottom[2].gpu_data(),
            self.margin, int(self.legacy), self.diff.mutable_gpu_data(), self.dist_sq.mutable_gpu_data(),
            self.dist_sq.mutable_gpu_diff(),
        )
        self.gpu_reduce(self.outer, self.dist_sq.gpu_diff(), top, scale=0.5)

    def backward_gpu(self, top, propagate_down, bottom):
        k = backend.kernel(KERNELS, "contrastive_backward", self.dtype)
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                k(self.outer * self.channels, self.channels, self.diff.gpu_data(), self.dist_sq.gpu_data(),
                  bottom[2].gpu_data(), self.margin, int(self.legacy), sign, top[0].gpu_diff(),
                  self.gpu_norm(), bottom[i].mutable_gpu_diff())
