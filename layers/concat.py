"""Concat: join bottoms along one axis (``concat_param { axis }`` or legacy ``concat_dim``).

Every bottom must have the same number of axes and equal dimensions except at the concat axis;
top shape is bottom 0's with the concat axis summed. One bottom: the top shares its data and diff.
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("Concat")
class ConcatLayer(Layer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, writes_all_bottom_diffs=True, backward_reads=())
    min_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.concat_param
        if p.HasField("axis") and p.HasField("concat_dim"):
            raise self.error("give either concat_param.axis or the legacy concat_dim, not both")

    def _axis(self, bottom) -> int:
        p = self.layer_param.concat_param
        if p.HasField("concat_dim"):
            if p.concat_dim >= bottom[0].num_axes:
                raise self.error(
                    f"concat_dim {p.concat_dim} out of range for bottom 0 "
                    f"of shape {bottom[0].shape}", ShapeError
                )
            return int(p.concat_dim)
        try:
            return bottom[0].canonical_axis(p.axis)
        except ShapeError as exc:
            raise self.error(f"{exc}", ShapeError) from None

    def reshape(self, bottom, top):
        axis = self.axis = self._axis(bottom)
        first = bottom[0].shape
        total = 0
        for i, b in enumerate(bottom):
            s = b.shape
            if len(s) != len(first) or s[:axis] != first[:axis] or s[axis + 1:] != first[axis + 1:]:
                raise self.error(
                    f"bottom {i} has shape {s}, incompatible with bottom 0 "
                    f"shape {first}: all dimensions except axis {axis} must match", ShapeError
                )
            total += s[axis]
        top[0].reshape(first[:axis] + (total,) + first[axis + 1:])
        self.num_concats = bottom[0].count_range(0, axis)
        self.concat_size = bottom[0].count_range(axis + 1)
        if len(bottom) == 1:
            top[0].share_data(bottom[0])
            top[0].share_diff(bottom[0])

    def _rows(self, blob_shape_axis: int, arr: np.ndarray) -> np.ndarray:
        return arr.reshape(self.num_concats, blob_shape_axis, self.concat_size)

    def forward_cpu(self, bottom, top):
        if len(bottom) == 1:
            return
        out = self._rows(top[0].shape[self.axis], top[0].mutable_cpu_data())
        offset = 0
        for b in bottom:
            n = b.shape[self.axis]
            out[:, offset:offset + n] = self._rows(n, b.cpu_data())
            offset += n

    def backward_cpu(self, top, propagate_down, bottom):
        if len(bottom) == 1:
            return
        dy = self._rows(top[0].shape[self.axis], top[0].cpu_diff())
        offset = 0
        for i, b in enumerate(bottom):
            n = b.shape[self.axis]
            if propagate_down[i]:
                b.mutable_cpu_diff()[...] = dy[:, offset:offset + n].reshape(b.shape)
            offset += n

    def _gpu_copy(self, top, bottom, bottom_ptrs, forward: bool) -> None:
        """One row-block copy per bottom between its rows and its column slice of the top."""
        top_cols = top[0].shape[self.axis] * self.concat_size
        top_ptr = top[0].mutable_gpu_data() if forward else top[0].gpu_diff()
        offset = 0
        for b, ptr in zip(bottom, bottom_ptrs):
            cols = b.shape[self.axis] * self.concat_size
            if ptr is not None:
                part = top_ptr + offset * self.dtype.itemsize
                if forward:
                    gm.copy_rows(self.num_concats, cols, ptr, cols, part, top_cols, self.dtype)
                else:
                    gm.copy_rows(self.num_concats, cols, part, top_cols, ptr, cols, self.dtype)
            offset += cols

    def forward_gpu(self, bottom, top):
        if len(bottom) > 1:
            self._gpu_copy(top, bottom, [b.gpu_data() for b in bottom], True)

    def backward_gpu(self, top, propagate_down, bottom):
        if len(bottom) > 1:
            self._gpu_copy(top, bottom, [b.mutable_gpu_diff() if p else None for b, p in zip(bottom, propagate_down)],
                           False)
