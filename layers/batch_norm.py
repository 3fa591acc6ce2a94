"""BatchNorm: normalize each channel (axis 1) to zero mean and unit variance.

bottom/top (N, C, ...). Params, stored as Caffe stores them: ``mean`` (C), ``variance`` (C) and
a 1-element scale factor ``s``; they are running sums, not learned, so their lr_mult is forced
to 0. With batch statistics (training): ``y = (x - μ_B) / sqrt(σ²_B + eps)``, and the running
sums become ``s = λs + 1``, ``mean = μ_B + λ·mean``, ``variance = m/(m-1)·σ²_B + λ·variance``
(λ = moving_average_fraction, m = N·spatial: the unbiased variance). With global statistics
(default in TEST) ``μ = mean/s`` and ``σ² = variance/s`` (``s == 0`` gives 0).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, register_layer

from .bias import channel_sum

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("BatchNorm")
class BatchNormLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.batch_norm_param
        self.maf = p.moving_average_fraction
        self.use_global_stats = (
            p.use_global_stats if p.HasField("use_global_stats") else self.phase == common.TEST
        )
        self.eps = p.eps
        self.channels = bottom[0].shape[1] if bottom[0].num_axes > 1 else 1
        shapes = [(self.channels,), (self.channels,), (1,)]
        if self.blobs:
            if len(self.blobs) != 3:
                raise self.error(f"has {len(self.blobs)} param blobs, expected 3 (mean, variance, scale factor)")
            self.check_param_shapes(shapes)
        else:
            self.blobs = [self.make_param_blob(s) for s in shapes]  # zeros
        # The statistics are not learned: lr_mult 0 for each, as Caffe forces.
        for i in range(3):
            if len(self.layer_param.param) == i:
                self.layer_param.param.add(lr_mult=0.0)
            elif self.layer_param.param[i].lr_mult != 0:
                raise self.error(
                    f"param {i} has lr_mult {self.layer_param.param[i].lr_mult}: batch normalization "
                    "statistics cannot be learned parameters (leave lr_mult unset or 0)"
                )
        self.param_propagate_down = [False] * 3
        self._mean = Blob((self.channels,), self.dtype)
        self._var = Blob((self.channels,), self.dtype)
        self._std = Blob((self.channels,), self.dtype)
        self._sum_a = Blob((self.channels,), self.dtype)
        self._sum_b = Blob((self.channels,), self.dtype)
        self._x_norm = Blob(dtype=self.dtype)
        self._tmp = Blob(dtype=self.dtype)

    def reshape(self, bottom, top):
        if bottom[0].num_axes > 1 and bottom[0].shape[1] != self.channels:
            raise self.error(f"bottom {bottom[0].shape} has {bottom[0].shape[1]} channels, set up with {self.channels}")
        self.num = bottom[0].shape[0] if bottom[0].num_axes else 1
        self.spatial = bottom[0].count // max(self.num * self.channels, 1)
        top[0].reshape(bottom[0].shape)
        self._x_norm.reshape(bottom[0].shape)
        self._tmp.reshape(bottom[0].shape)

    def _scale_factor(self) -> float:
        s = float(self.blobs[2].cpu_data().reshape(-1)[0])
        return 0.0 if s == 0 else 1.0 / s

    def _bias_correction(self) -> float:
        m = self.num * self.spatial
        return m / (m - 1) if m > 1 else 1.0

    def _view(self, a):
        return a.reshape(self.num, self.channels, self.spatial)

    # -- CPU --------------------------------------------------------------------------------
    def forward_cpu(self, bottom, top):
        x = self._view(bottom[0].cpu_data())
        if self.use_global_stats:
            sf = self._scale_factor()
            mean = sf * self.blobs[0].cpu_data()
            var = sf * self.blobs[1].cpu_data()
        else:
            mean = x.mean(axis=(0, 2))
        xc = x - mean.reshape(1, -1, 1)
        if not self.use_global_stats:
            var = (xc * xc).mean(axis=(0, 2))
            self.blobs[2].mutable_cpu_data()[...] = self.blobs[2].cpu_data() * self.maf + 1
            b0 = self.blobs[0].mutable_cpu_data()
            b0[...] = mean + self.maf * b0
            b1 = self.blobs[1].mutable_cpu_data()
            b1[...] = self._bias_correction() * var + self.maf * b1
        std = np.sqrt(var + self.eps)
        self._std.mutable_cpu_data()[...] = std
        y = xc / std.reshape(1, -1, 1)
        self._x_norm.mutable_cpu_data()[...] = y.reshape(bottom[0].shape)
        top[0].mutable_cpu_data()[...] = y.reshape(top[0].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = self._view(top[0].cpu_diff())
        std = self._std.cpu_data().reshape(1, -1, 1)
        if self.use_global_stats:
            dx = dy / std
        else:
            # dx = (dy - mean(dy) - y·mean(dy·y)) / std, means over (num, spatial) per channel
            y = self._view(self._x_norm.cpu_data())
            dx = (dy - dy.mean(axis=(0, 2), keepdims=True) - y * (dy * y).mean(axis=(0, 2), keepdims=True)) / std
        bottom[0].mutable_cpu_diff()[...] = dx.reshape(bottom[0].shape)

    # -- GPU --------------------------------------------------------------------------------
    def forward_gpu(self, bottom, top):
        n, C, S, N, dt = bottom[0].count, self.channels, self.spatial, self.num, self.dtype
        x = bottom[0].gpu_data()
        mean = self._mean.mutable_gpu_data()
        var = self._var.mutable_gpu_data()
        if self.use_global_stats:
            sf = self._scale_factor()
            gm.scale(C, sf, self.blobs[0].gpu_data(), mean, dt)
            gm.scale(C, sf, self.blobs[1].gpu_data(), var, dt)
        else:
            m = N * S
            channel_sum(N, C, S, x, mean, dt, False)
            gm.scale(C, 1.0 / m, mean, mean, dt)
            tmp = self._tmp.mutable_gpu_data()
            backend.kernel(KERNELS, "bn_sq_dev", dt, "iiiPPP")(n, n, C, S, x, mean, tmp)
            channel_sum(N, C, S, tmp, var, dt, False)
            gm.scale(C, 1.0 / m, var, var, dt)
            s = self.blobs[2].mutable_gpu_data()
            gm.scale(1, self.maf, s, s, dt)
            gm.add_scalar(1, 1.0, s, dt)
            gm.axpby(C, 1.0, mean, self.maf, self.blobs[0].mutable_gpu_data(), dt)
            gm.axpby(C, self._bias_correction(), var, self.maf, self.blobs[1].mutable_gpu_data(), dt)
        std = self._std.mutable_gpu_data()
        gm.copy(C, var, std, dt)
        gm.add_scalar(C, self.eps, std, dt)
        gm.sqrt(C, std, std, dt)
        y = top[0].mutable_gpu_data()
        backend.kernel(KERNELS, "bn_normalize", dt, "iiiPPPP")(n, n, C, S, x, mean, std, y)
        gm.copy(n, y, self._x_norm.mutable_gpu_data(), dt)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n, C, S, N, dt = top[0].count, self.channels, self.spatial, self.num, self.dtype
        dy = top[0].gpu_diff()
        std = self._std.gpu_data()
        if self.use_global_stats:
            backend.kernel(KERNELS, "bn_div_channel", dt, "iiiPPP")(n, n, C, S, dy, std, bottom[0].mutable_gpu_diff())
            return
        y = self._x_norm.gpu_data()
        tmp = self._tmp.mutable_gpu_data()
        gm.mul(n, dy, y, tmp, dt)
        sum_dy = self._sum_a.mutable_gpu_data()
        sum_dyy = self._sum_b.mutable_gpu_data()
        channel_sum(N, C, S, dy, sum_dy, dt, False)
        channel_sum(N, C, S, tmp, sum_dyy, dt, False)
        k = backend.kernel(KERNELS, "bn_backward", dt, "iiiPPPPPfP")
        k(n, n, C, S, dy, y, sum_dy, sum_dyy, std, 1.0 / (N * S), bottom[0].mutable_gpu_diff())
