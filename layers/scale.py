"""Scale: ``top = bottom * s (+ b)`` with ``s`` broadcast over the axes it does not cover.

``s`` is a learned param (shape ``bottom.shape[axis:axis + num_axes]``, filled by ``filler``,
default constant 1) or bottom 1. With ``bias_term`` a learned bias of the same shape follows
(``bias_filler``, default constant 0), as Caffe's internal Bias layer. Viewing ``bottom`` as
(outer, dim, inner): ``top[o, d, i] = bottom[o, d, i] * s[d] + b[d]``.
Params: ``[s, b]``, ``[s]``, ``[b]`` (scale from bottom 1) or none.
"""

from __future__ import annotations

from pycaffe_lite import fillers
from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import AFFINE, Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

from .bias import BiasLayer


@register_layer("Scale")
class ScaleLayer(BiasLayer):

    traits = Traits(half=True, half_kernels=True, graph_safe=True, saves_input_in_place=True, backward_reads=('bottom',), fuses=frozenset({AFFINE}))

    def fuses_as(self, role, bottom=None) -> bool:
        """A per-channel affine of ``bottom``: a scale blob on axis 1 over one axis."""
        p = self.layer_param.scale_param
        return (super().fuses_as(role, bottom) and bottom is not None and len(self.blobs) >= 1
                and p.axis in (1, 1 - bottom.num_axes) and p.num_axes == 1)

    def layer_setup(self, bottom, top):
        p = self.layer_param.scale_param
        scale_is_param = len(bottom) == 1
        if scale_is_param:
            shape = self._param_shape(bottom[0], p.axis, p.num_axes)
        else:
            shape = self._param_shape(bottom[0], p.axis, bottom[1].num_axes)
        expected = [shape] * (int(scale_is_param) + int(p.bias_term))
        self.bias_index = int(scale_is_param) if p.bias_term else None
        if self.blobs:
            if len(self.blobs) != len(expected):
                raise self.error(f"has {len(self.blobs)} param blobs, expected {len(expected)}")
            self.check_param_shapes(expected)
            return
        if scale_is_param:
            blob = self.make_param_blob(shape)
            if p.HasField("filler"):
                fillers.fill(blob, p.filler)
            else:
                fillers.fill(blob, caffe_pb2.FillerParameter(type="constant", value=1.0))
            self.blobs.append(blob)
        if p.bias_term:
            blob = self.make_param_blob(shape)
            fillers.fill(blob, p.bias_filler if p.HasField("bias_filler") else None)
            self.blobs.append(blob)

    def _scale(self, bottom) -> Blob:
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        self.outer, self.dim, self.inner = self._broadcast_dims(
            bottom[0], self._scale(bottom), self.layer_param.scale_param.axis
        )
        self.in_place = bottom[0] is top[0]
        if self.in_place:  # the input is needed for the scale gradient but gets overwritten
            if not hasattr(self, "_saved") or self._saved.dtype != self.dtype:
                self._saved = Blob(dtype=self.dtype)
            self._saved.reshape(bottom[0].shape)
        else:
            top[0].reshape(bottom[0].shape)

    def backward_reads_data(self, top: bool, i: int) -> bool:
        """The scale gradient reads the input: bottom 0 out of place (in place a saved copy, or the
        input regenerated from the producer's); a scale given as bottom 1 for dx; never the top."""
        return not top and (i > 0 or not getattr(self, "in_place", False))

    def _input(self, bottom) -> Blob:
        if not self.in_place:
            return bottom[0]
        return self.input_from if self.input_from is not None else self._saved

    # The executor may set ``recompute_input`` inside whole training iterations
    # (memory_plan.recomputable_inputs): it writes this in-place layer's input into a device pointer on
    # demand (a BatchNorm re-normalizing its own intact input), so the GPU path keeps no saved copy.

    # -- CPU --------------------------------------------------------------------------------
    def forward_cpu(self, bottom, top):
        self.input_from = None
        x = bottom[0].cpu_data()
        if self.in_place:
            self._saved.mutable_cpu_data()[...] = x
        y = self._view(x) * self._scale(bottom).cpu_data().reshape(1, self.dim, 1)
        if self.bias_index is not None:
            y = y + self.blobs[self.bias_index].cpu_data().reshape(1, self.dim, 1)
        top[0].mutable_cpu_data()[...] = y.reshape(top[0].shape)

    def _scale_grad_wanted(self, bottom, propagate_down) -> tuple[bool, bool]:
        """(compute it, accumulate it): a param accumulates, a bottom is assigned."""
        if len(bottom) > 1:
            return bool(propagate_down[1]), False
        return bool(self.param_propagate_down[0]), True

    def backward_cpu(self, top, propagate_down, bottom):
        dy = self._view(top[0].cpu_diff())
        bi = self.bias_index
        if bi is not None and self.param_propagate_down[bi]:
            self.blobs[bi].mutable_cpu_diff()[...] += dy.sum(axis=(0, 2)).reshape(self.blobs[bi].shape)
        scale = self._scale(bottom)
        want, accumulate = self._scale_grad_wanted(bottom, propagate_down)
        if want:
            x = self._view(self._input(bottom).cpu_data())
            g = (dy * x).sum(axis=(0, 2)).reshape(scale.shape)
            if accumulate:
                scale.mutable_cpu_diff()[...] += g
            else:
                scale.mutable_cpu_diff()[...] = g
        if propagate_down[0]:
            dx = dy * scale.cpu_data().reshape(1, self.dim, 1)
            bottom[0].mutable_cpu_diff()[...] = dx.reshape(bottom[0].shape)

    # -- GPU --------------------------------------------------------------------------------
    def forward_gpu(self, bottom, top):
        self.input_from = None
        n, dt = bottom[0].count, self.dtype
        x = bottom[0].gpu_data()
        if self.in_place and self.recompute_input is None:
            gm.copy(n, x, self._saved.mutable_gpu_data(), dt)
        b = self.blobs[self.bias_index].gpu_data() if self.bias_index is not None else None
        gm.channel_affine(self.outer, self.dim, self.inner, x, self._scale(bottom).gpu_data(), b,
                          top[0].mutable_gpu_data(), dt)

    def backward_gpu(self, top, propagate_down, bottom):
        """One pass over dy and x: the scale gradient Σ dy·x, the bias gradient Σ dy, and dx = dy·s."""
        dt, dy, bi = self.dtype, top[0].gpu_diff(), self.bias_index
        scale = self._scale(bottom)
        want_bias = bi is not None and self.param_propagate_down[bi]
        bias_diff = self.blobs[bi].mutable_gpu_diff() if want_bias else None
        want, accumulate = self._scale_grad_wanted(bottom, propagate_down)
        dims = (self.outer, self.dim, self.inner)
        if want:
            if self.in_place and self.recompute_input is not None and self.input_from is None:
                (x,) = backend.workspace(bottom[0].count * dt.itemsize)  # channel_dot uses the reduce slot
                self.recompute_input(x)
            else:
                x = self._input(bottom).gpu_data()
            fused = {"q": scale.gpu_data(), "y": bottom[0].mutable_gpu_diff()} if propagate_down[0] else {}
            gm.channel_dot(*dims, dy, x, dt, sum_a=bias_diff,
                           dot=scale.mutable_gpu_diff(), beta_sum=1.0, beta_dot=float(accumulate), **fused)
            return
        if want_bias:
            gm.channel_sum(*dims, dy, bias_diff, dt, beta=1.0)
        if propagate_down[0]:
            gm.channel_affine(*dims, dy, scale.gpu_data(), None, bottom[0].mutable_gpu_diff(), dt)
