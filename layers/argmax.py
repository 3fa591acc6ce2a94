"""ArgMax: indices (and optionally values) of the ``top_k`` largest entries.

Without ``axis``: per item of bottom (N, ...), over its flattened entries; top is
(N, 1, top_k) padded with 1s to bottom's axis count, or (N, 2, top_k) with ``out_max_val``
(indices then values). With ``axis``: along that axis; top is bottom's shape with
``top_k`` there, holding values if ``out_max_val`` else indices. Ties rank the larger index
first, as Caffe's sort of (value, index) pairs does. No backward. The GPU path runs this code on
host copies, as Caffe does (it has no ArgMax kernel).
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("ArgMax")
class ArgMaxLayer(Layer):
    traits = Traits()  # CPU code only (its GPU path runs it on host copies)
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def allow_force_backward(self, bottom_index: int) -> bool:
        return False

    def layer_setup(self, bottom, top):
        p = self.layer_param.argmax_param
        self.out_max_val = p.out_max_val
        self.top_k = p.top_k
        if self.top_k < 1:
            raise self.error("argmax_param.top_k must be at least 1")
        self.has_axis = p.HasField("axis")
        if self.has_axis:
            self.axis = bottom[0].canonical_axis(p.axis)
            if self.top_k > bottom[0].shape[self.axis]:
                raise self.error(
                    f"top_k {self.top_k} exceeds the size {bottom[0].shape[self.axis]} of axis {self.axis}"
                )
        elif self.top_k > bottom[0].count_range(1):
            raise self.error(
                f"top_k {self.top_k} exceeds the {bottom[0].count_range(1)} entries per item of bottom {bottom[0].shape}"
            )

    def reshape(self, bottom, top):
        if self.has_axis:
            shape = list(bottom[0].shape)
            shape[self.axis] = self.top_k
        else:
            shape = [1] * max(3, bottom[0].num_axes)
            shape[0] = bottom[0].shape[0]
            shape[2] = self.top_k
            if self.out_max_val:
                shape[1] = 2
        top[0].reshape(shape)

    def _top_k(self, rows: np.ndarray) -> np.ndarray:
        """Indices of the top_k entries of each row, best first (ties: larger index first)."""
        # ascending by (value, index) then reversed: descending value, ties larger index first
        return np.argsort(rows, axis=1, kind="stable")[:, ::-1][:, : self.top_k]

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        if self.has_axis:
            moved = np.moveaxis(x, self.axis, -1)
            flat = moved.reshape(-1, moved.shape[-1])
            best = self._top_k(flat)
            out = np.take_along_axis(flat, best, axis=1) if self.out_max_val else best
            out = np.moveaxis(out.reshape(moved.shape[:-1] + (self.top_k,)), -1, self.axis)
        else:
            flat = x.reshape(x.shape[0], -1)
            best = self._top_k(flat)
            if self.out_max_val:
                out = np.stack([best, np.take_along_axis(flat, best, axis=1)], axis=1)
            else:
                out = best
        top[0].mutable_cpu_data()[...] = out.reshape(top[0].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        if any(propagate_down):
            raise self.error("ArgMax has no gradient (it cannot back-propagate to its bottom)")
