"""Deconvolution (transposed convolution) over 2-D images, BVLC semantics.

bottom (..., C, H, W) with the channel axis at ``axis`` (default 1; leading axes are the batch);
weight (C, num_output/group, kh, kw), stored as Caffe stores it (the layout of the convolution
whose backward pass this is); bias (num_output,); top (..., num_output, Ho, Wo) with
``Ho = stride_h*(H - 1) + dilation_h*(kh - 1) + 1 - 2*pad_h`` (likewise Wo). Several bottoms may be
given; each uses the same weights and writes the top of the same index.

Everything runs through the convolution code, on the "transposed" convolution that maps the top
(num_output channels, Ho x Wo) to the bottom (C channels, H x W) with this layer's weight blob as
its own (C, num_output/group, kh, kw) weights: forward is that convolution's data gradient (plus
the bias, added per output channel), the bottom diff its forward pass, the weight diff its weight
pass with the roles of input and top gradient taken by this layer's top diff and bottom. CPU:
:mod:`pycaffe_lite.conv.cpu`; GPU: the engines of :mod:`pycaffe_lite.conv.engines`, picked
per pass by the same autotune and ``engine`` field as Convolution. Other numbers of spatial axes (and
``force_nd_im2col``) run the same roles on Convolution's N-D path (weight ``(C, num_output/group, *K)``).
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.conv import cpu as cpu_conv
from pycaffe_lite.conv import cpu_nd as cpu_conv_nd
from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.conv import nd as conv_nd
from pycaffe_lite.conv.geometry import Pair, deconv_out_shape, deconv_out_shape_nd
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

from .convolution import ConvolutionBase


@register_layer("Deconvolution")
class DeconvolutionLayer(ConvolutionBase):
    traits = Traits(graph_safe=True, pure_forward=True)
    engines_add_bias = False  # the bias is on this layer's top: the engines' input channels
    forward_passes = ("backward_data",)  # the transposed convolution: the engines' passes swap
    backward_passes = ("backward_weight", "forward")

    def weight_shape(self) -> tuple[int, ...]:
        return (self.channels, self.num_output // self.group) + self.geo_nd.kernel  # as Caffe stores it

    def output_hw(self) -> Pair:
        g = self.geo
        out_hw = deconv_out_shape(self.in_hw[0], self.in_hw[1], g.kernel, g.pad, g.stride, g.dilation)
        if min(out_hw) <= 0:
            extent = tuple(d * (k - 1) + 1 for k, d in zip(g.kernel, g.dilation))
            raise self.error(
                f"output would be {out_hw[0]}x{out_hw[1]}: input {self.in_hw[0]}x{self.in_hw[1]} "
                f"with stride {g.stride[0]}x{g.stride[1]} and kernel extent {extent[0]}x{extent[1]} "
                f"is smaller than twice the pad {g.pad[0]}x{g.pad[1]}"
            )
        return out_hw

    def cpu_passes(self) -> tuple[str, ...]:
        """Forward is the transposed convolution's data pass; backward its weight pass and forward."""
        forward = ("data",)
        return forward + ("weight", "forward") if self.layer_param.phase == caffe_pb2.TRAIN else forward

    def engine_problem_dims(self) -> tuple[int, Pair, int]:
        return self.num_output, self.out_hw, self.channels  # top -> bottom

    def output_nd(self) -> tuple[int, ...]:
        g = self.geo_nd
        out = deconv_out_shape_nd(self.in_nd, g.kernel, g.pad, g.stride, g.dilation)
        if min(out) <= 0:
            raise self.error(f"output would be {out}: input {self.in_nd} with stride {g.stride}, kernel {g.kernel} "
                             f"and dilation {g.dilation} is smaller than twice the pad {g.pad}")
        return out

    def engine_problem_nd(self) -> conv_nd.NDProblem:
        g = self.geo_nd  # the convolution from this layer's top to its bottom
        return conv_nd.NDProblem(self.num, self.num_output, self.out_nd, self.channels, self.group, g.kernel, g.pad,
                                 g.stride, g.dilation, self.dtype.str)

    # -- CPU (pycaffe_lite.conv.cpu on the transposed convolution) --------------------------
    def forward_cpu(self, bottom, top):
        if self.nd:
            return self._forward_cpu_nd(bottom, top)
        g = self.geo
        w = self.blobs[0].cpu_data()
        for b, t in zip(bottom, top):
            y = t.mutable_cpu_data().reshape(self.top_shape)
            cpu_conv.backward(None, w, b.cpu_data().reshape(self.bottom_shape), g.kernel, g.pad, g.stride,
                              g.dilation, self.group, dx=y)
            if self.bias_term:
                y += self.blobs[1].cpu_data()[:, None, None]

    def _forward_cpu_nd(self, bottom, top) -> None:
        g = self.geo_nd
        w = self.blobs[0].cpu_data()
        for b, t in zip(bottom, top):
            y = t.mutable_cpu_data().reshape(self.top_shape)
            cpu_conv_nd.backward(None, w, b.cpu_data().reshape(self.bottom_shape), g.kernel, g.pad, g.stride,
                                 g.dilation, self.group, dx=y)
            if self.bias_term:
                y += self.blobs[1].cpu_data().reshape((-1,) + (1,) * len(self.out_nd))

    def backward_cpu(self, top, propagate_down, bottom):
        if self.nd:
            return self._backward_cpu_nd(top, propagate_down, bottom)
        g = self.geo
        w = self.blobs[0].cpu_data()
        for i, (b, t) in enumerate(zip(bottom, top)):
            dw, db = self._param_diffs(gpu=False)
            dy = t.cpu_diff().reshape(self.top_shape)
            if db is not None:
                db += dy.sum(axis=(0, 2, 3))
            if dw is not None:
                cpu_conv.backward(dy, w, b.cpu_data().reshape(self.bottom_shape), g.kernel, g.pad, g.stride,
                                  g.dilation, self.group, dweight=dw)
            if propagate_down[i]:
                cpu_conv.forward(dy, w, None, g.kernel, g.pad, g.stride, g.dilation, self.group,
                                 b.mutable_cpu_diff().reshape(self.bottom_shape))

    def _backward_cpu_nd(self, top, propagate_down, bottom) -> None:
        g = self.geo_nd
        w = self.blobs[0].cpu_data()
        for i, (b, t) in enumerate(zip(bottom, top)):
            dw, db = self._param_diffs(gpu=False)
            dy = t.cpu_diff().reshape(self.top_shape)
            if db is not None:
                db += dy.sum(axis=(0,) + tuple(range(2, dy.ndim)))
            if dw is not None:
                cpu_conv_nd.backward(dy, w, b.cpu_data().reshape(self.bottom_shape), g.kernel, g.pad, g.stride,
                                     g.dilation, self.group, dweight=dw)
            if propagate_down[i]:
                cpu_conv_nd.forward(dy, w, None, g.kernel, g.pad, g.stride, g.dilation, self.group,
                                    b.mutable_cpu_diff().reshape(self.bottom_shape))

    # -- GPU (pycaffe_lite.conv.engines on the transposed convolution) ------------------
    def forward_gpu(self, bottom, top):
        if self.nd:
            return self._forward_gpu_nd(bottom, top)
        prob, choice = self.engines(self.forward_passes, lambda: self.autotune_operands(bottom, top))
        w = self.blobs[0].gpu_data()
        for b, t in zip(bottom, top):
            y = t.mutable_gpu_data()
            conv_engines.run(prob, choice, "backward_data", w, b.gpu_data(), y)
            if self.bias_term:
                gm.add_channel_bias(self.num, self.num_output, self.out_hw[0] * self.out_hw[1],
                                    self.blobs[1].gpu_data(), y, self.dtype)

    def autotune_operands(self, bottom, top, down=None):
        """In the transposed convolution's roles. Forward (its data gradient): ``w``, ``dy`` (bottom
        data) and ``dx`` (top data, which the forward then assigns). Backward (its weight gradient
        and forward): ``x`` (top diff), ``dy`` (bottom data), ``w`` and, where ``down``, ``y`` (bottom
        diff, which the forward pass then assigns). The bias is this layer's own: no engine operand."""
        ops = {"w": self.blobs[0].gpu_data(), "dy": bottom[0].gpu_data()}
        if down is None:
            ops["dx"] = top[0].mutable_gpu_data()
            return ops
        ops["x"] = top[0].gpu_diff()
        if down:
            ops["y"] = bottom[0].mutable_gpu_diff()
        return ops

    def backward_gpu_pair(self, prob, choice, w, dw, db, dy, b, down):
        if db is not None:
            self._bias_backward_gpu(dy, db)
        if dw is not None:
            conv_engines.run(prob, choice, "backward_weight", dy, b.gpu_data(), dw, None)
        if down:
            conv_engines.run(prob, choice, "forward", dy, w, None, b.mutable_gpu_diff())

    def _forward_gpu_nd(self, bottom, top) -> None:
        if not self.gpu_nd():  # more spatial axes than the kernels take: the CPU code on host copies
            return super().forward_gpu(bottom, top)
        prob = self.problem_nd
        w = self.blobs[0].gpu_data()
        for b, t in zip(bottom, top):
            y = t.mutable_gpu_data()
            conv_nd.backward_data(prob, w, b.gpu_data(), y)
            if self.bias_term:
                gm.add_channel_bias(self.num, self.num_output, int(np.prod(self.out_nd)), self.blobs[1].gpu_data(),
                                    y, self.dtype)

    def backward_gpu_nd(self, w, dw, db, dy, b, down):
        prob = self.problem_nd
        if db is not None:
            gm.channel_sum(self.num, self.num_output, int(np.prod(self.out_nd)), dy, db, self.dtype, beta=1.0)
        if dw is not None:
            conv_nd.backward_weight(prob, dy, b.gpu_data(), dw, None)
        if down:
            conv_nd.forward(prob, dy, w, None, b.mutable_gpu_diff())
