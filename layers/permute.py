"""Permute (SSD fork, weiliu89/caffe): reorder the axes of a blob, ``top = bottom.transpose(order)``.

``permute_param.order`` lists bottom axes for the first top axes; axes it leaves out follow in
their original order (so ``order: 0 order: 2 order: 3 order: 1`` turns N,C,H,W into N,H,W,C, the
SSD heads' layout). Each order must be below the bottom's axis count and appear once. With the
identity order the top is a copy. Backward applies the inverse permutation to the top diff.
GPU: ``pycaffe_lite.gpu.permute`` plans each direction once per shape (axes collapsed; a
shared-memory tiled transpose when the innermost axis moves, contiguous runs when it stays).
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.gpu import permute
from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("Permute")
class PermuteLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=())
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        naxes = bottom[0].num_axes
        orders: list[int] = []
        for o in self.layer_param.permute_param.order:
            if o >= naxes:
                raise self.error(f"order {o} is not an axis of the bottom of shape {bottom[0].shape} "
                                 f"(orders must be below {naxes})")
            if o in orders:
                raise self.error(f"order {o} appears twice in permute_param.order {list(self.layer_param.permute_param.order)}")
            orders.append(o)
        self.order = orders + [i for i in range(naxes) if i not in orders]
        self.need_permute = self.order != list(range(naxes))
        if top[0] is bottom[0] and self.need_permute:
            raise self.error("cannot run in place with a non-identity order")

    def reshape(self, bottom, top):
        if bottom[0].num_axes != len(self.order):
            raise self.error(f"bottom has shape {bottom[0].shape} but the layer was set up for "
                             f"{len(self.order)} axes")
        top[0].reshape(tuple(bottom[0].shape[o] for o in self.order))
        self._forward = permute.plan(bottom[0].shape, self.order)
        self._backward = self._forward.inverse()

    def forward_cpu(self, bottom, top):
        top[0].mutable_cpu_data()[...] = np.transpose(bottom[0].cpu_data(), self.order)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].mutable_cpu_diff()[...] = np.transpose(top[0].cpu_diff(), np.argsort(self.order))

    def forward_gpu(self, bottom, top):
        self._forward(bottom[0].gpu_data(), top[0].mutable_gpu_data(), self.dtype)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self._backward(top[0].gpu_diff(), bottom[0].mutable_gpu_diff(), self.dtype)
