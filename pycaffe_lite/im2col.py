"""CPU im2col / col2im over a whole minibatch of 2-D images (numpy, vectorized).

Geometry is given per spatial axis as ``(h, w)`` pairs: ``kernel``, ``pad``, ``stride``,
``dilation``. A kernel offset ``(i, j)`` of output pixel ``(y, x)`` reads input pixel
``(y*stride_h - pad_h + i*dilation_h, x*stride_w - pad_w + j*dilation_w)``; reads outside the
image are zero. Columns are laid out ``(N, C, kh, kw, Ho, Wo)``, so ``col.reshape(N, C*kh*kw, Ho*Wo)``
is Caffe's per-image column matrix. Both functions loop over the ``kh*kw`` kernel offsets and move
one strided slice of the padded batch per offset.
"""

from __future__ import annotations

import numpy as np

Pair = tuple[int, int]


def conv_out_size(size: int, kernel: int, pad: int, stride: int, dilation: int = 1) -> int:
    """Caffe's convolution output length: ``(size + 2*pad - (dilation*(kernel-1)+1)) // stride + 1``.

    Returns 0 or less when the dilated kernel does not fit in the padded input.
    """
    extent = dilation * (kernel - 1) + 1
    span = size + 2 * pad - extent
    return span // stride + 1 if span >= 0 else 0


def out_shape(height: int, width: int, kernel: Pair, pad: Pair, stride: Pair, dilation: Pair) -> Pair:
    """``(Ho, Wo)`` of a convolution over an ``(height, width)`` image."""
    return (
        conv_out_size(height, kernel[0], pad[0], stride[0], dilation[0]),
        conv_out_size(width, kernel[1], pad[1], stride[1], dilation[1]),
    )


def _offset_slices(i: int, j: int, out_hw: Pair, stride: Pair, dilation: Pair) -> tuple[slice, slice]:
    """The slices of the padded image that kernel offset ``(i, j)`` reads for every output pixel."""
    h0, w0 = i * dilation[0], j * dilation[1]
    return (
        slice(h0, h0 + stride[0] * (out_hw[0] - 1) + 1, stride[0]),
        slice(w0, w0 + stride[1] * (out_hw[1] - 1) + 1, stride[1]),
    )


def im2col(x: np.ndarray, kernel: Pair, pad: Pair, stride: Pair, dilation: Pair = (1, 1)) -> np.ndarray:
    """Columns of the batch ``x`` (N, C, H, W): an array (N, C, kh, kw, Ho, Wo) of ``x``'s dtype."""
    n, c, h, w = x.shape
    out_hw = out_shape(h, w, kernel, pad, stride, dilation)
    if out_hw[0] <= 0 or out_hw[1] <= 0:
        raise ValueError(f"im2col: kernel {kernel} (dilation {dilation}) exceeds input {(h, w)} padded by {pad}")
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1]))) if any(pad) else x
    col = np.empty((n, c, kernel[0], kernel[1]) + out_hw, dtype=x.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            sh, sw = _offset_slices(i, j, out_hw, stride, dilation)
            col[:, :, i, j] = xp[:, :, sh, sw]
    return col


def col2im(col: np.ndarray, image_hw: Pair, pad: Pair, stride: Pair, dilation: Pair = (1, 1)) -> np.ndarray:
    """Adjoint of :func:`im2col`: sum the columns (N, C, kh, kw, Ho, Wo) back into (N, C, H, W).

    Every image pixel receives the sum of the column entries that read it; padding is dropped.
    """
    n, c, kh, kw, ho, wo = col.shape
    h, w = image_hw
    xp = np.zeros((n, c, h + 2 * pad[0], w + 2 * pad[1]), dtype=col.dtype)
    for i in range(kh):
        for j in range(kw):
            sh, sw = _offset_slices(i, j, (ho, wo), stride, dilation)
            xp[:, :, sh, sw] += col[:, :, i, j]  # one offset never hits a pixel twice
    return np.ascontiguousarray(xp[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + w])
