"""MVN: mean-variance normalization of each (num, channel) plane, or of each num with
``across_channels``.

Viewing bottom as (rows, dim): ``y = x - mean(x)``, then with ``normalize_variance``
``y /= sqrt(mean(y²)) + eps`` (Caffe adds eps to the standard deviation). The gradient is
Caffe's: ``dx = (dy - (Σdy + y·Σ(dy·y)) / dim) / std``, or ``dy - mean(dy)`` without variance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend, blas
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("MVN")
class MVNLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=('bottom', 'top'))
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.mvn_param
        self.normalize_variance = p.normalize_variance
        self.across_channels = p.across_channels
        self.eps = p.eps
        self._rows_a = Blob(dtype=self.dtype)
        self._rows_b = Blob(dtype=self.dtype)
        self._std = Blob(dtype=self.dtype)
        self._tmp = Blob(dtype=self.dtype)

    def reshape(self, bottom, top):
        b = bottom[0]
        self.rows = b.num if self.across_channels else b.num * b.channels
        self.dim = b.count // self.rows if self.rows else 0
        top[0].reshape(b.shape)
        for blob in (self._rows_a, self._rows_b, self._std):
            blob.reshape((self.rows,))
        self._tmp.reshape(b.shape)

    # -- CPU --------------------------------------------------------------------------------
    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data().reshape(self.rows, self.dim)
        y = x - x.mean(axis=1, keepdims=True)
        if self.normalize_variance:
            std = np.sqrt((y * y).mean(axis=1)) + self.eps
            self._std.mutable_cpu_data()[...] = std
            y = y / std[:, None]
        top[0].mutable_cpu_data()[...] = y.reshape(top[0].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].cpu_diff().reshape(self.rows, self.dim)
        if self.normalize_variance:
            y = top[0].cpu_data().reshape(self.rows, self.dim)
            s = dy.sum(axis=1, keepdims=True) + y * (dy * y).sum(axis=1, keepdims=True)
            dx = (dy - s / self.dim) / self._std.cpu_data()[:, None]
        else:
            dx = dy - dy.mean(axis=1, keepdims=True)
        bottom[0].mutable_cpu_diff()[...] = dx.reshape(bottom[0].shape)

    # -- GPU --------------------------------------------------------------------------------
    def _row_sums(self, x: int, alpha: float, out: int) -> None:
        """``out[r] = alpha · Σ_j x[r, j]``."""
        ones = gm.ones_vector(self.dim, self.dtype)
        blas.gemv(False, self.rows, self.dim, alpha, x, ones, 0.0, out, self.dtype)

    def forward_gpu(self, bottom, top):
        n, dim, dt = bottom[0].count, self.dim, self.dtype
        if n == 0:
            return
        mean = self._rows_a.mutable_gpu_data()
        self._row_sums(bottom[0].gpu_data(), 1.0 / dim, mean)
        y = top[0].mutable_gpu_data()
        backend.kernel(KERNELS, "mvn_sub_row", dt)(n, dim, bottom[0].gpu_data(), mean, y)
        if not self.normalize_variance:
            return
        tmp = self._tmp.mutable_gpu_data()
        gm.mul(n, y, y, tmp, dt)
        std = self._std.mutable_gpu_data()
        self._row_sums(tmp, 1.0 / dim, std)
        gm.sqrt(self.rows, std, std, dt)
        gm.add_scalar(self.rows, self.eps, std, dt)
        backend.kernel(KERNELS, "mvn_div_row", dt)(n, dim, std, y)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n, dim, dt = top[0].count, self.dim, self.dtype
        if n == 0:
            return
        dy = top[0].gpu_diff()
        sum_dy = self._rows_a.mutable_gpu_data()
        dx = bottom[0].mutable_gpu_diff()
        if not self.normalize_variance:
            self._row_sums(dy, 1.0 / dim, sum_dy)
            backend.kernel(KERNELS, "mvn_sub_row", dt)(n, dim, dy, sum_dy, dx)
            return
        y = top[0].gpu_data()
        tmp = self._tmp.mutable_gpu_data()
        gm.mul(n, dy, y, tmp, dt)
        sum_dyy = self._rows_b.mutable_gpu_data()
        self._row_sums(tmp, 1.0, sum_dyy)
        self._row_sums(dy, 1.0, sum_dy)
        k = backend.kernel(KERNELS, "mvn_backward", dt)
        k(n, dim, dy, y, sum_dy, sum_dyy, self._std.gpu_data(), 1.0 / dim, dx)
