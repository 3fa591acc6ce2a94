"""PReLU: ``y = max(x, 0) + a_c · min(x, 0)`` with a learned slope per channel (axis 1) or one shared.

Bottom: any shape with at least 2 axes, ``(N, C, ...)``. Param blob 0: the slopes, shape ``(C,)``, or
``()`` with ``channel_shared`` (filled by ``prelu_param.filler``, default constant 0.25). Gradients:
``dx = dy · (x > 0 ? 1 : a_c)``; ``da_c += Σ dy · x`` over elements of channel ``c`` with ``x <= 0``.
In place, the input is saved before it is overwritten (as Caffe's ``bottom_memory_``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite import fillers
from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, register_layer
from pycaffe_lite.proto import caffe_pb2

KERNELS = Path(__file__).with_name("elementwise_activations.cu")


@register_layer("PReLU")
class PReLULayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        self._check_axes(bottom[0])
        p = self.layer_param.prelu_param
        self.channel_shared = p.channel_shared
        channels = bottom[0].shape[1]
        if not self.blobs:
            blob = self.make_param_blob(() if self.channel_shared else (channels,))
            filler = p.filler if p.HasField("filler") else caffe_pb2.FillerParameter(type="constant", value=0.25)
            fillers.fill(blob, filler)
            self.blobs = [blob]
        expected = 1 if self.channel_shared else channels
        if self.blobs[0].count != expected:
            raise self.error(
                f"slope blob has {self.blobs[0].count} values but "
                + ("channel_shared needs 1" if self.channel_shared else f"the bottom has {channels} channels")
            )
        self.bottom_memory = Blob((), self.dtype)  # copy of the input for in-place use
        self.param_terms = Blob((), self.dtype)  # GPU scratch for the slope gradient

    def _check_axes(self, blob: Blob) -> None:
        if blob.num_axes < 2:
            raise self.error(f"bottom must have at least 2 axes (N, C, ...), got shape {blob.shape}")

    def reshape(self, bottom, top):
        self._check_axes(bottom[0])
        top[0].reshape(bottom[0].shape)
        if top[0] is bottom[0]:
            self.bottom_memory.reshape(bottom[0].shape)

    def _slopes(self, x_shape) -> np.ndarray:
        """Slopes broadcastable against ``x`` (N, C, rest...)."""
        a = self.blobs[0].cpu_data().reshape(-1)
        if self.channel_shared:
            return a.reshape(())
        return a.reshape((1, -1) + (1,) * (len(x_shape) - 2))

    def _input_cpu(self, bottom, top) -> np.ndarray:
        return self.bottom_memory.cpu_data() if top[0] is bottom[0] else bottom[0].cpu_data()

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        if top[0] is bottom[0]:
            self.bottom_memory.mutable_cpu_data()[...] = x
            x = self.bottom_memory.cpu_data()
        a = self._slopes(x.shape)
        top[0].mutable_cpu_data()[...] = np.maximum(x, 0) + a * np.minimum(x, 0)

    def backward_cpu(self, top, propagate_down, bottom):
        x = self._input_cpu(bottom, top)
        dy = top[0].cpu_diff()
        # the slope gradient first: in place, writing the bottom diff overwrites the top diff
        if self.param_propagate_down[0]:
            terms = np.where(x <= 0, dy * x, 0)
            axes = None if self.channel_shared else (0,) + tuple(range(2, x.ndim))
            self.blobs[0].mutable_cpu_diff()[...] += terms.sum(axis=axes).reshape(self.blobs[0].shape)
        if propagate_down[0]:
            scale = np.where(x > 0, 1, self._slopes(x.shape)).astype(x.dtype)
            bottom[0].mutable_cpu_diff()[...] = dy * scale

    def _geometry(self, blob: Blob) -> tuple[int, int, int, int]:
        n, channels = blob.count, blob.shape[1]
        dim = blob.count_range(2)
        return n, channels, dim, (channels if self.channel_shared else 1)

    def forward_gpu(self, bottom, top):
        n, channels, dim, div = self._geometry(bottom[0])
        x = bottom[0].gpu_data()
        if top[0] is bottom[0]:
            gm.copy(n, x, self.bottom_memory.mutable_gpu_data(), self.dtype)
        k = backend.kernel(KERNELS, "prelu_forward", self.dtype, "iiiPPPi")
        k(n, n, channels, dim, x, top[0].mutable_gpu_data(), self.blobs[0].gpu_data(), div)

    def backward_gpu(self, top, propagate_down, bottom):
        n, channels, dim, div = self._geometry(bottom[0])
        x = self.bottom_memory.gpu_data() if top[0] is bottom[0] else bottom[0].gpu_data()
        dy = top[0].gpu_diff()
        if self.param_propagate_down[0] and n:
            self.param_terms.reshape((n,))
            terms = self.param_terms.mutable_gpu_data()
            backend.kernel(KERNELS, "prelu_param_terms", self.dtype, "iPPP")(n, n, dy, x, terms)
            slope_diff = self.blobs[0].mutable_gpu_diff()
            if self.channel_shared:
                gm.sum_rows_into(n, 1, terms, slope_diff, self.dtype, beta=1.0)
            else:
                gm.channel_sum(bottom[0].shape[0], channels, dim, terms, slope_diff, self.dtype, beta=1.0)
        if propagate_down[0]:
            k = backend.kernel(KERNELS, "prelu_backward", self.dtype, "iiiPPPPi")
            k(n, n, channels, dim, dy, x, bottom[0].mutable_gpu_diff(), self.blobs[0].gpu_data(), div)
