"""Slice: split bottom along ``axis`` (or legacy ``slice_dim``) into the tops.

``slice_point`` gives the len(top) - 1 increasing split indices; without it the axis is split
into len(top) equal parts (it must divide). Backward concatenates the top diffs.
"""

from __future__ import annotations

from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("Slice")
class SliceLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=())
    exact_num_bottom_blobs = 1
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.slice_param
        if p.HasField("axis") and p.HasField("slice_dim"):
            raise self.error("specify either slice_param.axis or the legacy slice_dim, not both")
        self.slice_points = list(p.slice_point)

    def reshape(self, bottom, top):
        p = self.layer_param.slice_param
        axis = p.slice_dim if p.HasField("slice_dim") else p.axis
        self.axis = bottom[0].canonical_axis(axis)
        dim = bottom[0].shape[self.axis]
        ntop = len(top)
        if self.slice_points:
            if len(self.slice_points) != ntop - 1:
                raise self.error(
                    f"{len(self.slice_points)} slice_point values for {ntop} tops (need {ntop - 1})"
                )
            prev, sizes = 0, []
            for pt in self.slice_points:
                if pt <= prev:
                    raise self.error(f"slice_point values must be increasing and positive, got {self.slice_points}")
                sizes.append(pt - prev)
                prev = pt
            if prev > dim:
                raise self.error(
                    f"slice_point {prev} beyond the size {dim} of axis {self.axis} of bottom {bottom[0].shape}"
                )
            sizes.append(dim - prev)
        else:
            if dim % ntop:
                raise self.error(
                    f"cannot split axis {self.axis} of size {dim} (bottom {bottom[0].shape}) into {ntop} equal parts"
                )
            sizes = [dim // ntop] * ntop
        self.sizes = sizes
        self.outer = bottom[0].count_range(0, self.axis)
        self.inner = bottom[0].count_range(self.axis + 1)
        for t, s in zip(top, sizes):
            shape = list(bottom[0].shape)
            shape[self.axis] = s
            t.reshape(shape)

    def _bounds(self):
        start = 0
        for s in self.sizes:
            yield start, s
            start += s

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data().reshape(self.outer, -1, self.inner)
        for t, (start, s) in zip(top, self._bounds()):
            t.mutable_cpu_data()[...] = x[:, start:start + s].reshape(t.shape)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].mutable_cpu_diff().reshape(self.outer, -1, self.inner)
        for t, (start, s) in zip(top, self._bounds()):
            dx[:, start:start + s] = t.cpu_diff().reshape(self.outer, s, self.inner)

    def _copy_gpu(self, top, bottom_ptr: int, forward: bool) -> None:
        """One row-block copy per top between it and its column slice of the bottom rows."""
        bottom_cols = sum(self.sizes) * self.inner
        for t, (start, s) in zip(top, self._bounds()):
            cols, part = s * self.inner, bottom_ptr + start * self.inner * self.dtype.itemsize
            if forward:
                gm.copy_rows(self.outer, cols, part, bottom_cols, t.mutable_gpu_data(), cols, self.dtype)
            else:
                gm.copy_rows(self.outer, cols, t.gpu_diff(), cols, part, bottom_cols, self.dtype)

    def forward_gpu(self, bottom, top):
        self._copy_gpu(top, bottom[0].gpu_data(), True)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self._copy_gpu(top, bottom[0].mutable_gpu_diff(), False)
