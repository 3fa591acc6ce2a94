"""GPU im2col / col2im for a whole minibatch of 2-D images (kernels in ``im2col.cu``).

Image batch: (num, C, H, W). Column buffer: (C*kh*kw, num, Ho*Wo), batch inside the columns, so
one GEMM ``W (M, C*kh*kw) · col`` covers the whole batch and yields ``(M, num, Ho*Wo)``;
:func:`swap_leading_axes` turns that into ``(num, M, Ho*Wo)`` and back. Geometry arguments are
``(h, w)`` pairs; pointers are device addresses (ints); everything runs on the backend stream.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import CudaError
from ..gpu import backend
from .geometry import Pair, out_shape

KERNELS = Path(__file__).with_name("im2col.cu")


def _geometry(num: int, channels: int, image_hw: Pair, kernel: Pair, pad: Pair, stride: Pair,
              dilation: Pair) -> tuple[int, ...]:
    """The kernels' geometry arguments: num, channels, H, W, then kernel, pad, stride, dilation
    (each h, w), Ho, Wo."""
    ho, wo = out_shape(image_hw[0], image_hw[1], kernel, pad, stride, dilation)
    if ho <= 0 or wo <= 0:
        raise CudaError(f"im2col: kernel {kernel} (dilation {dilation}) exceeds input {image_hw} padded by {pad}")
    col_count = channels * kernel[0] * kernel[1] * num * ho * wo
    if max(col_count, num * channels * image_hw[0] * image_hw[1]) > backend.INT32_MAX:
        raise CudaError(f"im2col: {col_count} column elements exceed int32 indexing; use smaller batches")
    return (num, channels, image_hw[0], image_hw[1], kernel[0], kernel[1], pad[0], pad[1],
            stride[0], stride[1], dilation[0], dilation[1], ho, wo)


def im2col(data_im: int, num: int, channels: int, image_hw: Pair, kernel: Pair, pad: Pair, stride: Pair,
           dilation: Pair, data_col: int, dtype) -> None:
    """Fill ``data_col`` (C*kh*kw, num, Ho*Wo) from the image batch ``data_im`` (num, C, H, W)."""
    geo = _geometry(num, channels, image_hw, kernel, pad, stride, dilation)
    n = channels * num * geo[-2] * geo[-1]
    backend.kernel(KERNELS, "im2col_batch", dtype)(n, data_im, *geo, data_col)


def col2im(data_col: int, num: int, channels: int, image_hw: Pair, kernel: Pair, pad: Pair, stride: Pair,
           dilation: Pair, data_im: int, dtype) -> None:
    """Assign to ``data_im`` (num, C, H, W) the sums of the column entries (C*kh*kw, num, Ho*Wo) that
    read each pixel (the adjoint of :func:`im2col`)."""
    geo = _geometry(num, channels, image_hw, kernel, pad, stride, dilation)
    n = num * channels * image_hw[0] * image_hw[1]
    backend.kernel(KERNELS, "col2im_batch", dtype)(n, data_col, *geo, data_im)


def swap_leading_axes(src: int, a_dim: int, b_dim: int, inner: int, dst: int, dtype) -> None:
    """``dst (b_dim, a_dim, inner) = src (a_dim, b_dim, inner)`` with the leading axes swapped."""
    n = a_dim * b_dim * inner
    backend.kernel(KERNELS, "swap_leading_axes", dtype)(n, src, a_dim, b_dim, inner, dst)


def copy_planes(src: int, planes: int, plane: int, src_stride: int, dst: int, dst_stride: int, dtype) -> None:
    """``dst (planes, dst_stride)[:, :plane] = src (planes, src_stride)[:, :plane]`` (the other values
    of ``dst`` are left as they are)."""
    count = planes * plane
    if count > backend.INT32_MAX:
        raise CudaError(f"copy_planes: {count} elements exceed int32 indexing")
    backend.kernel(KERNELS, "copy_planes", dtype)(count, src, src_stride, plane, dst_stride, dst)


def subsample_planes(x: int, planes: int, image_hw: Pair, stride: Pair, y: int, dtype) -> None:
    """``y (planes, Ho, Wo) = x (planes, H, W)[:, ::sh, ::sw]`` (a strided 1x1 convolution's input)."""
    (h, w), (sh, sw) = image_hw, stride
    ho, wo = (h - 1) // sh + 1, (w - 1) // sw + 1
    backend.kernel(KERNELS, "subsample_planes", dtype)(planes * ho * wo, x, h, w, ho, wo, sh, sw, y)


def upsample_planes(y: int, planes: int, image_hw: Pair, stride: Pair, x: int, dtype) -> None:
    """The adjoint of :func:`subsample_planes`: ``x`` holds ``y`` at every stride-th pixel and 0 elsewhere."""
    (h, w), (sh, sw) = image_hw, stride
    ho, wo = (h - 1) // sh + 1, (w - 1) // sw + 1
    if planes * h * w > backend.INT32_MAX:
        raise CudaError(f"upsample_planes: {planes * h * w} elements exceed int32 indexing")
    count, isz = planes * h * w, np.dtype(dtype).itemsize
    for width in (16, 8, 4):  # the widest store that tiles the planes (x: a pool allocation, 256-byte aligned)
        if width > isz and (count * isz) % width == 0 and x % width == 0:
            backend.kernel(KERNELS, f"upsample_planes_{width}b", dtype)(count * isz // width, y, h, w, ho, wo, sh, sw, x)
            return
    backend.kernel(KERNELS, "upsample_planes", dtype)(count, y, h, w, ho, wo, sh, sw, x)
