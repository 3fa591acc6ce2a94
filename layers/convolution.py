"""Convolution over 2-D images, with padding, stride, dilation and groups (BVLC semantics).

bottom (..., C, H, W) with the channel axis at ``axis`` (default 1; leading axes are the batch);
weight (num_output, C/group, kh, kw); bias (num_output,); top (..., num_output, Ho, Wo) with
``Ho = (H + 2*pad_h - (dilation_h*(kh-1)+1)) // stride_h + 1`` (likewise Wo). Several bottoms
may be given: each is convolved with the same weights into the top of the same index.

The whole minibatch is done at once. CPU: im2col of the batch, one ``np.matmul`` over
(images, groups); 1x1/stride 1/pad 0 convolutions use the input directly. GPU: im2col into a
column buffer (C*kh*kw, N, Ho*Wo), one cuBLAS strided-batched GEMM over the groups, and an axis
swap into (N, M, Ho*Wo); batches whose columns exceed :data:`COL_BUFFER_BYTES` run in chunks of
images. ``engine`` CUDNN is accepted and runs the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pycaffe_lite import fillers
from pycaffe_lite.gpu import backend, blas
from pycaffe_lite.gpu import im2col as gpu_im2col
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.im2col import Pair, col2im, im2col, out_shape
from pycaffe_lite.layer import Layer, register_layer

COL_BUFFER_BYTES = 256 << 20  # GPU column buffer budget per layer; larger batches run in chunks


@dataclass(frozen=True)
class ConvGeometry:
    """Kernel, pad, stride and dilation of a 2-D convolution, each an ``(h, w)`` pair."""

    kernel: Pair
    pad: Pair
    stride: Pair
    dilation: Pair

    @property
    def is_1x1(self) -> bool:
        """A pointwise convolution whose columns are the input itself."""
        return self.kernel == (1, 1) and self.stride == (1, 1) and self.pad == (0, 0)


def _pair(layer: Layer, p: Any, repeated: str, hw: str | None, default: int) -> Pair:
    """Read the repeated field ``repeated`` (0, 1 or 2 values) or the ``<hw>_h``/``<hw>_w`` pair."""
    values = list(getattr(p, repeated))
    has_h, has_w = (p.HasField(f"{hw}_h"), p.HasField(f"{hw}_w")) if hw else (False, False)
    if has_h or has_w:
        if not (has_h and has_w):
            raise layer.error(f"{hw}_h and {hw}_w must be given together")
        if values:
            raise layer.error(f"give either {repeated} or {hw}_h/{hw}_w, not both")
        return getattr(p, f"{hw}_h"), getattr(p, f"{hw}_w")
    if not values:
        return default, default
    if len(values) == 1:
        return values[0], values[0]
    if len(values) == 2:
        return values[0], values[1]
    raise layer.error(f"{repeated} has {len(values)} values; 2-D convolution takes 1 or 2")


def conv_geometry(layer: Layer, p: Any) -> ConvGeometry:
    """Parse and check the geometry of a ConvolutionParameter (shared with Deconvolution)."""
    if not p.kernel_size and not (p.HasField("kernel_h") or p.HasField("kernel_w")):
        raise layer.error("convolution_param needs kernel_size or kernel_h and kernel_w")
    geo = ConvGeometry(
        kernel=_pair(layer, p, "kernel_size", "kernel", 0),
        pad=_pair(layer, p, "pad", "pad", 0),
        stride=_pair(layer, p, "stride", "stride", 1),
        dilation=_pair(layer, p, "dilation", None, 1),
    )
    for what, values in (("kernel size", geo.kernel), ("stride", geo.stride), ("dilation", geo.dilation)):
        if min(values) <= 0:
            raise layer.error(f"{what} must be positive, got {values[0]}x{values[1]}")
    return geo


class ConvolutionBase(Layer):
    """Set-up shared by Convolution and Deconvolution (Caffe's BaseConvolutionLayer): parameters,
    group checks and the weight/bias blobs, whose weight shape each subclass gives."""

    min_bottom_blobs = 1
    min_top_blobs = 1
    equal_num_bottom_top_blobs = True

    def weight_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def layer_setup(self, bottom, top):
        p = self.layer_param.convolution_param
        self.geo = conv_geometry(self, p)
        if not p.HasField("num_output") or p.num_output == 0:
            raise self.error("convolution_param.num_output is required and must be positive")
        self.num_output = p.num_output
        self.group = p.group
        self.bias_term = p.bias_term
        self.axis = bottom[0].canonical_axis(p.axis)
        if bottom[0].num_axes - self.axis - 1 != 2:
            raise self.error(
                f"only 2-D {self.type.lower()} is supported: bottom shape {bottom[0].shape} has "
                f"{bottom[0].num_axes - self.axis - 1} spatial axes after channel axis {self.axis}"
            )
        self.channels = bottom[0].shape[self.axis]
        if self.group <= 0:
            raise self.error(f"group must be positive, got {self.group}")
        if self.channels % self.group:
            raise self.error(f"{self.channels} input channels are not divisible by group {self.group}")
        if self.num_output % self.group:
            raise self.error(f"num_output {self.num_output} is not divisible by group {self.group}")
        w_shape = self.weight_shape()
        shapes = [w_shape] + ([(self.num_output,)] if self.bias_term else [])
        if self.blobs:
            if len(self.blobs) != len(shapes):
                raise self.error(f"has {len(self.blobs)} param blobs, expected {len(shapes)} "
                                 f"(bias_term: {self.bias_term})")
            self.check_param_shapes(shapes)
        else:
            self.blobs = [self.make_param_blob(w_shape)]
            fillers.fill(self.blobs[0], p.weight_filler)
            if self.bias_term:
                self.blobs.append(self.make_param_blob((self.num_output,)))
                fillers.fill(self.blobs[1], p.bias_filler)
        self._gpu_buffers: dict[str, tuple[int, Any]] = {}

    def _reshape_bottoms(self, bottom) -> None:
        """Check the bottoms against the weights; set ``num`` and ``in_hw``."""
        shape = bottom[0].shape
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != shape:
                raise self.error(f"all bottoms must have one shape: bottom 0 is {shape}, bottom {i} is {b.shape}")
        if shape[self.axis] != self.channels:
            raise self.error(f"bottom has {shape[self.axis]} channels (shape {shape}), weights expect {self.channels}")
        self.num = bottom[0].count_range(0, self.axis)
        self.in_hw = shape[self.axis + 1:]
        if len(self.in_hw) != 2:
            raise self.error(f"bottom shape {shape} must have 2 spatial axes after channel axis {self.axis}")


@register_layer("Convolution")
class ConvolutionLayer(ConvolutionBase):
    def weight_shape(self) -> tuple[int, ...]:
        return (self.num_output, self.channels // self.group) + self.geo.kernel

    def reshape(self, bottom, top):
        self._reshape_bottoms(bottom)
        g = self.geo
        self.out_hw = out_shape(self.in_hw[0], self.in_hw[1], g.kernel, g.pad, g.stride, g.dilation)
        if min(self.out_hw) <= 0:
            raise self.error(
                f"kernel {g.kernel[0]}x{g.kernel[1]} (dilation {g.dilation[0]}x{g.dilation[1]}) is larger "
                f"than the input {self.in_hw[0]}x{self.in_hw[1]} padded by {g.pad[0]}x{g.pad[1]}"
            )
        for t in top:
            t.reshape(bottom[0].shape[:self.axis] + (self.num_output,) + self.out_hw)

    # -- CPU --------------------------------------------------------------------------------
    def _columns(self, x: np.ndarray) -> np.ndarray:
        """(N, G, Kg, P) columns of the image batch x (N, C, H, W), Kg = C/G*kh*kw."""
        g = self.geo
        col = x if g.is_1x1 else im2col(x, g.kernel, g.pad, g.stride, g.dilation)
        return col.reshape(self.num, self.group, -1, self.out_hw[0] * self.out_hw[1])

    def _weights(self) -> np.ndarray:
        return self.blobs[0].cpu_data().reshape(self.group, self.num_output // self.group, -1)

    def forward_cpu(self, bottom, top):
        w = self._weights()
        for b, t in zip(bottom, top):
            x = b.cpu_data().reshape((self.num, self.channels) + self.in_hw)
            y = np.matmul(w, self._columns(x)).reshape(self.num, self.num_output, -1)
            if self.bias_term:
                y += self.blobs[1].cpu_data()[:, None]
            t.mutable_cpu_data()[...] = y.reshape(t.shape)

    def backward_cpu(self, top, propagate_down, bottom):
        w = self._weights()
        mg = self.num_output // self.group
        for i, (b, t) in enumerate(zip(bottom, top)):
            dy = t.cpu_diff().reshape(self.num, self.group, mg, -1)
            if self.bias_term and self.param_propagate_down[1]:
                self.blobs[1].mutable_cpu_diff()[...] += dy.sum(axis=(0, 3)).reshape(-1)
            if self.param_propagate_down[0]:
                x = b.cpu_data().reshape((self.num, self.channels) + self.in_hw)
                cols = self._columns(x)
                dw = self.blobs[0].mutable_cpu_diff().reshape(w.shape)
                for g in range(self.group):  # (mg, P·N) x (P·N, Kg): one GEMM per group
                    dw[g] += np.tensordot(dy[:, g], cols[:, g], axes=([0, 2], [0, 2]))
            if propagate_down[i]:
                dcols = np.matmul(w.transpose(0, 2, 1), dy)  # (N, G, Kg, P)
                geo = self.geo
                if geo.is_1x1:
                    dx = dcols
                else:
                    dcols = dcols.reshape((self.num, self.channels) + geo.kernel + self.out_hw)
                    dx = col2im(dcols, self.in_hw, geo.pad, geo.stride, geo.dilation)
                b.mutable_cpu_diff()[...] = dx.reshape(b.shape)

    # -- GPU --------------------------------------------------------------------------------
    def _buffer(self, name: str, count: int) -> int:
        """A device buffer of at least ``count`` elements, kept on the layer and grown as needed."""
        nbytes = count * self.dtype.itemsize
        have = self._gpu_buffers.get(name)
        if have is None or have[0] < nbytes:
            self._gpu_buffers[name] = have = (nbytes, backend.alloc(nbytes))
        return int(have[1])

    def _chunks(self) -> list[tuple[int, int]]:
        """Image ranges [n0, n1) whose column buffer fits in COL_BUFFER_BYTES (at least one image)."""
        per_image = self.channels * self.geo.kernel[0] * self.geo.kernel[1] * self.out_hw[0] * self.out_hw[1]
        step = max(1, min(self.num, COL_BUFFER_BYTES // max(1, per_image * self.dtype.itemsize)))
        return [(n0, min(n0 + step, self.num)) for n0 in range(0, self.num, step)]

    def _gemm_dims(self) -> tuple[int, int, int]:
        """(Mg, Kg, P): outputs and column rows per group, output pixels per image."""
        kg = self.channels // self.group * self.geo.kernel[0] * self.geo.kernel[1]
        return self.num_output // self.group, kg, self.out_hw[0] * self.out_hw[1]

    def _im2col(self, x: int, nb: int, col: int) -> None:
        g = self.geo
        gpu_im2col.im2col(x, nb, self.channels, self.in_hw, g.kernel, g.pad, g.stride, g.dilation, col, self.dtype)

    def forward_gpu(self, bottom, top):
        dt, isz = self.dtype, self.dtype.itemsize
        mg, kg, p = self._gemm_dims()
        m, chw = self.num_output, self.channels * self.in_hw[0] * self.in_hw[1]
        chunks = self._chunks()
        nmax = chunks[0][1]
        col = self._buffer("col", self.group * kg * nmax * p)
        yt = self._buffer("yt", m * nmax * p)
        w = self.blobs[0].gpu_data()
        for b, t in zip(bottom, top):
            x, y = b.gpu_data(), t.mutable_gpu_data()
            for n0, n1 in chunks:
                nb = n1 - n0
                self._im2col(x + n0 * chw * isz, nb, col)
                # yt[g] (mg, nb·P) = W[g] (mg, kg) · col[g] (kg, nb·P), for every group g
                blas.gemm_strided_batched(False, False, mg, nb * p, kg, 1.0, w, mg * kg, col, kg * nb * p,
                                          0.0, yt, mg * nb * p, self.group, dt)
                gpu_im2col.swap_leading_axes(yt, m, nb, p, y + n0 * m * p * isz, dt)  # (M, nb, P) -> (nb, M, P)
            if self.bias_term:
                gm.add_channel_bias(self.num, m, p, self.blobs[1].gpu_data(), y, dt)

    def backward_gpu(self, top, propagate_down, bottom):
        dt, isz = self.dtype, self.dtype.itemsize
        mg, kg, p = self._gemm_dims()
        m, chw = self.num_output, self.channels * self.in_hw[0] * self.in_hw[1]
        chunks = self._chunks()
        nmax = chunks[0][1]
        col = self._buffer("col", self.group * kg * nmax * p)
        dyt = self._buffer("yt", m * nmax * p)
        w = self.blobs[0].gpu_data()
        for i, (b, t) in enumerate(zip(bottom, top)):
            dy = t.gpu_diff()
            if self.bias_term and self.param_propagate_down[1]:
                gm.channel_sum(self.num, m, p, dy, self.blobs[1].mutable_gpu_diff(), dt, beta=1.0)
            if not (self.param_propagate_down[0] or propagate_down[i]):
                continue
            x = b.gpu_data()
            dx = b.mutable_gpu_diff() if propagate_down[i] else 0
            for n0, n1 in chunks:
                nb = n1 - n0
                gpu_im2col.swap_leading_axes(dy + n0 * m * p * isz, nb, m, p, dyt, dt)  # -> (M, nb, P)
                if self.param_propagate_down[0]:
                    self._im2col(x + n0 * chw * isz, nb, col)
                    # dW[g] (mg, kg) += dyt[g] (mg, nb·P) · col[g]ᵀ (nb·P, kg)
                    blas.gemm_strided_batched(False, True, mg, kg, nb * p, 1.0, dyt, mg * nb * p, col, kg * nb * p,
                                              1.0, self.blobs[0].mutable_gpu_diff(), mg * kg, self.group, dt)
                if propagate_down[i]:
                    # col[g] (kg, nb·P) = W[g]ᵀ (kg, mg) · dyt[g] (mg, nb·P), then back to images
                    blas.gemm_strided_batched(True, False, kg, nb * p, mg, 1.0, w, mg * kg, dyt, mg * nb * p,
                                              0.0, col, kg * nb * p, self.group, dt)
                    g = self.geo
                    gpu_im2col.col2im(col, nb, self.channels, self.in_hw, g.kernel, g.pad, g.stride, g.dilation,
                                      dx + n0 * chw * isz, dt)

