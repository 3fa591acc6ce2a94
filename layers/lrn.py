"""LRN: local response normalization of an (N, C, H, W) blob, ``y = x · scale^-beta``.

ACROSS_CHANNELS: ``scale = k + alpha/size · Σ x²`` over the ``local_size`` channels centred on each
channel (zero beyond the edges). WITHIN_CHANNEL (as Caffe builds it from square, AVE pooling with
pad ``(size-1)/2`` and a power layer): ``scale = 1 + alpha/size² · Σ x²`` over the size×size spatial
window (zero-padded; ``k`` is not used). Backward, with ``n`` the window's element count:
``dx = dy · scale^-beta - (2·alpha·beta/n) · x · Σ_window(dy · y / scale)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

KERNELS = Path(__file__).with_suffix(".cu")
ACROSS = caffe_pb2.LRNParameter.ACROSS_CHANNELS
WITHIN = caffe_pb2.LRNParameter.WITHIN_CHANNEL


def window_sum(a: np.ndarray, size: int, axes: tuple[int, ...]) -> np.ndarray:
    """Sum of ``a`` over a centred window of odd ``size`` along each of ``axes`` (zero-padded)."""
    pre = (size - 1) // 2
    for ax in axes:
        pad = [(0, 0)] * a.ndim
        pad[ax] = (pre, pre)
        p = np.pad(a, pad)
        n = a.shape[ax]
        total = np.take(p, np.arange(0, n), axis=ax)
        for j in range(1, size):
            total = total + np.take(p, np.arange(j, j + n), axis=ax)
        a = total
    return a


@register_layer("LRN")
class LRNLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=('bottom', 'top'))
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.lrn_param
        self.size = int(p.local_size)
        if self.size % 2 != 1:
            raise self.error(f"LRN only supports odd values for local_size, got {self.size}")
        self.pre_pad = (self.size - 1) // 2
        self.alpha, self.beta, self.k = float(p.alpha), float(p.beta), float(p.k)
        self.region = p.norm_region
        if self.region not in (ACROSS, WITHIN):
            raise self.error(f"unknown norm_region {self.region}")
        self.scale = Blob((), self.dtype)  # the denominator base, kept for backward

    def reshape(self, bottom, top):
        if bottom[0].num_axes != 4:
            raise self.error(
                f"input must have 4 axes (num, channels, height, width), "
                f"got shape {bottom[0].shape}", ShapeError
            )
        top[0].reshape(bottom[0].shape)
        self.scale.reshape(bottom[0].shape)

    def _window(self) -> tuple[tuple[int, ...], float, float]:
        """(axes summed over, window element count, constant term of the scale)."""
        if self.region == ACROSS:
            return (1,), float(self.size), self.k
        return (2, 3), float(self.size * self.size), 1.0

    # -- CPU --------------------------------------------------------------------------------
    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        axes, n, base = self._window()
        scale = base + (self.alpha / n) * window_sum(x * x, self.size, axes)
        self.scale.mutable_cpu_data()[...] = scale
        top[0].mutable_cpu_data()[...] = x * np.power(scale, -self.beta)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x, y, dy = bottom[0].cpu_data(), top[0].cpu_data(), top[0].cpu_diff()
        scale = self.scale.cpu_data()
        axes, n, _ = self._window()
        acc = window_sum(dy * y / scale, self.size, axes)
        dx = dy * np.power(scale, -self.beta) - (2.0 * self.alpha * self.beta / n) * x * acc
        bottom[0].mutable_cpu_diff()[...] = dx

    # -- GPU: one thread per element, direct window loops --------------------------------------
    def forward_gpu(self, bottom, top):
        N, C, H, W = bottom[0].shape
        count = bottom[0].count
        axes, n, base = self._window()
        x, s = bottom[0].gpu_data(), self.scale.mutable_gpu_data()
        name = "lrn_scale_across" if self.region == ACROSS else "lrn_scale_within"
        backend.kernel(KERNELS, name, self.dtype)(count, x, C, H, W, self.size, base, self.alpha / n, s)
        backend.kernel(KERNELS, "lrn_output", self.dtype)(count, x, s, -self.beta, top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        N, C, H, W = bottom[0].shape
        count = bottom[0].count
        axes, n, _ = self._window()
        name = "lrn_diff_across" if self.region == ACROSS else "lrn_diff_within"
        backend.kernel(KERNELS, name, self.dtype)(
            count, bottom[0].gpu_data(), top[0].gpu_data(), top[0].gpu_diff(), self.scale.gpu_data(),
            C, H, W, self.size, -self.beta, 2.0 * self.alpha * self.beta / n, bottom[0].mutable_gpu_diff(),
        )
