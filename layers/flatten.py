"""Flatten: collapse axes ``axis`` .. ``end_axis`` (inclusive; defaults 1 and -1) into one.

top shape: ``shape[:axis] + (prod(shape[axis:end_axis + 1]),) + shape[end_axis + 1:]``. The top
shares the bottom's data and diff, so forward and backward copy nothing. Not in place.
"""

from __future__ import annotations

from pycaffe_lite.errors import ShapeError
from pycaffe_lite.layer import Layer, register_layer


@register_layer("Flatten")
class FlattenLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("Flatten cannot be used in place (give the top a different name)")

    def reshape(self, bottom, top):
        p = self.layer_param.flatten_param
        b = bottom[0]
        try:
            start, end = b.canonical_axis(p.axis), b.canonical_axis(p.end_axis)
        except ShapeError as exc:
            raise ShapeError(f"layer '{self.name}' (Flatten): {exc}") from None
        if end < start:
            raise ShapeError(
                f"layer '{self.name}' (Flatten): end_axis {p.end_axis} comes before axis {p.axis} "
                f"for bottom shape {b.shape}"
            )
        top[0].reshape(b.shape[:start] + (b.count_range(start, end + 1),) + b.shape[end + 1:])
        top[0].share_data(b)
        top[0].share_diff(b)

    def forward_cpu(self, bottom, top):
        """Nothing to do: the top shares the bottom's data."""

    def backward_cpu(self, top, propagate_down, bottom):
        """Nothing to do: the bottom shares the top's diff."""

    forward_gpu = forward_cpu
    backward_gpu = backward_cpu
