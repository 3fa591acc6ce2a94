"""Deconvolution (transposed convolution) over 2-D images, BVLC semantics.

bottom (..., C, H, W) with the channel axis at ``axis`` (default 1; leading axes are the batch);
weight (C, num_output/group, kh, kw), stored as Caffe stores it (the layout of the convolution
whose backward pass this is); bias (num_output,); top (..., num_output, Ho, Wo) with
``Ho = stride_h*(H - 1) + dilation_h*(kh - 1) + 1 - 2*pad_h`` (likewise Wo). Several bottoms may be
given; each uses the same weights and writes the top of the same index.

Forward is the data gradient of the matching convolution: columns ``W[g]ᵀ·x[g]`` per group are
summed back into the (larger) output with col2im. Backward: the bottom diff is that convolution's
forward, ``W[g]·im2col(dy)``; the weight diff accumulates ``x[g]·im2col(dy)[g]ᵀ``; the bias diff
sums dy over images and pixels. CPU: whole-batch numpy GEMMs; GPU: the column buffer
(num_output*kh*kw, N, H*W) of ``pycaffe_lite.gpu.im2col`` and strided-batched cuBLAS GEMMs over the
groups, in chunks of images when the columns exceed :data:`COL_BUFFER_BYTES`.
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite.gpu import blas
from pycaffe_lite.gpu import im2col as gpu_im2col
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.im2col import col2im, im2col
from pycaffe_lite.layer import register_layer

from .convolution import COL_BUFFER_BYTES, ConvolutionBase


@register_layer("Deconvolution")
class DeconvolutionLayer(ConvolutionBase):
    def weight_shape(self) -> tuple[int, ...]:
        return (self.channels, self.num_output // self.group) + self.geo.kernel  # as Caffe stores it

    def reshape(self, bottom, top):
        self._reshape_bottoms(bottom)
        g = self.geo
        extent = tuple(d * (k - 1) + 1 for k, d in zip(g.kernel, g.dilation))
        self.out_hw = tuple(s * (n - 1) + e - 2 * p for n, s, e, p in zip(self.in_hw, g.stride, extent, g.pad))
        if min(self.out_hw) <= 0:
            raise self.error(
                f"output would be {self.out_hw[0]}x{self.out_hw[1]}: input {self.in_hw[0]}x{self.in_hw[1]} "
                f"with stride {g.stride[0]}x{g.stride[1]} and kernel extent {extent[0]}x{extent[1]} "
                f"is smaller than twice the pad {g.pad[0]}x{g.pad[1]}"
            )
        for t in top:
            t.reshape(bottom[0].shape[:self.axis] + (self.num_output,) + self.out_hw)

    # -- CPU --------------------------------------------------------------------------------
    def _weights(self) -> np.ndarray:
        """(G, C/G, Kg) with Kg = num_output/G*kh*kw."""
        return self.blobs[0].cpu_data().reshape(self.group, self.channels // self.group, -1)

    def _input(self, blob) -> np.ndarray:
        return blob.cpu_data().reshape(self.num, self.group, self.channels // self.group, -1)

    def _out_columns(self, dy: np.ndarray) -> np.ndarray:
        """(N, G, Kg, H*W) columns of an output-sized batch (N, num_output, Ho, Wo)."""
        g = self.geo
        col = dy if g.is_1x1 else im2col(dy, g.kernel, g.pad, g.stride, g.dilation)
        return col.reshape(self.num, self.group, -1, self.in_hw[0] * self.in_hw[1])

    def forward_cpu(self, bottom, top):
        w = self._weights()
        g = self.geo
        for b, t in zip(bottom, top):
            cols = np.matmul(w.transpose(0, 2, 1), self._input(b))  # (N, G, Kg, H*W)
            if g.is_1x1:
                y = cols.reshape((self.num, self.num_output) + self.out_hw)
            else:
                cols = cols.reshape((self.num, self.num_output) + g.kernel + self.in_hw)
                y = col2im(cols, self.out_hw, g.pad, g.stride, g.dilation)
            if self.bias_term:
                y = y + self.blobs[1].cpu_data()[:, None, None]
            t.mutable_cpu_data()[...] = y.reshape(t.shape)

    def backward_cpu(self, top, propagate_down, bottom):
        w = self._weights()
        for i, (b, t) in enumerate(zip(bottom, top)):
            dy = t.cpu_diff().reshape((self.num, self.num_output) + self.out_hw)
            if self.bias_term and self.param_propagate_down[1]:
                self.blobs[1].mutable_cpu_diff()[...] += dy.sum(axis=(0, 2, 3))
            if not (self.param_propagate_down[0] or propagate_down[i]):
                continue
            cols = self._out_columns(dy)
            if self.param_propagate_down[0]:
                x = self._input(b)
                dw = self.blobs[0].mutable_cpu_diff().reshape(w.shape)
                for g in range(self.group):  # (Cg, N·P) x (N·P, Kg): one GEMM per group
                    dw[g] += np.tensordot(x[:, g], cols[:, g], axes=([0, 2], [0, 2]))
            if propagate_down[i]:
                b.mutable_cpu_diff()[...] = np.matmul(w, cols).reshape(b.shape)

    # -- GPU --------------------------------------------------------------------------------
    def _chunks(self) -> list[tuple[int, int]]:
        """Image ranges [n0, n1) whose column buffer fits in COL_BUFFER_BYTES (at least one image)."""
        kh, kw = self.geo.kernel
        per_image = self.num_output * kh * kw * self.in_hw[0] * self.in_hw[1]
        step = max(1, min(self.num, COL_BUFFER_BYTES // max(1, per_image * self.dtype.itemsize)))
        return [(n0, min(n0 + step, self.num)) for n0 in range(0, self.num, step)]

    def _dims(self) -> tuple[int, int, int]:
        """(Cg, Kg, P): input channels and column rows per group, input pixels per image."""
        kh, kw = self.geo.kernel
        return self.channels // self.group, self.num_output // self.group * kh * kw, self.in_hw[0] * self.in_hw[1]

    def _geometry(self) -> tuple:
        g = self.geo
        return self.out_hw, g.kernel, g.pad, g.stride, g.dilation

    def forward_gpu(self, bottom, top):
        dt, isz = self.dtype, self.dtype.itemsize
        cg, kg, p = self._dims()
        m, c = self.num_output, self.channels
        out_p = self.out_hw[0] * self.out_hw[1]
        chunks = self._chunks()
        nmax = chunks[0][1]
        col = self._buffer("col", self.group * kg * nmax * p)
        xt = self._buffer("xt", c * nmax * p)
        w = self.blobs[0].gpu_data()
        for b, t in zip(bottom, top):
            x, y = b.gpu_data(), t.mutable_gpu_data()
            for n0, n1 in chunks:
                nb = n1 - n0
                gpu_im2col.swap_leading_axes(x + n0 * c * p * isz, nb, c, p, xt, dt)  # -> (C, nb, P)
                # col[g] (kg, nb·P) = W[g]ᵀ (kg, cg) · xt[g] (cg, nb·P), for every group g
                blas.gemm_strided_batched(True, False, kg, nb * p, cg, 1.0, w, cg * kg, xt, cg * nb * p,
                                          0.0, col, kg * nb * p, self.group, dt)
                gpu_im2col.col2im(col, nb, m, *self._geometry(), y + n0 * m * out_p * isz, dt)
            if self.bias_term:
                gm.add_channel_bias(self.num, m, out_p, self.blobs[1].gpu_data(), y, dt)

    def backward_gpu(self, top, propagate_down, bottom):
        dt, isz = self.dtype, self.dtype.itemsize
        cg, kg, p = self._dims()
        m, c = self.num_output, self.channels
        out_p = self.out_hw[0] * self.out_hw[1]
        chunks = self._chunks()
        nmax = chunks[0][1]
        w = self.blobs[0].gpu_data()
        for i, (b, t) in enumerate(zip(bottom, top)):
            dy = t.gpu_diff()
            if self.bias_term and self.param_propagate_down[1]:
                gm.channel_sum(self.num, m, out_p, dy, self.blobs[1].mutable_gpu_diff(), dt, beta=1.0)
            if not (self.param_propagate_down[0] or propagate_down[i]):
                continue
            col = self._buffer("col", self.group * kg * nmax * p)
            xt = self._buffer("xt", c * nmax * p)
            x = b.gpu_data()
            dx = b.mutable_gpu_diff() if propagate_down[i] else 0
            for n0, n1 in chunks:
                nb = n1 - n0
                gpu_im2col.im2col(dy + n0 * m * out_p * isz, nb, m, *self._geometry(), col, dt)
                if self.param_propagate_down[0]:
                    gpu_im2col.swap_leading_axes(x + n0 * c * p * isz, nb, c, p, xt, dt)
                    # dW[g] (cg, kg) += xt[g] (cg, nb·P) · col[g]ᵀ (nb·P, kg)
                    blas.gemm_strided_batched(False, True, cg, kg, nb * p, 1.0, xt, cg * nb * p, col, kg * nb * p,
                                              1.0, self.blobs[0].mutable_gpu_diff(), cg * kg, self.group, dt)
                if propagate_down[i]:
                    # dxt[g] (cg, nb·P) = W[g] (cg, kg) · col[g] (kg, nb·P), then back to (nb, C, P)
                    blas.gemm_strided_batched(False, False, cg, nb * p, kg, 1.0, w, cg * kg, col, kg * nb * p,
                                              0.0, xt, cg * nb * p, self.group, dt)
                    gpu_im2col.swap_leading_axes(xt, c, nb, p, dx + n0 * c * p * isz, dt)
