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
    if dilation == (1, 1):  # threads by stride phase (col2im_batch_phased)
        n = num * channels * stride[0] * stride[1] * -(-image_hw[0] // stride[0]) * -(-image_hw[1] // stride[1])
        if n > backend.INT32_MAX:
            raise CudaError(f"col2im: {n} phase positions exceed int32 indexing; use smaller batches")
        backend.kernel(KERNELS, "col2im_batch_phased", dtype)(n, data_col, *geo[:10], *geo[12:], data_im)
        return
    n = num * channels * image_hw[0] * image_hw[1]
    backend.kernel(KERNELS, "col2im_batch", dtype)(n, data_col, *geo, data_im)


WIDTHS = (16, 8, 4)  # bytes a vector kernel moves in one load or store (its name's suffix)


def _copy_launch(units: int, rows: int, depth: int = 1) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) of a 2-D/3-D copy kernel: x over the ``units`` of a row (a block row of the
    power of two at or above it, at most 256 threads), y over ``rows`` (the block's other threads),
    z over ``depth``; each axis loops grid-stride past the grid's limits."""
    bx = min(backend.CUDA_NUM_THREADS, 1 << max(0, units - 1).bit_length())
    by = backend.CUDA_NUM_THREADS // bx
    gx, gy, gz = min(-(-units // bx), backend.MAX_BLOCKS), min(-(-rows // by), backend.MAX_GRID_YZ), min(depth, backend.MAX_GRID_YZ)
    if units > backend.INT32_MAX - gx * bx or rows > backend.INT32_MAX - gy * by or depth > backend.INT32_MAX - gz:
        raise CudaError(f"plane copy: {units} units a row, {rows} rows or {depth} slabs exceed int32 indexing")
    return (gx, gy, gz), (bx, by, 1)


def _fits(ptr: int, stride: int, itemsize: int, width: int) -> bool:
    """Whether every row of a buffer at ``ptr`` whose rows start ``stride`` values apart is aligned to ``width`` bytes."""
    return ptr % width == 0 and (stride * itemsize) % width == 0


def swap_leading_axes(src: int, a_dim: int, b_dim: int, inner: int, dst: int, dtype) -> None:
    """``dst (b_dim, a_dim, inner) = src (a_dim, b_dim, inner)`` with the leading axes swapped: a 3-D
    launch over (units of inner, a, b), a row's values moved 16, 8 or 4 bytes at a time where both
    pointers and ``inner`` allow (the widest), element by element otherwise."""
    if a_dim * b_dim * inner > backend.INT32_MAX:
        raise CudaError(f"swap_leading_axes: {a_dim * b_dim * inner} elements exceed int32 indexing")
    if a_dim * b_dim * inner == 0:
        return
    isz = np.dtype(dtype).itemsize
    vec = [w for w in WIDTHS if w >= isz and _fits(src, inner, isz, w) and _fits(dst, inner, isz, w)]
    width = vec[0] if vec else WIDTHS[0]
    grid, block = _copy_launch(-(-inner * isz // width), a_dim, b_dim)
    backend.kernel(KERNELS, f"swap_leading_axes_{width}b", dtype)(src, a_dim, b_dim, inner, int(bool(vec)), dst,
                                                                 grid=grid, block=block)


def copy_planes(src: int, planes: int, plane: int, src_stride: int, dst: int, dst_stride: int, dtype) -> None:
    """``dst (planes, dst_stride)[:, :plane] = src (planes, src_stride)[:, :plane]`` (the other values
    of ``dst`` are left as they are). A 2-D launch over (units of a plane, planes): the width (16, 8
    or 4 bytes) is the one at which most sides' planes are aligned, the widest among equals; an aligned
    side moves a unit in one load or store, the other element by element (packed 7x7 half planes,
    98 bytes, to planes padded to 112: 16-byte stores, scalar loads)."""
    count = planes * plane
    if count > backend.INT32_MAX:
        raise CudaError(f"copy_planes: {count} elements exceed int32 indexing")
    if count == 0:
        return
    if src_stride == plane == dst_stride:  # one contiguous run
        planes, plane, src_stride, dst_stride = 1, count, count, count
    isz = np.dtype(dtype).itemsize
    fits = {w: (_fits(src, src_stride, isz, w), _fits(dst, dst_stride, isz, w)) for w in WIDTHS if w >= isz}
    width = max(fits, key=lambda w: (sum(fits[w]), w))
    grid, block = _copy_launch(-(-plane * isz // width), planes)
    backend.kernel(KERNELS, f"copy_planes_{width}b", dtype)(planes, src, src_stride, plane, dst_stride, dst,
                                                           int(fits[width][0]), int(fits[width][1]),
                                                           grid=grid, block=block)


def subsample_planes(x: int, planes: int, image_hw: Pair, stride: Pair, y: int, dtype) -> None:
    """``y (planes, Ho, Wo) = x (planes, H, W)[:, ::sh, ::sw]`` (a strided 1x1 convolution's input):
    the widest of 16-, 8- and 4-byte stores of y that tiles it (y aligned to it), else one value a thread."""
    (h, w), (sh, sw) = image_hw, stride
    ho, wo = (h - 1) // sh + 1, (w - 1) // sw + 1
    count, isz = planes * ho * wo, np.dtype(dtype).itemsize
    if count > backend.INT32_MAX:
        raise CudaError(f"subsample_planes: {count} elements exceed int32 indexing")
    for width in WIDTHS:
        if width > isz and (count * isz) % width == 0 and y % width == 0:
            backend.kernel(KERNELS, f"subsample_planes_{width}b", dtype)(count * isz // width, x, h, w, ho, wo, sh, sw, y)
            return
    backend.kernel(KERNELS, "subsample_planes", dtype)(count, x, h, w, ho, wo, sh, sw, y)


def upsample_planes(y: int, planes: int, image_hw: Pair, stride: Pair, x: int, dtype) -> None:
    """The adjoint of :func:`subsample_planes`: ``x`` holds ``y`` at every stride-th pixel and 0 elsewhere."""
    (h, w), (sh, sw) = image_hw, stride
    ho, wo = (h - 1) // sh + 1, (w - 1) // sw + 1
    if planes * h * w > backend.INT32_MAX:
        raise CudaError(f"upsample_planes: {planes * h * w} elements exceed int32 indexing")
    count, isz = planes * h * w, np.dtype(dtype).itemsize
    for width in WIDTHS:  # the widest store that tiles the planes (x: a pool allocation, 256-byte aligned)
        if width > isz and (count * isz) % width == 0 and x % width == 0:
            backend.kernel(KERNELS, f"upsample_planes_{width}b", dtype)(count * isz // width, y, h, w, ho, wo, sh, sw, x)
            return
    backend.kernel(KERNELS, "upsample_planes", dtype)(count, y, h, w, ho, wo, sh, sw, x)
