"""GPU N-D convolution (1 to 3 spatial axes): im2col_nd per image + cuBLAS, BVLC's way.

:class:`NDProblem` is the convolution of an input ``(num, channels, *in_shape)`` with weights
``(num_output, channels/group, *kernel)`` into ``(num, num_output, *out_shape)``. Each pass loops over
the images; per image one :mod:`.im2col_nd` launch builds the columns ``(C*prod(K), prod(O))`` in the
shared workspace and one strided-batched GEMM over the groups does the product. The 2-D layers use
the engines of :mod:`.conv_engines` instead; this path serves other dimensionalities and
``force_nd_im2col``. Pointers are device addresses (ints), byte offsets added for each image.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..conv_shape import out_shape_nd
from . import backend, blas
from . import im2col_nd as nd_cols
from . import math_functions as gm

Dims = tuple[int, ...]


@dataclass(frozen=True)
class NDProblem:
    num: int
    channels: int
    in_shape: Dims
    num_output: int
    group: int
    kernel: Dims
    pad: Dims
    stride: Dims
    dilation: Dims
    dtype: str

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def out_shape(self) -> Dims:
        return out_shape_nd(self.in_shape, self.kernel, self.pad, self.stride, self.dilation)

    @property
    def sizes(self) -> tuple[int, int, int, int, int, int]:
        """(Mg, Kg, P, input elements per image, output elements per image, itemsize)."""
        kg = self.channels // self.group * math.prod(self.kernel)
        p = math.prod(self.out_shape)
        return (self.num_output // self.group, kg, p, self.channels * math.prod(self.in_shape),
                self.num_output * p, self.np_dtype.itemsize)

    def _cols(self) -> int:
        mg, kg, p, _, _, isz = self.sizes
        return backend.workspace(self.group * kg * p * isz)[0]

    def _im2col(self, x: int, col: int) -> None:
        nd_cols.im2col(x, 1, self.channels, self.in_shape, self.kernel, self.pad, self.stride, self.dilation,
                       col, self.np_dtype)


def forward(prob: NDProblem, x: int, w: int, bias: int | None, y: int, relu: bool = False) -> None:
    """``y = conv(x, w) (+ bias)``, then ReLU when ``relu``."""
    mg, kg, p, xs, ys, isz = prob.sizes
    dt = prob.np_dtype
    col = prob._cols()
    for n in range(prob.num):
        prob._im2col(x + n * xs * isz, col)
        blas.gemm_strided_batched(False, False, mg, p, kg, 1.0, w, mg * kg, col, kg * p, 0.0,
                                  y + n * ys * isz, mg * p, prob.group, dt)
    if bias is not None:
        gm.add_channel_bias(prob.num, prob.num_output, p, bias, y, dt)
    if relu:
        backend.elementwise("conv_nd_relu", "Dtype* y", "y[i] = y[i] > Dtype(0) ? y[i] : Dtype(0)",
                            dt)(prob.num * ys, y)


def backward_data(prob: NDProblem, w: int, dy: int, dx: int) -> None:
    """Assign ``dx``, the input gradient for the top gradient ``dy``."""
    mg, kg, p, xs, ys, isz = prob.sizes
    dt = prob.np_dtype
    col = prob._cols()
    for n in range(prob.num):
        blas.gemm_strided_batched(True, False, kg, p, mg, 1.0, w, mg * kg, dy + n * ys * isz, mg * p, 0.0,
                                  col, kg * p, prob.group, dt)
        nd_cols.col2im(col, 1, prob.channels, prob.in_shape, prob.kernel, prob.pad, prob.stride, prob.dilation,
                       dx + n * xs * isz, dt)


def backward_weight(prob: NDProblem, x: int, dy: int, dw: int | None, db: int | None) -> None:
    """Accumulate the weight gradient into ``dw`` and the bias gradient into ``db`` (each when given)."""
    mg, kg, p, xs, ys, isz = prob.sizes
    dt = prob.np_dtype
    if db is not None:
        gm.channel_sum(prob.num, prob.num_output, p, dy, db, dt, beta=1.0)
    if dw is None:
        return
    col = prob._cols()
    for n in range(prob.num):
        prob._im2col(x + n * xs * isz, col)
        blas.gemm_strided_batched(False, True, mg, kg, p, 1.0, dy + n * ys * isz, mg * p, col, kg * p, 1.0,
                                  dw, mg * kg, prob.group, dt)
