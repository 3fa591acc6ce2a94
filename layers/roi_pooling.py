"""ROIPooling (Fast / Faster R-CNN): max-pool each region of interest into a fixed grid.

Bottoms: features (N, C, H, W) and rois (R, 5) (or (R, 5, 1, 1)), each row
``[batch_index, x1, y1, x2, y2]`` in input-image coordinates. Top: (R, C, pooled_h, pooled_w).
As caffe-fast-rcnn: the corners are scaled by ``spatial_scale`` and rounded half away from zero;
the region is ``max(x2 - x1 + 1, 1)`` wide (same for y); bin (ph, pw) covers rows
``floor(ph · bh) .. ceil((ph + 1) · bh)`` (``bh = roi_h / pooled_h``, in the layer's dtype) offset by
y1 and clipped to the map (columns likewise). An empty bin gives 0. The maximum's position (first
in row-major order on ties) is kept in an internal blob; backward routes each top gradient to it
(summed over the rois and bins that chose the same input), and never to the rois. A batch index
outside [0, N) is an error on the CPU; the GPU kernels leave such a roi's output 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


def c_round(v: np.ndarray) -> np.ndarray:
    """C's round(): halves away from zero."""
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


@register_layer("ROIPooling")
class ROIPoolingLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=('top',))
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.roi_pooling_param
        if p.pooled_h <= 0 or p.pooled_w <= 0:
            raise self.error(f"roi_pooling_param.pooled_h and pooled_w must be > 0, got {p.pooled_h} and "
                             f"{p.pooled_w}")
        self.ph, self.pw = int(p.pooled_h), int(p.pooled_w)
        self.scale = self.dtype.type(np.float32(p.spatial_scale))
        self.argmax = Blob((), self.dtype)  # flat h * W + w of each output's maximum, -1 for empty bins

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index == 0

    def reshape(self, bottom, top):
        x, rois = bottom
        if x.num_axes != 4:
            raise self.error(f"bottom 0 must be (N, C, H, W), got shape {x.shape}")
        if rois.num_axes < 2 or rois.shape[1] != 5 or rois.count_range(1) != 5:
            raise self.error(f"bottom 1 (rois) must be (R, 5) rows [batch, x1, y1, x2, y2], got shape {rois.shape}")
        shape = (rois.shape[0], x.shape[1], self.ph, self.pw)
        top[0].reshape(shape)
        self.argmax.reshape(shape)

    def _bins(self, rois):
        """Per roi: batch index and the clipped [start, end) rows and columns of every bin."""
        dt = self.dtype.type
        H, W = self.h, self.w
        r = rois.reshape(-1, 5).astype(self.dtype)
        batch = r[:, 0].astype(np.int64)
        x1, y1, x2, y2 = (c_round(r[:, k] * self.scale).astype(np.int64) for k in range(1, 5))
        rh = np.maximum(y2 - y1 + 1, 1).astype(self.dtype)
        rw = np.maximum(x2 - x1 + 1, 1).astype(self.dtype)
        bh, bw = rh / dt(self.ph), rw / dt(self.pw)
        ph, pw = np.arange(self.ph, dtype=self.dtype), np.arange(self.pw, dtype=self.dtype)
        hs = np.floor(ph[None] * bh[:, None]).astype(np.int64) + y1[:, None]
        he = np.ceil((ph[None] + 1) * bh[:, None]).astype(np.int64) + y1[:, None]
        ws = np.floor(pw[None] * bw[:, None]).astype(np.int64) + x1[:, None]
        we = np.ceil((pw[None] + 1) * bw[:, None]).astype(np.int64) + x1[:, None]
        return batch, np.clip(hs, 0, H), np.clip(he, 0, H), np.clip(ws, 0, W), np.clip(we, 0, W)

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        n, c, self.h, self.w = x.shape
        batch, hs, he, ws, we = self._bins(bottom[1].cpu_data())
        bad = (batch < 0) | (batch >= n)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise self.error(f"roi {i} has batch index {int(batch[i])}, outside [0, {n})")
        y = top[0].mutable_cpu_data()
        am = self.argmax.mutable_cpu_data()
        flat_idx = np.arange(self.h * self.w).reshape(self.h, self.w)
        for r in range(len(batch)):
            plane = x[batch[r]]
            for i in range(self.ph):
                for j in range(self.pw):
                    if he[r, i] <= hs[r, i] or we[r, j] <= ws[r, j]:
                        y[r, :, i, j] = 0
                        am[r, :, i, j] = -1
                        continue
                    region = plane[:, hs[r, i]:he[r, i], ws[r, j]:we[r, j]].reshape(c, -1)
                    k = region.argmax(axis=1)
                    y[r, :, i, j] = region[np.arange(c), k]
                    am[r, :, i, j] = flat_idx[hs[r, i]:he[r, i], ws[r, j]:we[r, j]].ravel()[k]

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n, c, h, w = bottom[0].shape
        dx = np.zeros((n, c, h * w), self.dtype)
        am = self.argmax.cpu_data().astype(np.int64)
        batch = bottom[1].cpu_data().reshape(-1, 5)[:, 0].astype(np.int64)
        dy = top[0].cpu_diff()
        rr, cc, ii, jj = np.nonzero(am >= 0)
        np.add.at(dx, (batch[rr], cc, am[rr, cc, ii, jj]), dy[rr, cc, ii, jj])
        bottom[0].mutable_cpu_diff()[...] = dx.reshape(n, c, h, w)

    def forward_gpu(self, bottom, top):
        if top[0].count == 0:  # no rois
            return
        n, c, h, w = bottom[0].shape
        k = backend.kernel(KERNELS, "roi_pool_forward", self.dtype)
        k(top[0].count, bottom[0].gpu_data(), self.scale, n, c, h, w, self.ph, self.pw, bottom[1].gpu_data(),
          top[0].mutable_gpu_data(), self.argmax.mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n, c, h, w = bottom[0].shape
        if top[0].count == 0:
            backend.memset_zero(bottom[0].mutable_gpu_diff(), bottom[0].count * self.dtype.itemsize)
            return
        k = backend.kernel(KERNELS, "roi_pool_backward", self.dtype)
        k(bottom[0].count, top[0].gpu_diff(), self.argmax.gpu_data(), bottom[1].shape[0], self.scale, c, h, w,
          self.ph, self.pw, bottom[1].gpu_data(), bottom[0].mutable_gpu_diff())
