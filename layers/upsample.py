"""Upsample: SegNet's max-unpooling, or (one bottom) the nearest-neighbour upsampling of YOLOv3 ports.

Two bottoms (caffe-segnet): values (N, C, H, W) and the pooling mask of the same shape (the second
top of a MAX Pooling layer: each value's flat index ``h * Wo + w`` in its output plane). The output
is (N, C, Ho, Wo) with ``Ho, Wo = upsample_h, upsample_w`` when both are set, else
``H · scale_h - pad_out_h`` (``scale_h``/``scale_w`` if both set, else ``scale``, default 2; the
deprecated ``pad_out_*`` need a scale of 2). The top is zero except at the mask positions, which
receive the values (if several values name one position, the last in row-major order wins, on
the CPU and the GPU). Backward: ``dx[i] = dtop[mask[i]]``; the mask takes no gradient. A mask
index outside the output plane is an error on the CPU and skipped on the GPU.

One bottom (YOLOv3 ports, ``upsample_param { scale: s }``): each pixel becomes an s x s block,
``y[h, w] = x[h // s, w // s]`` (``scale_h``/``scale_w`` give the two factors separately); backward
sums each block. With one bottom an unset ``scale`` is 1 (the ports' default), not SegNet's 2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")
CELLS = 4  # output cells of one row per unpool_forward thread
FALLBACK_BLOCKS_PER_SM = 2  # grid of unpool_claim / unpool_write: all resident, so a clear flag costs one wave


@register_layer("Upsample")
class UpsampleLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=())
    min_bottom_blobs = 1
    max_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.upsample_param
        self.unpool = len(bottom) == 2
        # GPU unpooling: two int32 words (the stray flag, a block count), zero at rest; see upsample.cu.
        self.stray = Blob((2,), np.float32)
        self.out_hw = None
        if self.unpool and p.HasField("upsample_h") and p.HasField("upsample_w"):
            if p.upsample_h <= 1 or p.upsample_w <= 1:
                raise self.error(f"upsample_h and upsample_w must be > 1, got {p.upsample_h} and {p.upsample_w}")
            self.out_hw = (int(p.upsample_h), int(p.upsample_w))
            return
        if p.HasField("scale_h") != p.HasField("scale_w"):
            raise self.error("upsample_param needs both scale_h and scale_w (or scale)")
        if p.HasField("scale_h"):
            if p.HasField("scale"):
                raise self.error("upsample_param sets both scale and scale_h/scale_w")
            self.sh, self.sw = int(p.scale_h), int(p.scale_w)
        else:
            s = int(p.scale) if (self.unpool or p.HasField("scale")) else 1
            self.sh = self.sw = s
        least = 2 if self.unpool else 1
        if self.sh < least or self.sw < least:
            raise self.error(f"scale must be >= {least}, got {self.sh} x {self.sw}")
        self.pad_h, self.pad_w = int(p.pad_out_h), int(p.pad_out_w)
        if (self.pad_h and self.sh != 2) or (self.pad_w and self.sw != 2):
            raise self.error("pad_out_h / pad_out_w need a scale of 2")
        if not self.unpool and (self.pad_h or self.pad_w):
            raise self.error("pad_out_h / pad_out_w apply only with a mask bottom")

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index == 0

    def reshape(self, bottom, top):
        x = bottom[0]
        if x.num_axes != 4:
            raise self.error(f"bottom 0 must be (N, C, H, W), got shape {x.shape}")
        if top[0] is x:
            raise self.error("does not allow in-place computation")
        n, c, h, w = x.shape
        if self.unpool:
            if bottom[1].shape != x.shape:
                raise self.error(f"the mask (bottom 1) must have the shape of bottom 0 {x.shape}, got "
                                 f"{bottom[1].shape}")
            ho, wo = self.out_hw or (h * self.sh - self.pad_h, w * self.sw - self.pad_w)
        else:
            ho, wo = h * self.sh, w * self.sw
        self.ho, self.wo = ho, wo
        top[0].reshape((n, c, ho, wo))

    def _mask(self, bottom):
        m = bottom[1].cpu_data().reshape(-1, bottom[0].count_range(2)).astype(np.int64)
        if m.size and (m.min() < 0 or m.max() >= self.ho * self.wo):
            bad = m[(m < 0) | (m >= self.ho * self.wo)][0]
            raise self.error(f"mask index {bad} lies outside the {self.ho} x {self.wo} output: the scale or "
                             "upsample_h/w does not match the pooling that made the mask")
        return m

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        y = top[0].mutable_cpu_data()
        if not self.unpool:
            y[...] = np.repeat(np.repeat(x, self.sh, axis=2), self.sw, axis=3)
            return
        m = self._mask(bottom)
        planes = x.reshape(m.shape)
        out = np.zeros((m.shape[0], self.ho * self.wo), self.dtype)
        rows = np.arange(m.shape[0])[:, None]
        out[rows, m] = planes  # numpy keeps the last of repeated indices
        y[...] = out.reshape(y.shape)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].cpu_diff()
        if not self.unpool:
            n, c, h, w = bottom[0].shape
            blocks = dy.reshape(n, c, h, self.sh, w, self.sw)
            bottom[0].mutable_cpu_diff()[...] = blocks.sum(axis=(3, 5))
            return
        m = self._mask(bottom)
        flat = dy.reshape(m.shape[0], -1)
        bottom[0].mutable_cpu_diff()[...] = flat[np.arange(m.shape[0])[:, None], m].reshape(bottom[0].shape)

    def forward_gpu(self, bottom, top):
        h, w = bottom[0].shape[2:]
        y = top[0].mutable_gpu_data()
        if not self.unpool:
            k = backend.kernel(KERNELS, "upsample_nearest_forward", self.dtype)
            k(top[0].count, h, w, self.sh, self.sw, bottom[0].gpu_data(), y)
            return
        self._unpool_gpu(bottom, y)

    def _unpool_gpu(self, bottom, y):
        """Three kernels: every top cell written once from its window's owner (SegNet's 2x2 windows
        tiling the top: two sources' windows per thread; else four cells of a row per thread),
        exact unless an index lies outside its source's window; then a claim and a write over all
        sources that return at once unless the first found such an index, and otherwise settle
        the cells those indices name (last source wins). No host reads."""
        n, c, h, w = bottom[0].shape
        planes = n * c
        if planes * h * w == 0:
            if planes * self.ho * self.wo:
                backend.memset_zero(y, planes * self.ho * self.wo * self.dtype.itemsize)
            return
        # The window of each source: the scale, or with upsample_h/w the ratio rounded up.
        sh, sw = (-(-self.ho // h), -(-self.wo // w)) if self.out_hw else (self.sh, self.sw)
        rows = max(self.ho, h * sh)
        groups = -(-max(self.wo, w * sw) // CELLS)
        vec = int(self.wo % CELLS == 0 and y % (CELLS * self.dtype.itemsize) == 0)
        x, idx, flag = bottom[0].gpu_data(), bottom[1].gpu_data(), self.stray.mutable_gpu_data()
        (win,) = backend.workspace(planes * self.ho * self.wo * 4, slot="reduce")
        pair = 2 * self.dtype.itemsize  # unpool_forward_x2: 2x2 windows tiling the top, pointers aligned
        if ((sh, sw, self.ho, self.wo) == (2, 2, 2 * h, 2 * w) and w % 2 == 0 and int(x) % pair == 0
                and int(idx) % pair == 0 and y % (CELLS * self.dtype.itemsize) == 0):
            backend.kernel(KERNELS, "unpool_forward_x2", self.dtype)(
                planes * h * w // 2, h * w, w, self.wo, self.ho * self.wo, x, idx, y, flag, win)
        else:
            backend.kernel(KERNELS, "unpool_forward", self.dtype)(
                planes * rows * groups, h, w, self.ho, self.wo, rows, groups, sh, sw, vec, x, idx, y, flag, win)
        sources = planes * h * w
        grid = min(-(-sources // backend.CUDA_NUM_THREADS), FALLBACK_BLOCKS_PER_SM * backend.multiprocessor_count())
        backend.kernel(KERNELS, "unpool_claim", self.dtype)(
            sources, h, w, self.ho, self.wo, sh, sw, idx, flag, win, grid=grid, block=backend.CUDA_NUM_THREADS)
        backend.kernel(KERNELS, "unpool_write", self.dtype)(
            sources, h, w, self.ho, self.wo, sh, sw, x, idx, y, flag, win, grid=grid, block=backend.CUDA_NUM_THREADS)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        h, w = bottom[0].shape[2:]
        dx = bottom[0].mutable_gpu_diff()
        if not self.unpool:
            k = backend.kernel(KERNELS, "upsample_nearest_backward", self.dtype)
            k(bottom[0].count, h, w, self.sh, self.sw, top[0].gpu_diff(), dx)
            return
        planes = bottom[0].count // (h * w)
        gm.plane_gather(planes, h * w, self.ho * self.wo, top[0].gpu_diff(), bottom[1].gpu_data(), dx, self.dtype)
