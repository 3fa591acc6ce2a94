"""Permute (SSD fork, weiliu89/caffe): reorder the axes of a blob, ``top = bottom.transpose(order)``.

``permute_param.order`` lists bottom axes for the first top axes; axes it leaves out follow in
their original order (so ``order: 0 order: 2 order: 3 order: 1`` turns N,C,H,W into N,H,W,C, the
SSD heads' layout). Each order must be below the bottom's axis count and appear once. With the
identity order the top is a copy. Backward scatters the top diff back through the same map.
GPU: one thread per top element reading an int32 table [top shape | permuted bottom strides].
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, register_layer


@register_layer("Permute")
class PermuteLayer(Layer):
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
        self._table_blob = Blob(dtype=np.float32)
        self._table_key: tuple | None = None

    def reshape(self, bottom, top):
        if bottom[0].num_axes != len(self.order):
            raise self.error(f"bottom has shape {bottom[0].shape} but the layer was set up for "
                             f"{len(self.order)} axes")
        top[0].reshape(tuple(bottom[0].shape[o] for o in self.order))

    def forward_cpu(self, bottom, top):
        top[0].mutable_cpu_data()[...] = np.transpose(bottom[0].cpu_data(), self.order)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].mutable_cpu_diff()[...] = np.transpose(top[0].cpu_diff(), np.argsort(self.order))

    def _table(self, bottom, top) -> int:
        naxes = len(self.order)
        strides = [bottom[0].count_range(i + 1) for i in range(naxes)]
        key = (tuple(top[0].shape), tuple(strides))
        if self._table_key != key:
            self._table_blob.reshape((2 * naxes,))
            self._table_blob.mutable_cpu_data().view(np.int32)[...] = (
                list(top[0].shape) + [strides[o] for o in self.order])
            self._table_key = key
        return self._table_blob.gpu_data()

    def forward_gpu(self, bottom, top):
        n = top[0].count
        if n == 0:
            return
        if not self.need_permute:
            gm.copy(n, bottom[0].gpu_data(), top[0].mutable_gpu_data(), self.dtype)
            return
        gm.permute_axes(n, len(self.order), self._table(bottom, top), True, bottom[0].gpu_data(),
                        top[0].mutable_gpu_data(), self.dtype)

    def backward_gpu(self, top, propagate_down, bottom):
        n = top[0].count
        if not propagate_down[0] or n == 0:
            return
        if not self.need_permute:
            gm.copy(n, top[0].gpu_diff(), bottom[0].mutable_gpu_diff(), self.dtype)
            return
        gm.permute_axes(n, len(self.order), self._table(bottom, top), False, bottom[0].mutable_gpu_diff(),
                        top[0].gpu_diff(), self.dtype)
