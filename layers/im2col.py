"""Im2col: the columns a convolution multiplies, as a layer (BVLC's Im2colLayer).

Reads ``convolution_param``'s geometry only (kernel_size / kernel_h,w, stride, pad, dilation, ``axis``;
``num_output`` and the fillers are ignored, there are no parameters). bottom ``(..., C, *S)`` with the
channel axis at ``axis`` and any number of spatial axes after it; top ``(..., C*prod(K), *O)`` with
``O`` the convolution's output sizes. Channel ``(c, k_0, ..., k_{d-1})`` of the top (kernel offsets
fastest) holds, at output position ``o``, the input element at ``o*stride - pad + k*dilation`` of
channel ``c``, zero outside the input: per image, the matrix ``(C*prod(K), prod(O))`` a convolution
multiplies its weights with. Backward sums each top diff back into the element it was read from.

CPU: :mod:`pycaffe_lite.conv.cpu_nd`. GPU: :mod:`pycaffe_lite.conv.im2col_nd` (1 to 3 spatial axes;
more run the CPU code on host copies).
"""

from __future__ import annotations

import math

from pycaffe_lite.conv import cpu_nd as cpu_conv_nd
from pycaffe_lite.conv import im2col_nd
from pycaffe_lite.conv.geometry import geometry_nd, out_shape_nd
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.memcheck import check_fits


@register_layer("Im2col")
class Im2colLayer(Layer):
    traits = Traits(graph_safe=True)
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.convolution_param
        self.axis = bottom[0].canonical_axis(p.axis)
        self.axes = bottom[0].num_axes - self.axis - 1
        if self.axes < 1:
            raise self.error(f"bottom shape {bottom[0].shape} has no spatial axis after channel axis {self.axis}")
        self.kernel, self.pad, self.stride, self.dilation = geometry_nd(p, self.axes, self.error)
        if self.axes > im2col_nd.MAX_AXES:
            self.traits = self.traits.but(graph_safe=False)  # its GPU passes run the CPU code on host copies

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) - self.axis - 1 != self.axes:
            raise self.error(f"bottom shape {shape} must keep {self.axes} spatial axes after channel axis {self.axis}")
        self.num = bottom[0].count_range(0, self.axis)
        self.channels = shape[self.axis]
        self.in_shape = tuple(shape[self.axis + 1:])
        self.out_shape = out_shape_nd(self.in_shape, self.kernel, self.pad, self.stride, self.dilation)
        if min(self.out_shape) <= 0:
            raise self.error(f"kernel {self.kernel} (dilation {self.dilation}) is larger than the input {self.in_shape} "
                             f"padded by {self.pad}")
        rows = self.channels * math.prod(self.kernel)
        check_fits("", f"the columns of kernel {self.kernel} over {self.out_shape} outputs",
                   self.num * rows * math.prod(self.out_shape), self.dtype.itemsize)
        top[0].reshape(shape[:self.axis] + (rows,) + self.out_shape)

    def _image_shape(self) -> tuple[int, ...]:
        return (self.num, self.channels) + self.in_shape

    def forward_cpu(self, bottom, top):
        cols = cpu_conv_nd.columns(bottom[0].cpu_data().reshape(self._image_shape()), self.kernel, self.pad,
                                   self.stride, self.dilation)
        top[0].mutable_cpu_data()[...] = cols.reshape(top[0].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dcol = top[0].cpu_diff().reshape(self.num, -1, math.prod(self.out_shape))
        dx = cpu_conv_nd.col2im(dcol, self._image_shape(), self.kernel, self.pad, self.stride, self.dilation)
        bottom[0].mutable_cpu_diff()[...] = dx.reshape(bottom[0].shape)

    def forward_gpu(self, bottom, top):
        if self.axes > im2col_nd.MAX_AXES:
            return super().forward_gpu(bottom, top)
        im2col_nd.im2col(bottom[0].gpu_data(), self.num, self.channels, self.in_shape, self.kernel, self.pad, self.stride,
                         self.dilation, top[0].mutable_gpu_data(), self.dtype)

    def backward_gpu(self, top, propagate_down, bottom):
        if self.axes > im2col_nd.MAX_AXES:
            return super().backward_gpu(top, propagate_down, bottom)
        if not propagate_down[0]:
            return
        im2col_nd.col2im(top[0].gpu_diff(), self.num, self.channels, self.in_shape, self.kernel, self.pad, self.stride,
                         self.dilation, bottom[0].mutable_gpu_diff(), self.dtype)
