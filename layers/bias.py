"""Bias: ``top = bottom + b`` with ``b`` broadcast over the axes it does not cover.

``b`` is a learned param (shape ``bottom.shape[axis:axis + num_axes]``; ``num_axes: -1`` means all
remaining axes, ``0`` a scalar) or a second bottom whose shape fixes the covered axes. Viewing
``bottom`` as (outer, bias_dim, inner), ``top[o, d, i] = bottom[o, d, i] + b[d]``. Scale derives
from this layer (Caffe's Scale owns a Bias) for the operand shape rules.
"""

from __future__ import annotations

from pycaffe_lite import fillers
from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("Bias")
class BiasLayer(Layer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=())
    min_bottom_blobs = 1
    max_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.bias_param
        if len(bottom) > 1:
            if self.blobs:
                raise self.error("takes its bias from bottom 1, so it cannot also have a param blob")
            return
        shape = self._param_shape(bottom[0], p.axis, p.num_axes)
        if self.blobs:
            if len(self.blobs) != 1:
                raise self.error(f"has {len(self.blobs)} param blobs, expected 1")
            self.check_param_shapes([shape])
            return
        self.blobs = [self.make_param_blob(shape)]
        fillers.fill(self.blobs[0], p.filler if p.HasField("filler") else None)

    def _param_shape(self, bottom: Blob, axis: int, num_axes: int) -> tuple[int, ...]:
        """Shape of a learned operand covering ``num_axes`` axes of ``bottom`` from ``axis``."""
        if num_axes < -1:
            raise self.error(f"num_axes must be non-negative, or -1 for all remaining axes; got {num_axes}")
        start = bottom.canonical_axis(axis) if bottom.num_axes else 0
        end = bottom.num_axes if num_axes == -1 else start + num_axes
        if end > bottom.num_axes:
            raise self.error(
                f"axis {axis} + num_axes {num_axes} exceeds the {bottom.num_axes} axes of bottom {bottom.shape}"
            )
        return tuple(bottom.shape[start:end])

    def _broadcast_dims(self, bottom: Blob, operand: Blob, axis: int) -> tuple[int, int, int]:
        """(outer, dim, inner) of ``bottom`` for an operand covering axes from ``axis`` (Caffe's rule:
        a 0-axis operand covers nothing and starts at 0)."""
        start = 0 if operand.num_axes == 0 else bottom.canonical_axis(axis)
        stop = start + operand.num_axes
        if stop > bottom.num_axes or tuple(bottom.shape[start:stop]) != tuple(operand.shape):
            raise self.error(f"operand shape {operand.shape} does not match bottom {bottom.shape} from axis {start}")
        return bottom.count_range(0, start), operand.count, bottom.count_range(stop)

    def _bias(self, bottom) -> Blob:
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        self.outer, self.dim, self.inner = self._broadcast_dims(
            bottom[0], self._bias(bottom), self.layer_param.bias_param.axis
        )
        top[0].reshape(bottom[0].shape)

    def _view(self, a):
        return a.reshape(self.outer, self.dim, self.inner)

    def forward_cpu(self, bottom, top):
        b = self._bias(bottom).cpu_data().reshape(1, self.dim, 1)
        y = self._view(bottom[0].cpu_data()) + b
        top[0].mutable_cpu_data()[...] = y.reshape(top[0].shape)

    def _bias_grad_wanted(self, bottom, propagate_down) -> tuple[bool, bool]:
        """(compute it, accumulate it): a param accumulates, a bottom is assigned."""
        if len(bottom) > 1:
            return bool(propagate_down[1]), False
        return bool(self.param_propagate_down[0]), True

    def backward_cpu(self, top, propagate_down, bottom):
        dy = self._view(top[0].cpu_diff())
        want, accumulate = self._bias_grad_wanted(bottom, propagate_down)
        if want:
            g = dy.sum(axis=(0, 2)).reshape(self._bias(bottom).shape)
            target = self._bias(bottom).mutable_cpu_diff()
            if accumulate:
                target += g
            else:
                target[...] = g
        if propagate_down[0] and bottom[0] is not top[0]:
            bottom[0].mutable_cpu_diff()[...] = top[0].cpu_diff()

    def forward_gpu(self, bottom, top):
        gm.channel_affine(self.outer, self.dim, self.inner, bottom[0].gpu_data(), None,
                          self._bias(bottom).gpu_data(), top[0].mutable_gpu_data(), self.dtype)

    def backward_gpu(self, top, propagate_down, bottom):
        want, accumulate = self._bias_grad_wanted(bottom, propagate_down)
        if want:
            gm.channel_sum(self.outer, self.dim, self.inner, top[0].gpu_diff(),
                           self._bias(bottom).mutable_gpu_diff(), self.dtype, beta=float(accumulate))
        if propagate_down[0] and bottom[0] is not top[0]:
            gm.copy(bottom[0].count, top[0].gpu_diff(), bottom[0].mutable_gpu_diff(), self.dtype)
