"""Reshape: give the bottom a new shape without copying (the top is a view, :mod:`view_layer`).

``reshape_param { shape { dim } axis num_axes }`` replaces bottom axes ``[axis, axis + num_axes)``
(``num_axes: -1``: through the last axis; a negative ``axis`` counts from the end, -1 meaning
"after the last axis") by ``shape``. In ``shape``, ``0`` copies the bottom dimension at the same
position and ``-1`` (at most once) is inferred so that the counts match.
"""

from __future__ import annotations

import math

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.layer import Traits, register_layer

from .view_layer import ViewLayer


@register_layer("Reshape")
class ReshapeLayer(ViewLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True)

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        dims = list(self.layer_param.reshape_param.shape.dim)
        self.dims = dims
        self.copy_axes = [i for i, d in enumerate(dims) if d == 0]
        inferred = [i for i, d in enumerate(dims) if d == -1]
        if len(inferred) > 1:
            raise self.error(f"shape {dims} has more than one -1 (inferred) dimension")
        bad = [d for d in dims if d < -1]
        if bad:
            raise self.error(f"shape {dims} has invalid dimension(s) {bad}: use > 0, 0 (copy) or -1 (infer)")
        self.inferred_axis = inferred[0] if inferred else None
        self.constant_count = math.prod(d for d in dims if d > 0)

    def top_shape(self, b: Blob) -> tuple[int, ...]:
        p = self.layer_param.reshape_param
        n = b.num_axes
        start = p.axis if p.axis >= 0 else p.axis + n + 1
        if not 0 <= start <= n:
            raise self.error(f"axis {p.axis} out of range for bottom shape {b.shape}", ShapeError)
        if p.num_axes < -1:
            raise self.error(f"num_axes must be >= 0 or -1, got {p.num_axes}", ShapeError)
        end = n if p.num_axes == -1 else start + p.num_axes
        if end > n:
            raise self.error(
                f"axis {p.axis} + num_axes {p.num_axes} exceeds the "
                f"{n} axes of bottom shape {b.shape}", ShapeError
            )
        new = list(self.dims)
        for i in self.copy_axes:
            if start + i >= n:
                raise self.error(
                    f"shape dim {i} is 0 (copy) but bottom shape {b.shape} "
                    f"has no axis {start + i}", ShapeError
                )
            new[i] = b.shape[start + i]
        if self.inferred_axis is not None:
            explicit = math.prod(d for d in new if d != -1) * b.count_range(0, start) * b.count_range(end)
            if explicit == 0 or b.count % explicit:
                raise self.error(
                    f"cannot infer the -1 dimension of {self.dims}: bottom "
                    f"count {b.count} (shape {b.shape}) is not a multiple of {explicit}", ShapeError
                )
            new[self.inferred_axis] = b.count // explicit
        shape = b.shape[:start] + tuple(new) + b.shape[end:]
        if math.prod(shape) != b.count:
            raise self.error(
                f"output shape {shape} has {math.prod(shape)} elements, "
                f"bottom shape {b.shape} has {b.count}", ShapeError
            )
        return shape
