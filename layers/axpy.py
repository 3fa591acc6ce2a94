"""Axpy (SENet ports): ``top = a * x + y`` with ``a`` one scalar per (num, channel).

Bottoms: ``a`` of shape (N, C) or (N, C, 1, 1); ``x`` and ``y`` of one shape (N, C, ...); top has
that shape. Backward: ``da[n, c] = Σ_s dtop[n, c, s] · x[n, c, s]``, ``dx = a · dtop``,
``dy = dtop``. The layer itself computes in place on ``y`` (then ``dy`` is the top diff itself);
a Net, as Caffe's, allows in place only between a top and the bottom at the same position, so in
prototxts the top is a new blob.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")
LONG_ROW = 1024  # rows longer than this get a block of 256 threads each in the backward
MAX_GRID = 65535 * 4


@register_layer("Axpy")
class AxpyLayer(Layer):
    traits = Traits(graph_safe=True, writes_all_bottom_diffs=True, backward_reads=('bottom',))
    exact_num_bottom_blobs = 3
    exact_num_top_blobs = 1

    def reshape(self, bottom, top):
        a, x, y = bottom
        if x.shape != y.shape:
            raise self.error(f"x (bottom 1) and y (bottom 2) must have one shape, got {x.shape} and {y.shape}")
        if x.num_axes < 2:
            raise self.error(f"x must be (N, C, ...), got shape {x.shape}")
        if top[0] is a or top[0] is x:
            raise self.error("top may only be computed in place of y (bottom 2)")
        ashape = tuple(a.shape)
        want = tuple(x.shape[:2])
        if ashape[:2] != want or any(d != 1 for d in ashape[2:]):
            raise self.error(f"a (bottom 0) must have shape {want} (or with trailing 1s), got {ashape}; "
                             f"x has shape {x.shape}")
        self.rows = x.count_range(0, 2)
        self.spatial = x.count_range(2)
        if top[0] is not y:
            top[0].reshape(x.shape)

    def forward_cpu(self, bottom, top):
        a = bottom[0].cpu_data().reshape(self.rows, 1)
        x = bottom[1].cpu_data().reshape(self.rows, self.spatial)
        y = bottom[2].cpu_data().reshape(self.rows, self.spatial)
        out = a * x + y
        top[0].mutable_cpu_data()[...] = out.reshape(top[0].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        dtop = top[0].cpu_diff().reshape(self.rows, self.spatial)
        if propagate_down[0]:
            x = bottom[1].cpu_data().reshape(self.rows, self.spatial)
            bottom[0].mutable_cpu_diff()[...] = (dtop * x).sum(axis=1).reshape(bottom[0].shape)
        if propagate_down[1]:
            a = bottom[0].cpu_data().reshape(self.rows, 1)
            bottom[1].mutable_cpu_diff()[...] = (a * dtop).reshape(bottom[1].shape)
        if propagate_down[2] and top[0] is not bottom[2]:
            bottom[2].mutable_cpu_diff()[...] = np.asarray(dtop).reshape(bottom[2].shape)

    def forward_gpu(self, bottom, top):
        k = backend.kernel(KERNELS, "axpy_forward", self.dtype)
        k(top[0].count, self.spatial, bottom[0].gpu_data(), bottom[1].gpu_data(), bottom[2].gpu_data(),
          top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        dtop = top[0].gpu_diff()
        do_da, do_dx = bool(propagate_down[0]), bool(propagate_down[1])
        do_dy = bool(propagate_down[2]) and top[0] is not bottom[2]
        if not (do_da or do_dx):
            if do_dy:
                gm.copy(bottom[2].count, dtop, bottom[2].mutable_gpu_diff(), self.dtype)
            return
        if self.rows == 0:
            return
        # Short rows (SENet's 7x7 .. 28x28 planes): a warp per row, 8 rows a block; long rows a block each.
        tx, ty = (32, 8) if self.spatial <= LONG_ROW else (256, 1)
        unused = dtop  # a valid pointer for outputs not asked for (never written)
        backend.kernel(KERNELS, "axpy_backward", self.dtype)(
            self.rows, self.spatial, int(do_da), int(do_dx), int(do_dy), bottom[0].gpu_data(),
            bottom[1].gpu_data(), dtop, bottom[0].mutable_gpu_diff() if do_da else unused,
            bottom[1].mutable_gpu_diff() if do_dx else unused, bottom[2].mutable_gpu_diff() if do_dy else unused,
            grid=min(-(-self.rows // ty), MAX_GRID), block=(tx, ty, 1))
