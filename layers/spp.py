"""SPP (spatial pyramid pooling), built like BVLC's from internal Pooling, Flatten and Concat layers.

bottom (N, C, H, W). ``spp_param``: ``pyramid_height`` L (at least 1) and ``pool`` MAX or AVE.
Level l (0 <= l < L) pools with ``kernel = ceil(H / 2^l)``, ``stride = kernel`` and
``pad = (kernel * 2^l - H + 1) // 2`` (likewise along W) so that about ``2^l x 2^l`` bins cover
the image; Pooling's own output-size rules apply (ceil rounding, the last window may not start in
the padding, and pad must be smaller than the kernel). L = 1: top is that single pooling's output
(N, C, 1, 1). L > 1: every level is flattened to (N, C*bins_l) and the levels are concatenated
along axis 1, giving (N, C * Σ bins_l). The pooling layers are rebuilt when H or W changes.
Backward sums the gradients of all levels into the bottom.
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, create_layer, register_layer
from pycaffe_lite.schema import caffe_pb2

_SPP = caffe_pb2.SPPParameter
MAX_PYRAMID_HEIGHT = 32
_POOL = {_SPP.MAX: caffe_pb2.PoolingParameter.MAX, _SPP.AVE: caffe_pb2.PoolingParameter.AVE}


def level_geometry(level: int, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(kernel, pad)`` as ``(h, w)`` pairs for pyramid level ``level`` of an H x W input."""
    bins = 2 ** level
    kernel = tuple(-(-size // bins) for size in (height, width))
    pad = tuple((k * bins - size + 1) // 2 for k, size in zip(kernel, (height, width)))
    return kernel, pad


@register_layer("SPP")
class SPPLayer(Layer):
    traits = Traits(graph_safe=True)
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.spp_param
        if not 1 <= p.pyramid_height <= MAX_PYRAMID_HEIGHT:  # (the top level's 2^(L-1) bins exceed any axis)
            raise self.error(f"spp_param.pyramid_height must be 1 to {MAX_PYRAMID_HEIGHT}, got {p.pyramid_height}")
        if p.pool not in _POOL:
            raise self.error("only MAX and AVE spatial pyramid pooling are supported (not STOCHASTIC)")
        self.height = p.pyramid_height
        self._hw: tuple[int, int] | None = None
        levels = range(self.height)
        self.split = [Blob((), self.dtype) for _ in levels]  # share the bottom's data, own diffs
        self.pooled = [Blob((), self.dtype) for _ in levels]
        self.flat = [Blob((), self.dtype) for _ in levels]
        self.pools: list[Layer] = []
        self.flattens = [self._sublayer("Flatten", f"flatten{i}") for i in levels]
        self.concat = self._sublayer("Concat", "concat")

    def _sublayer(self, type_name: str, suffix: str) -> Layer:
        return create_layer(caffe_pb2.LayerParameter(name=f"{self.name}_{suffix}", type=type_name), self.dtype)

    def _pooling(self, level: int, height: int, width: int) -> Layer:
        kernel, pad = level_geometry(level, height, width)
        param = caffe_pb2.LayerParameter(name=f"{self.name}_pool{level}", type="Pooling")
        pp = param.pooling_param
        pp.pool = _POOL[self.layer_param.spp_param.pool]
        pp.kernel_h, pp.kernel_w = kernel
        pp.stride_h, pp.stride_w = kernel
        pp.pad_h, pp.pad_w = pad
        return create_layer(param, self.dtype)

    def reshape(self, bottom, top):
        b = bottom[0]
        if b.num_axes != 4:
            raise self.error(f"bottom must have 4 axes (num, channels, height, width), got {b.shape}")
        hw = b.shape[2:]
        if min(hw) <= 0:
            raise self.error(f"bottom height and width must be positive, got {b.shape}")
        if 2 ** (self.height - 1) > min(hw):  # the top level's windows would be 1 pixel with pads of 1 or more
            raise self.error(f"pyramid_height {self.height} pools the top level into {2 ** (self.height - 1)} bins "
                             f"per side, more than the {hw[0]}x{hw[1]} bottom has pixels")
        rebuild = hw != self._hw
        self._hw = hw
        if self.height == 1:
            if rebuild:
                self.pools = [self._pooling(0, *hw)]
                self.pools[0].setup(bottom, top)
            self.pools[0].reshape(bottom, top)
            return
        if rebuild:
            self.pools = [self._pooling(i, *hw) for i in range(self.height)]
        for i, pool in enumerate(self.pools):
            self.split[i].reshape(b.shape)
            self.split[i].share_data(b)
            if rebuild:
                pool.setup([self.split[i]], [self.pooled[i]])
                self.flattens[i].setup([self.pooled[i]], [self.flat[i]])
            pool.reshape([self.split[i]], [self.pooled[i]])
            self.flattens[i].reshape([self.pooled[i]], [self.flat[i]])
        if rebuild:
            self.concat.setup(self.flat, top)
        self.concat.reshape(self.flat, top)

    def forward_cpu(self, bottom, top):
        if self.height == 1:
            self.pools[0].forward_cpu(bottom, top)
            return
        for i, pool in enumerate(self.pools):
            pool.forward_cpu([self.split[i]], [self.pooled[i]])  # Flatten shares: nothing to run
        self.concat.forward_cpu(self.flat, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.height == 1:
            self.pools[0].backward_cpu(top, propagate_down, bottom)
            return
        self.concat.backward_cpu(top, [True] * self.height, self.flat)
        for i, pool in enumerate(self.pools):
            pool.backward_cpu([self.pooled[i]], [True], [self.split[i]])
        bottom[0].mutable_cpu_diff()[...] = np.sum([s.cpu_diff() for s in self.split], axis=0)

    def forward_gpu(self, bottom, top):
        if self.height == 1:
            self.pools[0].forward_gpu(bottom, top)
            return
        for i, pool in enumerate(self.pools):
            pool.forward_gpu([self.split[i]], [self.pooled[i]])
        self.concat.forward_gpu(self.flat, top)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.height == 1:
            self.pools[0].backward_gpu(top, propagate_down, bottom)
            return
        self.concat.backward_gpu(top, [True] * self.height, self.flat)
        for i, pool in enumerate(self.pools):
            pool.backward_gpu([self.pooled[i]], [True], [self.split[i]])
        gm.weighted_sum(bottom[0].count, [s.gpu_diff() for s in self.split], [1.0] * self.height,
                        bottom[0].mutable_gpu_diff(), self.dtype)
