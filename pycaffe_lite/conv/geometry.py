"""Output sizes of 2-D convolutions (shared by the CPU and GPU convolution code).

Geometry is given per spatial axis as ``(h, w)`` pairs: ``kernel``, ``pad``, ``stride``,
``dilation``. A kernel offset ``(i, j)`` of output pixel ``(y, x)`` reads input pixel
``(y*stride_h - pad_h + i*dilation_h, x*stride_w - pad_w + j*dilation_w)``; reads outside the
image are zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Pair = tuple[int, int]
Dims = tuple[int, ...]


def conv_out_size(size: int, kernel: int, pad: int, stride: int, dilation: int = 1) -> int:
    """BVLC's convolution output length: ``(size + 2*pad - (dilation*(kernel-1)+1)) / stride + 1``
    with C++'s integer division, which truncates toward zero.

    So a window that overhangs the padded input by less than a stride still gives one output (kernel
    2, stride 2 on a 1-pixel input: ``(1 - 2) / 2 + 1 = 1``); it reads zeros where the input is
    missing (:func:`overhang`). Returns 0 or less when not even that window exists.
    """
    extent = dilation * (kernel - 1) + 1
    span = size + 2 * pad - extent
    return (span // stride if span >= 0 else -(-span // stride)) + 1


def overhang(size: int, kernel: int, pad: int, stride: int, dilation: int = 1) -> int:
    """How far the last window of :func:`conv_out_size` reads past the high-side pad (0 unless the
    truncating division kept a window that does not fit); those reads are zeros."""
    out = conv_out_size(size, kernel, pad, stride, dilation)
    return max(0, (out - 1) * stride + dilation * (kernel - 1) + 1 - (size + 2 * pad)) if out > 0 else 0


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


def out_shape_nd(shape: Dims, kernel: Dims, pad: Dims, stride: Dims, dilation: Dims) -> Dims:
    """Output sizes of an N-D convolution: :func:`conv_out_size` per spatial axis."""
    return tuple(conv_out_size(*a) for a in zip(shape, kernel, pad, stride, dilation))


def deconv_out_shape_nd(shape: Dims, kernel: Dims, pad: Dims, stride: Dims, dilation: Dims) -> Dims:
    """Output sizes of an N-D deconvolution, the input sizes of the convolution that maps them back."""
    return tuple(s * (n - 1) + d * (k - 1) + 1 - 2 * p for n, k, p, s, d in zip(shape, kernel, pad, stride, dilation))


def _per_axis(p: Any, repeated: str, hw: str | None, default: int, axes: int, error: Callable[[str], Exception]) -> Dims:
    """BVLC's N-D reading of a repeated ConvolutionParameter field: none (the default), one value for
    every axis, or one per axis; the ``<hw>_h``/``<hw>_w`` pair only for 2-D, and not with the field."""
    values = list(getattr(p, repeated))
    if hw and (p.HasField(f"{hw}_h") or p.HasField(f"{hw}_w")):
        if axes != 2:
            raise error(f"{hw}_h and {hw}_w can only be used for 2-D convolution; this one has {axes} spatial "
                        f"axes (give {repeated} once or once per axis)")
        if not (p.HasField(f"{hw}_h") and p.HasField(f"{hw}_w")):
            raise error(f"{hw}_h and {hw}_w must be given together")
        if values:
            raise error(f"give either {repeated} or {hw}_h/{hw}_w, not both")
        return getattr(p, f"{hw}_h"), getattr(p, f"{hw}_w")
    if not values:
        return (default,) * axes
    if len(values) == 1:
        return (values[0],) * axes
    if len(values) == axes:
        return tuple(values)
    raise error(f"{repeated} has {len(values)} values; give 1 or one per spatial axis ({axes})")


def geometry_nd(p: Any, axes: int, error: Callable[[str], Exception]) -> tuple[Dims, Dims, Dims, Dims]:
    """(kernel, pad, stride, dilation) of a ConvolutionParameter ``p`` for ``axes`` spatial axes, checked
    as BVLC checks them; ``error(message)`` makes the exception to raise."""
    if not p.kernel_size and not (p.HasField("kernel_h") or p.HasField("kernel_w")):
        raise error("convolution_param needs kernel_size (or kernel_h and kernel_w for 2-D)")
    kernel = _per_axis(p, "kernel_size", "kernel", 0, axes, error)
    pad = _per_axis(p, "pad", "pad", 0, axes, error)
    stride = _per_axis(p, "stride", "stride", 1, axes, error)
    dilation = _per_axis(p, "dilation", None, 1, axes, error)
    for what, values in (("kernel size", kernel), ("stride", stride), ("dilation", dilation)):
        if min(values) <= 0:
            raise error(f"{what} must be positive, got {'x'.join(map(str, values))}")
    return kernel, pad, stride, dilation
