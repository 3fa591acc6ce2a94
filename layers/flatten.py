"""Flatten: collapse axes ``axis`` .. ``end_axis`` (inclusive; defaults 1 and -1) into one.

top shape: ``shape[:axis] + (prod(shape[axis:end_axis + 1]),) + shape[end_axis + 1:]``. The top
is a view of the bottom (:mod:`view_layer`): no copies, not in place.
"""

from __future__ import annotations

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.layer import Traits, register_layer

from .view_layer import ViewLayer


@register_layer("Flatten")
class FlattenLayer(ViewLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True)

    def top_shape(self, b: Blob) -> tuple[int, ...]:
        p = self.layer_param.flatten_param
        try:
            start, end = b.canonical_axis(p.axis), b.canonical_axis(p.end_axis)
        except ShapeError as exc:
            raise self.error(f"{exc}", ShapeError) from None
        if end < start:
            raise self.error(
                f"end_axis {p.end_axis} comes before axis {p.axis} "
                f"for bottom shape {b.shape}", ShapeError
            )
        return b.shape[:start] + (b.count_range(start, end + 1),) + b.shape[end + 1:]
