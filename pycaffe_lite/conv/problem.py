"""The shape of one 2-D convolution, as the GPU convolution engines see it.

Layouts (Caffe's): input ``x (num, channels, H, W)``, weights ``w (num_output, channels/group,
kh, kw)``, bias ``(num_output,)``, output ``y (num, num_output, Ho, Wo)``; all contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .geometry import Pair, out_shape


@dataclass(frozen=True)
class ConvProblem:
    num: int
    channels: int
    height: int
    width: int
    num_output: int
    group: int
    kernel: Pair
    pad: Pair
    stride: Pair
    dilation: Pair
    dtype: str  # numpy dtype string, e.g. '<f4'
    # the engines' launch plans and scratch sizes for this shape
    cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @cached_property
    def out_hw(self) -> Pair:
        return out_shape(self.height, self.width, self.kernel, self.pad, self.stride, self.dilation)

    @cached_property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @cached_property
    def itemsize(self) -> int:
        return self.np_dtype.itemsize

    @cached_property
    def cg(self) -> int:
        """Input channels per group."""
        return self.channels // self.group

    @cached_property
    def mg(self) -> int:
        """Outputs per group."""
        return self.num_output // self.group

    @cached_property
    def khkw(self) -> int:
        return self.kernel[0] * self.kernel[1]

    @cached_property
    def kg(self) -> int:
        """Column rows per group: C/G * kh * kw."""
        return self.cg * self.khkw

    @cached_property
    def in_plane(self) -> int:
        return self.height * self.width

    @cached_property
    def out_plane(self) -> int:
        ho, wo = self.out_hw
        return ho * wo

    @cached_property
    def is_1x1(self) -> bool:
        return self.kernel == (1, 1) and self.stride == (1, 1) and self.pad == (0, 0)

    @cached_property
    def geometry_args(self) -> tuple[int, ...]:
        """num, channels, H, W, num_output, group, kh, kw, pad_h, pad_w, stride_h, stride_w, Ho, Wo."""
        ho, wo = self.out_hw
        return (self.num, self.channels, self.height, self.width, self.num_output, self.group,
                self.kernel[0], self.kernel[1], self.pad[0], self.pad[1], self.stride[0], self.stride[1], ho, wo)


EPI_BIAS, EPI_RELU = 1, 2  # conv_epilogue.cuh's CONV_EPI_BIAS, CONV_EPI_RELU


def epilogue_flags(bias: int | None, relu: bool) -> int:
    """The ``epilogue`` argument of the engines' forward kernels: add ``bias`` (when given), then
    ReLU (negative_slope 0) when ``relu``."""
    return (EPI_BIAS if bias is not None else 0) | (EPI_RELU if relu else 0)
