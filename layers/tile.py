"""Tile: repeat bottom ``tiles`` times along ``axis``.

Viewing bottom as (outer, inner) with ``inner = count(axis:)``, top is (outer, tiles, inner):
each outer block is copied ``tiles`` times. Backward sums the copies.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("Tile")
class TileLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=())
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.tile_param
        if not p.HasField("tiles"):
            raise self.error("tile_param.tiles is required")
        if p.tiles <= 0:
            raise self.error(f"tile_param.tiles must be positive, got {p.tiles}")
        self.tiles = p.tiles

    def reshape(self, bottom, top):
        self.axis = bottom[0].canonical_axis(self.layer_param.tile_param.axis)
        shape = list(bottom[0].shape)
        shape[self.axis] *= self.tiles
        self.outer = bottom[0].count_range(0, self.axis)
        self.inner = bottom[0].count_range(self.axis)
        top[0].reshape(shape)

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data().reshape(self.outer, 1, self.inner)
        y = np.broadcast_to(x, (self.outer, self.tiles, self.inner))
        top[0].mutable_cpu_data()[...] = y.reshape(top[0].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].cpu_diff().reshape(self.outer, self.tiles, self.inner)
        bottom[0].mutable_cpu_diff()[...] = dy.sum(axis=1).reshape(bottom[0].shape)

    def forward_gpu(self, bottom, top):
        n = top[0].count
        k = backend.kernel(KERNELS, "tile_forward", self.dtype)
        k(n, self.inner, self.tiles, bottom[0].gpu_data(), top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].count
        k = backend.kernel(KERNELS, "tile_backward", self.dtype)
        k(n, self.inner, self.tiles, top[0].gpu_diff(), bottom[0].mutable_gpu_diff())
