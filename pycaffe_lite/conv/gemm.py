"""The ``gemm`` convolution engine: im2col + cuBLAS (Caffe's own path), for every geometry.

im2col (kernels in ``im2col.cu``, :mod:`.im2col`) fills a column buffer (C*kh*kw, N, Ho*Wo); one cuBLAS
strided-batched GEMM over the groups multiplies it by the weights; an axis swap turns (M, N, Ho*Wo)
into (N, M, Ho*Wo). 1x1/stride-1/pad-0 convolutions skip im2col: one strided-batched GEMM over the
images reads the input in place (not the weight gradient at output planes below
:data:`COLUMNS_1X1_WEIGHT_PLANE`); strided 1x1/pad-0 ones (ResNet's downsampling) do the same on the
input subsampled into the workspace, and their data gradient is the adjoint (zeros between the
strided pixels), so no per-group column buffer or axis swap is needed. In half precision, per-image
GEMMs over small planes whose rows are not 16-byte multiples (7x7: 98 bytes) run on copies padded
to an aligned leading dimension (:meth:`GemmEngine._padded`; on an H200, cuBLAS took 0.495 ms for
the 512x2048 by 2048x49 products of 256 images at leading dimension 49 and 0.052 ms at 56).
Batches whose columns exceed :data:`COL_BUFFER_BYTES` run in
chunks of images. It runs every pass of every geometry, so it is also the fallback for passes an
engine does not implement.
"""

from __future__ import annotations

from ..gpu import backend, blas
from ..gpu import math_functions as gm
from . import im2col as gpu_im2col
from .problem import ConvProblem
from .registry import Engine, bias_backward, register_engine, relu_inplace

COL_BUFFER_BYTES = 256 << 20  # column buffer budget; larger batches run in chunks
COLUMNS_1X1_WEIGHT_PLANE = 100  # 1x1 weight gradients at smaller output planes use columns
SUBSAMPLED_BYTES = 512 << 20  # strided 1x1 convolutions' subsampled input, at most (else columns)
ALIGN_BYTES = 16  # cuBLAS's fast half-precision GEMMs want leading dimensions in multiples of 16 bytes


@register_engine("GEMM", order=0, summary="im2col into a column buffer, one cuBLAS strided-batched GEMM over the "
                 "groups (Caffe's path; 1x1 convolutions read the input in place)")
class GemmEngine(Engine):
    """im2col + cuBLAS, every geometry and pass (the fallback for passes other engines lack)."""

    name = "gemm"

    @staticmethod
    def _chunk(prob: ConvProblem) -> int:
        per_image = prob.channels * prob.khkw * prob.out_plane * prob.itemsize
        return max(1, min(prob.num, COL_BUFFER_BYTES // max(1, per_image)))

    @staticmethod
    def _per_image(prob: ConvProblem, pass_: str) -> bool:
        """Whether ``pass_`` runs one GEMM per image straight on the blobs, without columns: for
        1x1/stride-1/pad-0 convolutions, except the weight gradient at output planes below
        :data:`COLUMNS_1X1_WEIGHT_PLANE` (its per-image partial products, N x M x C, then cost more
        than columns and one GEMM over the batch)."""
        return prob.is_1x1 and (pass_ != "backward_weight" or prob.out_plane >= COLUMNS_1X1_WEIGHT_PLANE)

    @staticmethod
    def _subsampled(prob: ConvProblem, pass_: str) -> bool:
        """Whether ``pass_`` of a strided 1x1/pad-0 convolution runs :meth:`_per_image`'s GEMMs on its
        input subsampled to the output grid (N, C, Ho, Wo) (its size at most :data:`SUBSAMPLED_BYTES`)."""
        return (prob.kernel == (1, 1) and prob.pad == (0, 0) and prob.stride != (1, 1)
                and (pass_ != "backward_weight" or prob.out_plane >= COLUMNS_1X1_WEIGHT_PLANE)
                and prob.num * prob.channels * prob.out_plane * prob.itemsize <= SUBSAMPLED_BYTES)

    @classmethod
    def _padded(cls, prob: ConvProblem, pass_: str) -> int:
        """The padded plane (0: none) the per-image GEMMs of ``pass_`` (the forward or data gradient
        of a 1x1 convolution that runs them, :meth:`_per_image` or :meth:`_subsampled`) run on: half
        storage, output planes below :data:`COLUMNS_1X1_WEIGHT_PLANE` whose bytes are not a multiple
        of :data:`ALIGN_BYTES` (larger unaligned planes, 14x14, ran as fast unpadded as padded with
        the copies counted)."""
        p = prob.out_plane
        if (pass_ == "backward_weight" or backend.math_dtype(prob.np_dtype) == prob.np_dtype
                or p >= COLUMNS_1X1_WEIGHT_PLANE or (p * prob.itemsize) % ALIGN_BYTES == 0
                or not (cls._subsampled(prob, pass_) or cls._per_image(prob, pass_))):
            return 0
        step = ALIGN_BYTES // prob.itemsize
        return -(-p // step) * step

    def scratch(self, prob, pass_, has_bias):
        isz = prob.itemsize
        padded = self._padded(prob, pass_)
        if padded:  # (the subsampled input or data gradient,) the GEMM's input and output on padded planes
            ins, outs = (prob.channels, prob.num_output) if pass_ == "forward" else (prob.num_output, prob.channels)
            pads = (prob.num * ins * padded * isz, prob.num * outs * padded * isz)
            return ((prob.num * prob.channels * prob.out_plane * isz,) if self._subsampled(prob, pass_) else ()) + pads
        if self._subsampled(prob, pass_):  # the subsampled input (or data gradient), the weight pass's products
            sub = prob.num * prob.channels * prob.out_plane * isz
            return (sub, prob.num * prob.mg * prob.cg * isz) if pass_ == "backward_weight" else (sub,)
        if self._per_image(prob, pass_):  # the weight pass's per-image partial products; no columns
            return (prob.num * prob.mg * prob.cg * isz,) if pass_ == "backward_weight" else ()
        nmax = self._chunk(prob)
        return prob.group * prob.kg * nmax * prob.out_plane * isz, prob.num_output * nmax * prob.out_plane * isz

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        dt, isz = prob.np_dtype, prob.itemsize
        mg, kg, p, m = prob.mg, prob.kg, prob.out_plane, prob.num_output
        chw = prob.channels * prob.in_plane
        subsampled = self._subsampled(prob, "forward")
        if subsampled:  # x[:, :, ::sh, ::sw] into the workspace, then as a 1x1 convolution
            gpu_im2col.subsample_planes(x, prob.num * prob.channels, (prob.height, prob.width), prob.stride,
                                        ws[0], dt)
            x, chw = ws[0], prob.channels * p
        if subsampled or self._per_image(prob, "forward"):
            padded = self._padded(prob, "forward")
            ld, out = p, y
            if padded:  # x and the product on planes padded to `padded` columns, then compacted into y
                gpu_im2col.copy_planes(x, prob.num * prob.channels, p, p, ws[-2], padded, dt)
                ld, out, x, chw = padded, ws[-1], ws[-2], prob.channels * padded
            # out[n, g] (mg, P) = W[g] (mg, cg) . x[n, g] (cg, P), per image (leading dimension ld)
            for g in range(prob.group):
                blas.gemm_strided_batched(False, False, mg, ld, kg, 1.0, w + g * mg * kg * isz, 0,
                                          x + g * kg * ld * isz, chw, 0.0, out + g * mg * ld * isz, m * ld, prob.num,
                                          dt)
            if padded:
                gpu_im2col.copy_planes(out, prob.num * m, p, padded, y, p, dt)
        else:
            col, yt = ws
            for n0, nb in self._chunks(prob):
                self._im2col(prob, x + n0 * chw * isz, nb, col)
                # yt[g] (mg, nb*P) = W[g] (mg, kg) . col[g] (kg, nb*P), for every group g
                blas.gemm_strided_batched(False, False, mg, nb * p, kg, 1.0, w, mg * kg, col, kg * nb * p,
                                          0.0, yt, mg * nb * p, prob.group, dt)
                gpu_im2col.swap_leading_axes(yt, m, nb, p, y + n0 * m * p * isz, dt)  # -> (nb, M, P)
        if bias is not None:
            gm.add_channel_bias(prob.num, m, p, bias, y, dt, relu)
        elif relu:
            relu_inplace(prob.num * m * p, y, dt)

    def _chunks(self, prob: ConvProblem) -> list[tuple[int, int]]:
        """(first image, images) of each chunk whose columns fit in COL_BUFFER_BYTES."""
        nmax = self._chunk(prob)
        return [(n0, min(nmax, prob.num - n0)) for n0 in range(0, prob.num, nmax)]

    @staticmethod
    def _im2col(prob: ConvProblem, x: int, nb: int, col: int) -> None:
        gpu_im2col.im2col(x, nb, prob.channels, (prob.height, prob.width), prob.kernel, prob.pad, prob.stride,
                          prob.dilation, col, prob.np_dtype)

    def backward_data(self, prob, w, dy, dx, ws):
        dt, isz = prob.np_dtype, prob.itemsize
        mg, kg, p, m = prob.mg, prob.kg, prob.out_plane, prob.num_output
        chw = prob.channels * prob.in_plane
        subsampled = self._subsampled(prob, "backward_data")
        if subsampled or self._per_image(prob, "backward_data"):
            # dx[n, g] (cg, P) = W[g]^T (cg, mg) . dy[n, g] (mg, P), batched over images (strided: into
            # the workspace at the output grid, then spread to the strided pixels, zeros between)
            out, out_chw = (ws[0], prob.channels * p) if subsampled else (dx, chw)
            padded = self._padded(prob, "backward_data")
            ld, into = p, out
            if padded:  # dy and the product on planes padded to `padded` columns, then compacted into out
                gpu_im2col.copy_planes(dy, prob.num * m, p, p, ws[-2], padded, dt)
                ld, into, dy, out_chw = padded, ws[-1], ws[-2], prob.channels * padded
            for g in range(prob.group):
                blas.gemm_strided_batched(True, False, kg, ld, mg, 1.0, w + g * mg * kg * isz, 0,
                                          dy + g * mg * ld * isz, m * ld, 0.0, into + g * kg * ld * isz, out_chw,
                                          prob.num, dt)
            if padded:
                gpu_im2col.copy_planes(into, prob.num * prob.channels, p, padded, out, p, dt)
            if subsampled:
                gpu_im2col.upsample_planes(out, prob.num * prob.channels, (prob.height, prob.width), prob.stride,
                                           dx, dt)
            return
        col, dyt = ws
        for n0, nb in self._chunks(prob):
            gpu_im2col.swap_leading_axes(dy + n0 * m * p * isz, nb, m, p, dyt, dt)  # -> (M, nb, P)
            # col[g] (kg, nb*P) = W[g]^T (kg, mg) . dyt[g] (mg, nb*P), then back to images
            blas.gemm_strided_batched(True, False, kg, nb * p, mg, 1.0, w, mg * kg, dyt, mg * nb * p,
                                      0.0, col, kg * nb * p, prob.group, dt)
            gpu_im2col.col2im(col, nb, prob.channels, (prob.height, prob.width), prob.kernel, prob.pad,
                              prob.stride, prob.dilation, dx + n0 * chw * isz, dt)

    def backward_weight(self, prob, x, dy, dw, db, ws):
        dt, isz = prob.np_dtype, prob.itemsize
        mg, kg, p, m, n = prob.mg, prob.kg, prob.out_plane, prob.num_output, prob.num
        chw = prob.channels * prob.in_plane
        subsampled = self._subsampled(prob, "backward_weight")
        if subsampled or self._per_image(prob, "backward_weight"):
            if subsampled:  # the forward's subsampled input again
                sub, part = ws
                gpu_im2col.subsample_planes(x, prob.num * prob.channels, (prob.height, prob.width), prob.stride,
                                            sub, dt)
                x, chw = sub, prob.channels * p
            else:
                part, = ws
            for g in range(prob.group):  # part[n] = dy[n, g] . x[n, g]^T, then dW[g] += sum over n
                blas.gemm_strided_batched(False, True, mg, kg, p, 1.0, dy + g * mg * p * isz, m * p,
                                          x + g * kg * p * isz, chw, 0.0, part, mg * kg, n, dt)
                blas.gemv(True, n, mg * kg, 1.0, part, gm.ones_vector(n, dt), 1.0, dw + g * mg * kg * isz, dt)
        else:
            col, dyt = ws
            for n0, nb in self._chunks(prob):
                gpu_im2col.swap_leading_axes(dy + n0 * m * p * isz, nb, m, p, dyt, dt)  # -> (M, nb, P)
                self._im2col(prob, x + n0 * chw * isz, nb, col)
                # dW[g] (mg, kg) += dyt[g] (mg, nb*P) . col[g]^T (nb*P, kg)
                blas.gemm_strided_batched(False, True, mg, kg, nb * p, 1.0, dyt, mg * nb * p, col, kg * nb * p,
                                          1.0, dw, mg * kg, prob.group, dt)
        if db is not None:  # after the scratch is used: a helper may take the workspace itself
            bias_backward(prob, dy, db)
