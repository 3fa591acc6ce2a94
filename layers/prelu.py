"""PReLU: ``y = max(x, 0) + a_c · min(x, 0)`` with a learned slope per channel (axis 1) or one shared.

Bottom: any shape with at least 2 axes, ``(N, C, ...)``. Param blob 0: the slopes, shape ``(C,)``, or
``()`` with ``channel_shared`` (filled by ``prelu_param.filler``, default constant 0.25). Gradients:
``dx = dy · (x > 0 ? 1 : a_c)``; ``da_c += Σ dy · x`` over elements of channel ``c`` with ``x <= 0``
(on the GPU: per-element terms in the workspace, then a channel reduction). In place, the input is
saved before it is overwritten (as Caffe's ``bottom_memory_``).
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite import fillers
from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

from .neuron_layer import NeuronLayer

SLOPE = "slope[(i / dim) % channels / div]"


@register_layer("PReLU")
class PReLULayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('bottom',))
    gpu_forward = f"y[i] = x[i] > 0 ? x[i] : x[i] * {SLOPE}"
    gpu_backward = f"dx[i] = x[i] > 0 ? dy[i] : dy[i] * {SLOPE}"
    gpu_slope_terms = "terms[i] = x[i] <= 0 ? dy[i] * x[i] : Dtype(0)"

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

    def _check_axes(self, blob: Blob) -> None:
        if blob.num_axes < 2:
            raise self.error(f"bottom must have at least 2 axes (N, C, ...), got shape {blob.shape}")

    def reshape(self, bottom, top):
        self._check_axes(bottom[0])
        super().reshape(bottom, top)
        if top[0] is bottom[0]:
            self.bottom_memory.reshape(bottom[0].shape)
        channels = bottom[0].shape[1]  # element i has channel (i / dim) % channels, its slope that / div
        self.geometry = {"channels": channels, "dim": bottom[0].count_range(2),
                         "div": channels if self.channel_shared else 1}

    def gpu_scalars(self):
        return self.geometry

    def _input(self, bottom, top) -> Blob:
        """The forward's input: its saved copy when the layer runs in place."""
        return self.bottom_memory if top[0] is bottom[0] else bottom[0]

    def _slopes(self, ndim: int) -> np.ndarray:
        """Slopes broadcastable against ``x`` (N, C, rest...)."""
        a = self.blobs[0].cpu_data().reshape(-1)
        return a.reshape(()) if self.channel_shared else a.reshape((1, -1) + (1,) * (ndim - 2))

    def forward_cpu(self, bottom, top):
        if top[0] is bottom[0]:
            self.bottom_memory.mutable_cpu_data()[...] = bottom[0].cpu_data()
        super().forward_cpu(bottom, top)

    def cpu_forward(self, x):
        return np.maximum(x, 0) + self._slopes(x.ndim) * np.minimum(x, 0)

    def backward_cpu(self, top, propagate_down, bottom):
        x, dy = self._input(bottom, top).cpu_data(), top[0].cpu_diff()
        # the slope gradient first: in place, writing the bottom diff overwrites the top diff
        if self.param_propagate_down[0]:
            terms = np.where(x <= 0, dy * x, 0)
            axes = None if self.channel_shared else (0,) + tuple(range(2, x.ndim))
            self.blobs[0].mutable_cpu_diff()[...] += terms.sum(axis=axes).reshape(self.blobs[0].shape)
        if propagate_down[0]:
            bottom[0].mutable_cpu_diff()[...] = dy * np.where(x > 0, 1, self._slopes(x.ndim)).astype(x.dtype)

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        if top[0] is bottom[0]:
            gm.copy(n, bottom[0].gpu_data(), self.bottom_memory.mutable_gpu_data(), self.dtype)
        self.launch("forward", self.gpu_forward, n, x=bottom[0].gpu_data(), slope=self.blobs[0].gpu_data(),
                    y=top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        n, x, dy = bottom[0].count, self._input(bottom, top).gpu_data(), top[0].gpu_diff()
        if self.param_propagate_down[0] and n:
            (terms,) = backend.workspace(n * self.dtype.itemsize)
            self.launch("slope_terms", self.gpu_slope_terms, n, x=x, dy=dy, terms=terms)
            slope_diff = self.blobs[0].mutable_gpu_diff()
            if self.channel_shared:
                gm.sum_rows_into(n, 1, terms, slope_diff, self.dtype, beta=1.0)
            else:
                num, channels = bottom[0].shape[:2]
                gm.channel_sum(num, channels, bottom[0].count_range(2), terms, slope_diff, self.dtype, beta=1.0)
        if propagate_down[0]:
            self.launch("backward", self.gpu_backward, n, x=x, slope=self.blobs[0].gpu_data(), dy=dy,
                        dx=bottom[0].mutable_gpu_diff())
