"""Embed: a lookup table. Each bottom value is an integer index in [0, input_dim).

weight (input_dim, num_output), bias (num_output,); top shape ``bottom.shape + (num_output,)``,
``top[..., :] = weight[index] + bias``. Gradients go to the weight rows (summed over repeats) and
the bias; there is none for the index bottom.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite import fillers
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("Embed")
class EmbedLayer(Layer):
    traits = Traits(graph_safe=True)
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def allow_force_backward(self, bottom_index: int) -> bool:
        return False

    def layer_setup(self, bottom, top):
        p = self.layer_param.embed_param
        if not p.num_output:
            raise self.error("embed_param.num_output must be positive")
        if not p.input_dim:
            raise self.error("embed_param.input_dim must be positive")
        self.N = p.num_output
        self.K = p.input_dim
        self.bias_term = p.bias_term
        shapes = [(self.K, self.N)] + ([(self.N,)] if self.bias_term else [])
        if self.blobs:
            if len(self.blobs) != len(shapes):
                raise self.error(f"has {len(self.blobs)} param blobs, expected {len(shapes)}")
            self.check_param_shapes(shapes)
            return
        self.blobs = [self.make_param_blob(s) for s in shapes]
        fillers.fill(self.blobs[0], p.weight_filler)
        if self.bias_term:
            fillers.fill(self.blobs[1], p.bias_filler)

    def reshape(self, bottom, top):
        self.M = bottom[0].count
        top[0].reshape(bottom[0].shape + (self.N,))

    def _indices(self, bottom) -> np.ndarray:
        v = bottom[0].cpu_data().reshape(-1)
        idx = v.astype(np.int64)
        bad = (idx != v) | (idx < 0) | (idx >= self.K)
        if bad.any():
            raise self.error(
                f"bottom value {v[bad][0]!r} is not an integer index in [0, input_dim={self.K})"
            )
        return idx

    def forward_cpu(self, bottom, top):
        y = self.blobs[0].cpu_data()[self._indices(bottom)]
        if self.bias_term:
            y = y + self.blobs[1].cpu_data()
        top[0].mutable_cpu_data()[...] = y.reshape(top[0].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("cannot back-propagate to its input (indices)")
        dy = top[0].cpu_diff().reshape(self.M, self.N)
        if self.param_propagate_down[0]:
            np.add.at(self.blobs[0].mutable_cpu_diff(), self._indices(bottom), dy)
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].mutable_cpu_diff()[...] += dy.sum(axis=0)

    def forward_gpu(self, bottom, top):
        n = self.M * self.N
        y = top[0].mutable_gpu_data()
        k = backend.kernel(KERNELS, "embed_forward", self.dtype)
        k(n, self.N, self.K, bottom[0].gpu_data(), self.blobs[0].gpu_data(), y)
        if self.bias_term:
            gm.add_bias(self.M, self.N, self.blobs[1].gpu_data(), y, self.dtype)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("cannot back-propagate to its input (indices)")
        dy = top[0].gpu_diff()
        if self.param_propagate_down[0]:
            n = self.M * self.N
            k = backend.kernel(KERNELS, "embed_backward", self.dtype)
            k(n, self.N, self.K, bottom[0].gpu_data(), dy, self.blobs[0].mutable_gpu_diff())
        if self.bias_term and self.param_propagate_down[1]:
            gm.sum_rows_into(self.M, self.N, dy, self.blobs[1].mutable_gpu_diff(), self.dtype, beta=1.0)
