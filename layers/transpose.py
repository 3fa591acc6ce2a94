"""Transpose (CTPN's and the OCR forks' caffe): permute the axes, ``top = bottom.transpose(dim)``.

``transpose_param.dim`` lists, for each top axis i, the bottom axis it takes: one entry per bottom
axis, a permutation of 0..num_axes-1 (``dim: 3 dim: 0 dim: 2 dim: 1`` turns N x C x H x W into
W x N x H x C). Backward applies the inverse permutation to the top diff. Not in place.
GPU: ``pycaffe_lite.gpu.permute`` (one plan per direction and shape, as Permute).
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.gpu import permute
from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("Transpose")
class TransposeLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=())
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        if bottom[0] is top[0]:
            raise self.error("does not work in place (give the top another name)")
        self.dims = tuple(self.layer_param.transpose_param.dim)
        if sorted(self.dims) != list(range(len(self.dims))):
            raise self.error(f"transpose_param.dim {list(self.dims)} must be a permutation of 0..{len(self.dims) - 1}")

    def reshape(self, bottom, top):
        b = bottom[0]
        if b.num_axes != len(self.dims):
            raise self.error(f"transpose_param.dim has {len(self.dims)} entries but the bottom has {b.num_axes} axes "
                             f"(shape {b.shape}); give one per axis")
        top[0].reshape(tuple(b.shape[d] for d in self.dims))
        self._forward = permute.plan(b.shape, self.dims)
        self._backward = self._forward.inverse()

    def forward_cpu(self, bottom, top):
        top[0].mutable_cpu_data()[...] = np.transpose(bottom[0].cpu_data(), self.dims)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].mutable_cpu_diff()[...] = np.transpose(top[0].cpu_diff(), np.argsort(self.dims))

    def forward_gpu(self, bottom, top):
        self._forward(bottom[0].gpu_data(), top[0].mutable_gpu_data(), self.dtype)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self._backward(top[0].gpu_diff(), bottom[0].mutable_gpu_diff(), self.dtype)
