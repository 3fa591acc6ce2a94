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

from ..gpu import backend, blas
from ..gpu import math_functions as gm
from . import im2col_nd as nd_cols
from .geometry import out_shape_nd

Dims = tuple[int, ...]
# (parameters, body) of the in-place ReLU after the bias, in Mtype
RELU_KERNEL = ("Dtype* y", "y[i] = from_m(to_m(y[i]) > Mtype(0) ? to_m(y[i]) : Mtype(0))")
COL_BUFFER_BYTES = 256 << 20  # column scratch budget of one pass; larger images run in slabs of output rows


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

    def slabs(self) -> list[tuple[int, int]]:
        """The (first row, rows) slabs of the outermost output axis whose columns fit
        :data:`COL_BUFFER_BYTES` (at least one row each)."""
        mg, kg, p, _, _, isz = self.sizes
        o = nd_cols.padded_out(self.in_shape, self.kernel, self.pad, self.stride, self.dilation)
        row_bytes = self.group * kg * o[1] * o[2] * isz
        per = max(1, min(o[0], COL_BUFFER_BYTES // max(row_bytes, 1)))
        return [(b, min(per, o[0] - b)) for b in range(0, o[0], per)]

    def _cols(self) -> int:
        mg, kg, p, _, _, isz = self.sizes
        rows = self.slabs()[0][1]
        return backend.workspace(self.group * kg * p // self.slab_total() * rows * isz)[0]

    def slab_total(self) -> int:
        return nd_cols.padded_out(self.in_shape, self.kernel, self.pad, self.stride, self.dilation)[0]

    def _im2col(self, x: int, col: int, rows: tuple[int, int]) -> None:
        nd_cols.im2col(x, 1, self.channels, self.in_shape, self.kernel, self.pad, self.stride, self.dilation,
                       col, self.np_dtype, rows)


def forward(prob: NDProblem, x: int, w: int, bias: int | None, y: int, relu: bool = False) -> None:
    """``y = conv(x, w) (+ bias)``, then ReLU when ``relu``."""
    mg, kg, p, xs, ys, isz = prob.sizes
    dt = prob.np_dtype
    col = prob._cols()
    plane = p // prob.slab_total()  # output elements per row of the outermost axis
    for n in range(prob.num):
        for begin, rows in prob.slabs():
            width = rows * plane
            prob._im2col(x + n * xs * isz, col, (begin, rows))
            blas.gemm_strided_batched(False, False, mg, width, kg, 1.0, w, mg * kg, col, kg * width, 0.0,
                                      y + (n * ys + begin * plane) * isz, mg * p, prob.group, dt, ldc=p)
    if bias is not None:
        gm.add_channel_bias(prob.num, prob.num_output, p, bias, y, dt)
    if relu:
        backend.elementwise("conv_nd_relu", *RELU_KERNEL, dt)(prob.num * ys, y)


def backward_data(prob: NDProblem, w: int, dy: int, dx: int) -> None:
    """Assign ``dx``, the input gradient for the top gradient ``dy``."""
    mg, kg, p, xs, ys, isz = prob.sizes
    dt = prob.np_dtype
    col = prob._cols()
    plane = p // prob.slab_total()
    for n in range(prob.num):
        for i, (begin, rows) in enumerate(prob.slabs()):
            width = rows * plane
            blas.gemm_strided_batched(True, False, kg, width, mg, 1.0, w, mg * kg, dy + (n * ys + begin * plane) * isz,
                                      mg * p, 0.0, col, kg * width, prob.group, dt, ldb=p)
            nd_cols.col2im(col, 1, prob.channels, prob.in_shape, prob.kernel, prob.pad, prob.stride, prob.dilation,
                           dx + n * xs * isz, dt, (begin, rows), accumulate=i > 0)


def backward_weight(prob: NDProblem, x: int, dy: int, dw: int | None, db: int | None) -> None:
    """Accumulate the weight gradient into ``dw`` and the bias gradient into ``db`` (each when given)."""
    mg, kg, p, xs, ys, isz = prob.sizes
    dt = prob.np_dtype
    if db is not None:
        gm.channel_sum(prob.num, prob.num_output, p, dy, db, dt, beta=1.0)
    if dw is None:
        return
    col = prob._cols()
    plane = p // prob.slab_total()
    for n in range(prob.num):
        for begin, rows in prob.slabs():
            width = rows * plane
            prob._im2col(x + n * xs * isz, col, (begin, rows))
            blas.gemm_strided_batched(False, True, mg, kg, width, 1.0, dy + (n * ys + begin * plane) * isz, mg * p,
                                      col, kg * width, 1.0, dw, mg * kg, prob.group, dt, lda=p)
