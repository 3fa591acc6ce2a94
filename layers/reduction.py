"""Reduction: reduce all axes from ``axis`` on with SUM, ASUM (Σ|x|), SUMSQ (Σx²) or MEAN, times
``coeff``.

bottom viewed as (num, dim) with ``num = count(:axis)``; top shape ``bottom.shape[:axis]``
(a scalar for axis 0). Gradients: SUM ``coeff``, ASUM ``coeff·sign(x)``, SUMSQ ``2·coeff·x``,
MEAN ``coeff/dim``, each times the top diff of the row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend, blas
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

KERNELS = Path(__file__).with_suffix(".cu")
Op = caffe_pb2.ReductionParameter


@register_layer("Reduction")
class ReductionLayer(Layer):
    traits = Traits(graph_safe=True)
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.reduction_param
        if p.operation not in (Op.SUM, Op.ASUM, Op.SUMSQ, Op.MEAN):
            raise self.error(f"unknown reduction operation {p.operation}")
        self.op = p.operation
        self.coeff = p.coeff
        self._tmp = Blob(dtype=self.dtype)

    def reshape(self, bottom, top):
        self.axis = bottom[0].canonical_axis(self.layer_param.reduction_param.axis)
        self.num = bottom[0].count_range(0, self.axis)
        self.dim = bottom[0].count_range(self.axis)
        top[0].reshape(bottom[0].shape[: self.axis])
        self._tmp.reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data().reshape(self.num, self.dim)
        if self.op == Op.ASUM:
            r = np.abs(x).sum(axis=1)
        elif self.op == Op.SUMSQ:
            r = (x * x).sum(axis=1)
        else:
            r = x.sum(axis=1)
            if self.op == Op.MEAN:
                r = r / self.dim
        top[0].mutable_cpu_data()[...] = (self.coeff * r).reshape(top[0].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = bottom[0].cpu_data().reshape(self.num, self.dim)
        dy = top[0].cpu_diff().reshape(self.num, 1) * self.coeff
        if self.op == Op.SUM:
            dx = np.broadcast_to(dy, x.shape)
        elif self.op == Op.MEAN:
            dx = np.broadcast_to(dy / self.dim, x.shape)
        elif self.op == Op.ASUM:
            dx = np.sign(x) * dy
        else:
            dx = 2 * x * dy
        bottom[0].mutable_cpu_diff()[...] = dx.reshape(bottom[0].shape)

    def forward_gpu(self, bottom, top):
        dt = self.dtype
        x = bottom[0].gpu_data()
        if self.op in (Op.ASUM, Op.SUMSQ):
            tmp = self._tmp.mutable_gpu_data()
            n = bottom[0].count
            if self.op == Op.ASUM:
                gm.abs(n, x, tmp, dt)
            else:
                gm.mul(n, x, x, tmp, dt)
            x = tmp
        alpha = self.coeff / self.dim if self.op == Op.MEAN else self.coeff
        y = top[0].mutable_gpu_data()
        if self.dim == 0:
            gm.set(self.num, 0.0, y, dt)
            return
        ones = gm.ones_vector(self.dim, dt)
        blas.gemv(False, self.num, self.dim, alpha, x, ones, 0.0, y, dt)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].count
        k = backend.kernel(KERNELS, "reduction_backward", self.dtype)
        k(n, self.dim, int(self.op), self.coeff, bottom[0].gpu_data(), top[0].gpu_diff(),
          bottom[0].mutable_gpu_diff())
