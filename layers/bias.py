"""Bias: ``top = bottom + b`` with ``b`` broadcast over the axes it does not cover.

``b`` is a learned param (shape ``bottom.shape[axis:axis + num_axes]``; ``num_axes: -1`` means all
remaining axes, ``0`` a scalar) or a second bottom whose shape fixes the covered axes. Viewing
``bottom`` as (outer, bias_dim, inner), ``top[o, d, i] = bottom[o, d, i] + b[d]``.
"""

from __future__ import annotations

from pathlib import Path

from pycaffe_lite import fillers
from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


def param_shape(layer: Layer, bottom: Blob, axis: int, num_axes: int) -> tuple[int, ...]:
    """Shape of a learned bias/scale covering ``num_axes`` axes of ``bottom`` from ``axis``."""
    if num_axes < -1:
        raise layer.error(f"num_axes must be non-negative, or -1 for all remaining axes; got {num_axes}")
    start = bottom.canonical_axis(axis) if bottom.num_axes else 0
    end = bottom.num_axes if num_axes == -1 else start + num_axes
    if end > bottom.num_axes:
        raise layer.error(
            f"axis {axis} + num_axes {num_axes} exceeds the {bottom.num_axes} axes of bottom {bottom.shape}"
        )
    return tuple(bottom.shape[start:end])


def broadcast_dims(layer: Layer, bottom: Blob, operand: Blob, axis: int) -> tuple[int, int, int]:
    """(outer, dim, inner) of ``bottom`` for an operand covering axes from ``axis`` (Caffe's rule:
    a 0-axis operand covers nothing and starts at 0)."""
    start = 0 if operand.num_axes == 0 else bottom.canonical_axis(axis)
    stop = start + operand.num_axes
    if stop > bottom.num_axes or tuple(bottom.shape[start:stop]) != tuple(operand.shape):
        raise layer.error(
            f"operand shape {operand.shape} does not match bottom {bottom.shape} from axis {start}"
        )
    return bottom.count_range(0, start), operand.count, bottom.count_range(stop)


def channel_sum(outer: int, dim: int, inner: int, x: int, out: int, dtype, accumulate: bool) -> None:
    """``out[d] (+)= Σ_{o,i} x[o, d, i]`` on the GPU; assigns when not ``accumulate``."""
    if not accumulate:
        gm.set(dim, 0.0, out, dtype)
    gm.channel_sum(outer, dim, inner, x, out, dtype, beta=1.0)


@register_layer("Bias")
class BiasLayer(Layer):
    min_bottom_blobs = 1
    max_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.bias_param
        if len(bottom) > 1:
            if self.blobs:
                raise self.error("takes its bias from bottom 1, so it cannot also have a param blob")
            return
        shape = param_shape(self, bottom[0], p.axis, p.num_axes)
        if self.blobs:
            if len(self.blobs) != 1:
                raise self.error(f"has {len(self.blobs)} param blobs, expected 1")
            self.check_param_shapes([shape])
            return
        self.blobs = [self.make_param_blob(shape)]
        fillers.fill(self.blobs[0], p.filler if p.HasField("filler") else None)

    def _bias(self, bottom) -> Blob:
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        self.outer, self.dim, self.inner = broadcast_dims(
            self, bottom[0], self._bias(bottom), self.layer_param.bias_param.axis
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
        n = bottom[0].count
        k = backend.kernel(KERNELS, "bias_forward", self.dtype, "iiiPPP")
        k(n, n, self.dim, self.inner, bottom[0].gpu_data(), self._bias(bottom).gpu_data(), top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        want, accumulate = self._bias_grad_wanted(bottom, propagate_down)
        if want:
            channel_sum(self.outer, self.dim, self.inner, top[0].gpu_diff(),
                        self._bias(bottom).mutable_gpu_diff(), self.dtype, accumulate)
        if propagate_down[0] and bottom[0] is not top[0]:
            gm.copy(bottom[0].count, top[0].gpu_diff(), bottom[0].mutable_gpu_diff(), self.dtype)
