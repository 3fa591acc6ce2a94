"""Normalize (SSD fork, weiliu89/caffe): L2 normalization with a learned scale (SSD's conv4_3_norm).

Bottom ``(N, C, ...)`` with at least 2 axes; S = the product of the axes after C. With
``across_spatial`` (default) each sample is divided by ``sqrt(Σ x² + eps)`` over all its C·S values;
otherwise each position by ``sqrt(eps + Σ_c x²)`` over its C channels. The result is multiplied by
the scale blob: one value (``channel_shared``, default) or one per channel, filled by
``scale_filler`` (default constant 1). Top: the bottom's shape. Backward uses the exact derivative
of ``y = s·x / norm`` (``dx = s·dy/norm − x·Σ(s·dy·x)/norm³``); the fork's own backward leaves
the per-channel scale out of the sum, which differs from this only with ``channel_shared: false``.
Not in place (the backward reads the input).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite import fillers
from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

KERNELS = Path(__file__).with_suffix(".cu")
THREADS = 256  # NORMALIZE_THREADS in normalize.cu


@register_layer("Normalize")
class NormalizeLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=('bottom',))
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        self._check(bottom, top)
        p = self.layer_param.norm_param
        self.across_spatial = p.across_spatial
        self.channel_shared = p.channel_shared
        self.eps = float(p.eps)
        if self.eps < 0:
            raise self.error(f"norm_param.eps must be non-negative, got {self.eps}")
        channels = bottom[0].shape[1]
        if not self.blobs:
            blob = self.make_param_blob(() if self.channel_shared else (channels,))
            filler = (p.scale_filler if p.HasField("scale_filler")
                      else caffe_pb2.FillerParameter(type="constant", value=1.0))
            fillers.fill(blob, filler)
            self.blobs = [blob]
        expected = 1 if self.channel_shared else channels
        if self.blobs[0].count != expected:
            raise self.error(f"scale blob has {self.blobs[0].count} values but "
                             + ("channel_shared needs 1" if self.channel_shared
                                else f"the bottom has {channels} channels"))
        self.norm = Blob((), self.dtype)  # per sample or per position, kept for the backward
        self.dots = Blob((), self.dtype)

    def _check(self, bottom, top):
        if bottom[0].num_axes < 2:
            raise self.error(f"bottom must have at least 2 axes (N, C, ...), got shape {bottom[0].shape}")
        if top[0] is bottom[0]:
            raise self.error("cannot run in place (its backward reads the input)")

    def reshape(self, bottom, top):
        self._check(bottom, top)
        top[0].reshape(bottom[0].shape)
        num, channels = bottom[0].shape[:2]
        self.spatial = bottom[0].count_range(2)
        if not self.channel_shared and channels != self.blobs[0].count:
            raise self.error(f"bottom has {channels} channels but the scale blob {self.blobs[0].count}")
        groups = (num,) if self.across_spatial else (num, self.spatial)
        self.norm.reshape(groups)
        self.dots.reshape(groups)

    # -- CPU --------------------------------------------------------------------------------
    def _views(self, blob_array):
        num, channels = blob_array.shape[:2]
        return blob_array.reshape(num, channels, -1)

    def _scale(self, channels):
        s = self.blobs[0].cpu_data().reshape(-1)
        return s.reshape(1, 1, 1) if self.channel_shared else s.reshape(1, channels, 1)

    def _norm_view(self, norm):
        return norm.reshape(-1, 1, 1) if self.across_spatial else norm.reshape(norm.shape[0], 1, -1)

    def forward_cpu(self, bottom, top):
        x = self._views(bottom[0].cpu_data())
        sq = x * x
        if self.across_spatial:
            norm = np.sqrt(sq.reshape(x.shape[0], -1).sum(axis=1) + self.eps)
        else:
            norm = np.sqrt(self.eps + sq.sum(axis=1))
        self.norm.mutable_cpu_data()[...] = norm
        y = x / self._norm_view(norm) * self._scale(x.shape[1])
        top[0].mutable_cpu_data()[...] = y.reshape(top[0].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        x = self._views(bottom[0].cpu_data())
        dy = self._views(top[0].cpu_diff())
        r = self._norm_view(self.norm.cpu_data())
        s = self._scale(x.shape[1])
        if self.param_propagate_down[0]:
            terms = dy * x / r
            diff = self.blobs[0].mutable_cpu_diff()
            diff[...] += terms.sum() if self.channel_shared else terms.sum(axis=(0, 2)).reshape(diff.shape)
        if propagate_down[0]:
            sdx = s * dy * x
            t = sdx.reshape(x.shape[0], -1).sum(axis=1).reshape(-1, 1, 1) if self.across_spatial \
                else sdx.sum(axis=1, keepdims=True)
            dx = s * dy / r - x * t / (r * r * r)
            bottom[0].mutable_cpu_diff()[...] = dx.reshape(bottom[0].shape)

    # -- GPU --------------------------------------------------------------------------------
    def _geometry(self, bottom):
        num, channels = bottom[0].shape[:2]
        return num, channels, self.spatial, channels * self.spatial

    def _pixel_launch(self, spatial):
        """(tiles per sample, block) of the per-position kernels: tx positions a block, tx the least
        power of two >= ``spatial`` up to 32, ty = THREADS / tx channel lanes."""
        tx = min(32, 1 << max(spatial - 1, 0).bit_length())
        tiles = -(-spatial // tx)
        return tiles, (tx, THREADS // tx, 1)

    def forward_gpu(self, bottom, top):
        num, channels, spatial, dim = self._geometry(bottom)
        n = bottom[0].count
        if n == 0:
            return
        x, norm = bottom[0].gpu_data(), self.norm.mutable_gpu_data()
        scale = self.blobs[0].gpu_data()
        if not self.across_spatial:
            tiles, block = self._pixel_launch(spatial)
            backend.kernel(KERNELS, "normalize_pixels_forward", self.dtype)(
                channels, spatial, tiles, int(self.channel_shared), self.eps, x, scale, norm,
                top[0].mutable_gpu_data(), grid=num * tiles, block=block)
            return
        backend.kernel(KERNELS, "normalize_norm_across", self.dtype)(dim, self.eps, x, norm, grid=num, block=THREADS)
        backend.kernel(KERNELS, "normalize_forward", self.dtype)(
            n, dim, channels, spatial, 1, int(self.channel_shared), x, self.norm.gpu_data(), scale,
            top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        num, channels, spatial, dim = self._geometry(bottom)
        n = bottom[0].count
        if n == 0:
            return
        if not self.across_spatial:
            self._backward_pixels(top, propagate_down, bottom)
            return
        x, dy, norm = bottom[0].gpu_data(), top[0].gpu_diff(), self.norm.gpu_data()
        shared = int(self.channel_shared)
        if self.param_propagate_down[0]:
            (terms,) = backend.workspace(n * self.dtype.itemsize)
            backend.kernel(KERNELS, "normalize_scale_terms", self.dtype)(n, dim, spatial, 1, x, dy, norm, terms)
            diff = self.blobs[0].mutable_gpu_diff()
            if self.channel_shared:
                gm.sum_rows_into(n, 1, terms, diff, self.dtype, beta=1.0)
            else:
                gm.channel_sum(num, channels, spatial, terms, diff, self.dtype, beta=1.0)
        if propagate_down[0]:
            scale, t = self.blobs[0].gpu_data(), self.dots.mutable_gpu_data()
            backend.kernel(KERNELS, "normalize_dot_across", self.dtype)(
                dim, channels, spatial, shared, x, dy, scale, t, grid=num, block=THREADS)
            backend.kernel(KERNELS, "normalize_backward", self.dtype)(
                n, dim, channels, spatial, 1, shared, x, dy, norm, self.dots.gpu_data(), scale,
                bottom[0].mutable_gpu_diff())

    def _backward_pixels(self, top, propagate_down, bottom):
        """Per position: one kernel reads x and dy for the dot products (and the scale gradient's
        per-block partial sums), then again for dx; the partials are summed over blocks after."""
        num, channels, spatial, _ = self._geometry(bottom)
        do_scale, do_dx = bool(self.param_propagate_down[0]), bool(propagate_down[0])
        if not (do_scale or do_dx):
            return
        tiles, block = self._pixel_launch(spatial)
        blocks = num * tiles
        (partial,) = backend.workspace((blocks * channels if do_scale else 1) * self.dtype.itemsize)
        dx = bottom[0].mutable_gpu_diff() if do_dx else partial
        backend.kernel(KERNELS, "normalize_pixels_backward", self.dtype)(
            channels, spatial, tiles, int(self.channel_shared), int(do_dx), int(do_scale),
            bottom[0].gpu_data(), top[0].gpu_diff(), self.norm.gpu_data(), self.blobs[0].gpu_data(),
            self.dots.mutable_gpu_data(), partial, dx, grid=blocks, block=block)
        if do_scale:
            diff = self.blobs[0].mutable_gpu_diff()
            if self.channel_shared:
                gm.sum_rows_into(blocks * channels, 1, partial, diff, self.dtype, beta=1.0)
            else:
                gm.sum_rows_into(blocks, channels, partial, diff, self.dtype, beta=1.0)
