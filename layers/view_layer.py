"""ViewLayer: the family of layers whose top is a view of the bottom (Flatten, Reshape).

The top takes the shape of :meth:`ViewLayer.top_shape` and shares the bottom's data and diff, so
forward and backward copy nothing. Not in place (a blob cannot be a view of itself).
"""

from __future__ import annotations

from pycaffe_lite.blob import Blob
from pycaffe_lite.layer import Layer


class ViewLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error(f"{self.type} cannot be used in place (give the top a different name)")

    def top_shape(self, b: Blob) -> tuple[int, ...]:
        """The top's shape for bottom ``b`` (same count); raises ShapeError when there is none."""
        raise NotImplementedError

    def reshape(self, bottom, top):
        top[0].reshape(self.top_shape(bottom[0]))
        top[0].share_data(bottom[0])
        top[0].share_diff(bottom[0])

    def forward_cpu(self, bottom, top):
        """Nothing to do: the top shares the bottom's data."""

    def backward_cpu(self, top, propagate_down, bottom):
        """Nothing to do: the bottom shares the top's diff."""

    forward_gpu = forward_cpu
    backward_gpu = backward_cpu
