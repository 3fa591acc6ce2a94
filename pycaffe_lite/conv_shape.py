"""Output sizes of 2-D convolutions (shared by the CPU and GPU convolution code).

Geometry is given per spatial axis as ``(h, w)`` pairs: ``kernel``, ``pad``, ``stride``,
``dilation``. A kernel offset ``(i, j)`` of output pixel ``(y, x)`` reads input pixel
``(y*stride_h - pad_h + i*dilation_h, x*stride_w - pad_w + j*dilation_w)``; reads outside the
image are zero.
"""

from __future__ import annotations

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


def deconv_out_shape(height: int, width: int, kernel: Pair, pad: Pair, stride: Pair, dilation: Pair) -> Pair:
    """``(Ho, Wo)`` of a deconvolution (transposed convolution): ``stride*(size-1) + extent - 2*pad``,
    the input size of the convolution that maps ``(Ho, Wo)`` back to ``(height, width)``."""
    ho, wo = (s * (n - 1) + d * (k - 1) + 1 - 2 * p
              for n, k, p, s, d in zip((height, width), kernel, pad, stride, dilation))
    return ho, wo


def out_shape_nd(shape: tuple[int, ...], kernel: tuple[int, ...], pad: tuple[int, ...], stride: tuple[int, ...],
                 dilation: tuple[int, ...]) -> tuple[int, ...]:
    """Output sizes of an N-D convolution: :func:`conv_out_size` per spatial axis."""
    return tuple(conv_out_size(*a) for a in zip(shape, kernel, pad, stride, dilation))


def deconv_out_shape_nd(shape: tuple[int, ...], kernel: tuple[int, ...], pad: tuple[int, ...],
                        stride: tuple[int, ...], dilation: tuple[int, ...]) -> tuple[int, ...]:
    """Output sizes of an N-D deconvolution, the input sizes of the convolution that maps them back."""
    return tuple(s * (n - 1) + d * (k - 1) + 1 - 2 * p for n, k, p, s, d in zip(shape, kernel, pad, stride, dilation))
