"""Crop: cut bottom 0 to the shape of bottom 1 on the axes from ``axis`` on.

top shape: ``bottom0.shape[:axis] + bottom1.shape[axis:]``; the window starts at ``offset``
(none: 0; one value: every cropped axis; else one per cropped axis). Backward scatters the top
diff into a zeroed bottom 0 diff; bottom 1 only gives a shape and takes no gradient.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("Crop")
class CropLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=())
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index == 0

    def layer_setup(self, bottom, top):
        p = self.layer_param.crop_param
        if bottom[0].num_axes != bottom[1].num_axes:
            raise self.error(
                f"bottoms must have the same number of axes, got {bottom[0].shape} and {bottom[1].shape}"
            )
        axis = bottom[0].canonical_axis(p.axis)
        n_crop = bottom[0].num_axes - axis
        if len(p.offset) > 1 and len(p.offset) != n_crop:
            raise self.error(
                f"crop_param.offset has {len(p.offset)} values; give one, or one per cropped axis "
                f"({n_crop} from axis {axis})"
            )

    def reshape(self, bottom, top):
        p = self.layer_param.crop_param
        axis = bottom[0].canonical_axis(p.axis)
        naxes = bottom[0].num_axes
        offsets = [0] * naxes
        shape = list(bottom[0].shape)
        for i in range(axis, naxes):
            if len(p.offset) == 1:
                off = p.offset[0]
            elif len(p.offset) > 1:
                off = p.offset[i - axis]
            else:
                off = 0
            if bottom[0].shape[i] < bottom[1].shape[i] + off:
                raise self.error(
                    f"crop of axis {i} (size {bottom[1].shape[i]} at offset {off}) does not fit in "
                    f"bottom 0 {bottom[0].shape}"
                )
            shape[i] = bottom[1].shape[i]
            offsets[i] = off
        self.offsets = offsets
        top[0].reshape(shape)
        self.window = tuple(slice(o, o + s) for o, s in zip(offsets, shape))

    def forward_cpu(self, bottom, top):
        top[0].mutable_cpu_data()[...] = bottom[0].cpu_data()[self.window]

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].mutable_cpu_diff()
        dx[...] = 0
        dx[self.window] = top[0].cpu_diff()

    # -- GPU: one thread per top element, index map from a small device table ---------------
    def _table(self, bottom, top) -> int:
        """Device int32 table [top shape | bottom strides | offsets] (raw bits in an internal blob),
        rewritten on the host only when the geometry changes."""
        naxes = bottom[0].num_axes
        strides = [bottom[0].count_range(i + 1) for i in range(naxes)]
        key = (top[0].shape, tuple(strides), tuple(self.offsets))
        if getattr(self, "_table_key", None) != key:
            if not hasattr(self, "_table_blob"):
                self._table_blob = Blob(dtype=np.float32)
            self._table_blob.reshape((3 * naxes,))
            self._table_blob.mutable_cpu_data().view(np.int32)[...] = list(top[0].shape) + strides + self.offsets
            self._table_key = key
        return self._table_blob.gpu_data()

    def forward_gpu(self, bottom, top):
        n = top[0].count
        if n == 0:
            return
        table = self._table(bottom, top)
        k = backend.kernel(KERNELS, "crop_copy", self.dtype)
        k(n, bottom[0].num_axes, table, 1, bottom[0].gpu_data(), top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].mutable_gpu_diff()
        backend.memset_zero(dx, bottom[0].count * self.dtype.itemsize)
        n = top[0].count
        if n == 0:
            return
        table = self._table(bottom, top)
        k = backend.kernel(KERNELS, "crop_copy", self.dtype)
        k(n, bottom[0].num_axes, table, 0, dx, top[0].gpu_diff())
