"""GPU im2col / col2im for N-D convolutions of 1 to :data:`MAX_AXES` spatial axes (``im2col_nd.cu``).

Image batch ``(num, C, *S)``; columns ``(num, C*prod(K), prod(O))`` (BVLC's im2col_nd order per
image, see :mod:`pycaffe_lite.conv.cpu_nd`), or of a slab ``rows = (begin, count)`` of the first
(outermost, after padding the geometry to 3 axes) output axis: ``(num, C*prod(K), count*O_1*O_2)``. Geometry arguments are tuples with one entry per
spatial axis; pointers are device addresses (ints); everything runs on the backend stream.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import CudaError
from ..gpu import backend
from .geometry import out_shape_nd

KERNELS = Path(__file__).with_name("im2col_nd.cu")
MAX_AXES = 3  # spatial axes the kernels take; more run on the CPU path

Dims = tuple[int, ...]


def _geometry(shape: Dims, kernel: Dims, pad: Dims, stride: Dims, dilation: Dims) -> tuple[int, ...]:
    """The kernels' 18 geometry arguments (sizes, outputs, kernel, pad, stride, dilation; 3 each),
    lower-dimensional problems padded with leading unit axes."""
    if not 1 <= len(shape) <= MAX_AXES:
        raise CudaError(f"im2col_nd: {len(shape)} spatial axes; the GPU kernels take 1 to {MAX_AXES}")
    out = out_shape_nd(shape, kernel, pad, stride, dilation)
    if min(out) <= 0:
        raise CudaError(f"im2col_nd: kernel {kernel} (dilation {dilation}) exceeds input {shape} padded by {pad}")
    lead = MAX_AXES - len(shape)

    def fill(values: Dims, unit: int) -> Dims:
        return (unit,) * lead + tuple(values)

    return (*fill(shape, 1), *fill(out, 1), *fill(kernel, 1), *fill(pad, 0), *fill(stride, 1), *fill(dilation, 1))


def _check(num: int, channels: int, shape: Dims, kernel: Dims, out: Dims) -> None:
    """Index ranges of the image batch and of the columns of the output (slab) ``out``."""
    cols = num * channels * math.prod(kernel) * math.prod(out)
    if max(cols, num * channels * math.prod(shape)) > backend.INT32_MAX:
        raise CudaError(f"im2col_nd: {cols} column elements exceed int32 indexing; use smaller batches")


def padded_out(shape: Dims, kernel: Dims, pad: Dims, stride: Dims, dilation: Dims) -> Dims:
    """The output sizes as the kernels see them: three axes, leading unit axes first."""
    return _geometry(shape, kernel, pad, stride, dilation)[3:6]


def _slab(geo: tuple[int, ...], rows: tuple[int, int] | None) -> tuple[int, int]:
    begin, count = rows if rows is not None else (0, geo[3])
    if not (0 <= begin and 0 < count and begin + count <= geo[3]):
        raise CudaError(f"im2col_nd: output rows {begin}..{begin + count} outside 0..{geo[3]}")
    return begin, count


def im2col(data_im: int, num: int, channels: int, shape: Dims, kernel: Dims, pad: Dims, stride: Dims,
           dilation: Dims, data_col: int, dtype, rows: tuple[int, int] | None = None) -> None:
    """Fill ``data_col`` (num, C*prod(K), prod(O)), or the slab ``rows`` of it, from the image batch
    ``data_im`` (num, C, *S)."""
    geo = _geometry(shape, kernel, pad, stride, dilation)
    out = geo[3:6]
    begin, count = _slab(geo, rows)
    _check(num, channels, shape, kernel, (count, out[1], out[2]))
    backend.kernel(KERNELS, "im2col_nd3", dtype)(num * channels * count * out[1] * out[2], data_im, *geo, begin,
                                                 count, data_col)


def col2im(data_col: int, num: int, channels: int, shape: Dims, kernel: Dims, pad: Dims, stride: Dims,
           dilation: Dims, data_im: int, dtype, rows: tuple[int, int] | None = None,
           accumulate: bool = False) -> None:
    """Assign to ``data_im`` (num, C, *S) the sums of the column entries that read each element (the
    adjoint of :func:`im2col`); with ``rows``, the columns of that slab only, added to ``data_im`` when
    ``accumulate``."""
    geo = _geometry(shape, kernel, pad, stride, dilation)
    begin, count = _slab(geo, rows)
    _check(num, channels, shape, kernel, (count, geo[4], geo[5]))
    backend.kernel(KERNELS, "col2im_nd3", dtype)(num * channels * math.prod(shape), data_col, *geo, begin, count,
                                                 int(accumulate), data_im)
