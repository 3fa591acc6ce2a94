"""EuclideanLoss: ``loss = Σ (a - b)² / num / 2`` with ``num = a.shape[0]``.

bottom[0], bottom[1]: same first dimension and same count per item; top[0]: scalar.
Gradients: ``da = +w·(a - b)/num``, ``db = -w·(a - b)/num`` (w = the loss weight); both bottoms
can take a gradient (e.g. a learned target).
"""

from __future__ import annotations

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import blas
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, register_layer


@register_layer("EuclideanLoss")
class EuclideanLossLayer(Layer):
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1
    is_loss = True
    auto_top_blobs = True  # Caffe's LossLayer: a missing top is created

    def layer_setup(self, bottom, top):
        self.diff = Blob((), self.dtype)  # a - b, kept for backward

    def reshape(self, bottom, top):
        a, b = bottom
        if a.num_axes == 0 or b.num_axes == 0 or a.shape[0] != b.shape[0] or a.count_range(1) != b.count_range(1):
            raise ShapeError(
                f"layer '{self.name}' (EuclideanLoss): inputs must have the same first dimension and "
                f"the same count per item, got {a.shape} and {b.shape}"
            )
        top[0].reshape(())
        self.diff.reshape(a.shape)
        self.num = a.shape[0]

    def forward_cpu(self, bottom, top):
        d = bottom[0].cpu_data() - bottom[1].cpu_data().reshape(bottom[0].shape)
        self.diff.mutable_cpu_data()[...] = d
        top[0].mutable_cpu_data()[...] = float(d.ravel() @ d.ravel()) / self.num / 2

    def backward_cpu(self, top, propagate_down, bottom):
        w = float(top[0].cpu_diff())
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                g = (sign * w / self.num) * self.diff.cpu_data()
                bottom[i].mutable_cpu_diff()[...] = g.reshape(bottom[i].shape)

    # GPU: the scalar products are 1-wide GEMMs so the loss and its weight stay on the device
    # (no host read, so the work can be captured into a CUDA graph).
    def forward_gpu(self, bottom, top):
        n, dt = bottom[0].count, self.dtype
        d = self.diff.mutable_gpu_data()
        gm.sub(n, bottom[0].gpu_data(), bottom[1].gpu_data(), d, dt)
        # top(1,1) = d(1,n) · d(1,n)ᵀ / num / 2
        blas.gemm(False, True, 1, 1, n, 0.5 / self.num, d, d, 0.0, top[0].mutable_gpu_data(), dt)

    def backward_gpu(self, top, propagate_down, bottom):
        n, dt = bottom[0].count, self.dtype
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                # dx(1,n) = (sign/num) · w(1,1) · d(1,n), w = the loss weight in top[0].diff
                blas.gemm(False, False, 1, n, 1, sign / self.num, top[0].gpu_diff(), self.diff.gpu_data(),
                          0.0, bottom[i].mutable_gpu_diff(), dt)
