"""Winograd F(2x2, 3x3) convolution (transform kernels in ``winograd.cu``, the 16 products per
tile as cuBLAS strided-batched GEMMs over channels).

Applies to 3x3 kernels with stride 1, no dilation, one group and pads of at most 2 (the data
gradient is the forward transform of the top gradient padded by ``2 - pad`` with the flipped,
transposed filter). The multiply count is 16/36 of the direct convolution's. Batches whose
transformed tiles exceed :data:`BUFFER_BYTES` run in chunks of images. ``buffer(name, count)``
arguments return a device pointer to at least ``count`` elements (the caller owns the memory).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import backend, blas
from . import math_functions as gm
from .conv_problem import ConvProblem

KERNELS = Path(__file__).with_name("winograd.cu")
BUFFER_BYTES = 512 << 20  # per transformed-tile buffer; larger batches run in image chunks

Buffer = Callable[[str, int], int]


def supports(prob: ConvProblem) -> bool:
    return (prob.kernel == (3, 3) and prob.stride == (1, 1) and prob.dilation == (1, 1) and prob.group == 1
            and max(prob.pad) <= 2)


def _tiles(h: int, w: int) -> tuple[int, int]:
    return (h + 1) // 2, (w + 1) // 2


def _chunk(prob: ConvProblem) -> int:
    """Images per chunk so that every transformed buffer fits in BUFFER_BYTES."""
    ho, wo = prob.out_hw
    th, tw = _tiles(ho, wo)
    dth, dtw = _tiles(prob.height, prob.width)
    per_image = 16 * max(prob.channels, prob.num_output) * max(th * tw, dth * dtw) * prob.itemsize
    return max(1, min(prob.num, BUFFER_BYTES // max(1, per_image)))


def _input(dtype, x: int, nb: int, channels: int, hw: tuple[int, int], pad: tuple[int, int],
           tiles: tuple[int, int], v: int, block: int = 0, blocks: int = 1) -> None:
    """V of ``nb`` images; tiles in ``blocks`` blocks of ``block`` (default: one block of all)."""
    t = nb * tiles[0] * tiles[1]
    block = block or t
    n = channels * block * blocks
    k = backend.kernel(KERNELS, "winograd_input", dtype, "iPiiiiiiiiiP")
    k(n, n, x, channels, hw[0], hw[1], pad[0], pad[1], tiles[0], tiles[1], t, block, v)


def _output(dtype, mo: int, nb: int, channels: int, tiles: tuple[int, int], out_hw: tuple[int, int],
            bias: int | None, y: int) -> None:
    t = nb * tiles[0] * tiles[1]
    n = channels * t
    k = backend.kernel(KERNELS, "winograd_output", dtype, "iPiiiiiiPiP")
    k(n, n, mo, channels, tiles[0], tiles[1], t, out_hw[0], out_hw[1], bias or mo, int(bias is not None), y)


def forward(prob: ConvProblem, x: int, w: int, bias: int | None, y: int, buffer: Buffer) -> None:
    """``y = conv(x, w) (+ bias)``."""
    _convolve(prob.np_dtype, prob.num, prob.channels, (prob.height, prob.width), prob.pad, prob.num_output,
              prob.out_hw, x, w, False, bias, y, _chunk(prob), buffer)


def backward_data(prob: ConvProblem, w: int, dy: int, dx: int, buffer: Buffer) -> None:
    """``dx = dL/dx`` (assigned): the forward transform of ``dy`` padded by ``2 - pad`` with the
    flipped, transposed filter."""
    pad = (2 - prob.pad[0], 2 - prob.pad[1])
    _convolve(prob.np_dtype, prob.num, prob.num_output, prob.out_hw, pad, prob.channels,
              (prob.height, prob.width), dy, w, True, None, dx, _chunk(prob), buffer)


def _convolve(dtype, num: int, cin: int, in_hw, pad, cout: int, out_hw, x: int, w: int, flip: bool,
              bias: int | None, y: int, nb_max: int, buffer: Buffer) -> None:
    """``y (num, cout, *out_hw) = conv3x3(x (num, cin, *in_hw) padded by pad)``."""
    isz = dtype.itemsize
    tiles = _tiles(*out_hw)
    u = buffer("wino_u", 16 * cin * cout)
    _filter_any(dtype, w, cin, cout, flip, u)
    nt_max = nb_max * tiles[0] * tiles[1]
    v = buffer("wino_v", 16 * cin * nt_max)
    mo = buffer("wino_m", 16 * cout * nt_max)
    for n0 in range(0, num, nb_max):
        nb = min(nb_max, num - n0)
        t = nb * tiles[0] * tiles[1]
        _input(dtype, x + n0 * cin * in_hw[0] * in_hw[1] * isz, nb, cin, in_hw, pad, tiles, v)
        # Mo[xi] (cout, t) = U[xi] (cout, cin) . V[xi] (cin, t)
        blas.gemm_strided_batched(False, False, cout, t, cin, 1.0, u, cout * cin, v, cin * t, 0.0, mo, cout * t,
                                  16, dtype)
        _output(dtype, mo, nb, cout, tiles, out_hw, bias, y + n0 * cout * out_hw[0] * out_hw[1] * isz)


def _filter_any(dtype, w: int, cin: int, cout: int, flip: bool, u: int) -> None:
    """U for y = conv(x): ``w`` is (cout, cin, 3, 3), or with ``flip`` (cin, cout, 3, 3) read flipped."""
    m, c = (cin, cout) if flip else (cout, cin)  # the weight blob is always (num_output, channels, 3, 3)
    n = m * c
    k = backend.kernel(KERNELS, "winograd_filter", dtype, "iPiiiP")
    k(n, n, w, m, c, int(flip), u)


def _weight_blocks(prob: ConvProblem, tiles: int) -> tuple[int, int]:
    """(blocks, block): the tile sum of the weight gradient split so the batched GEMM over
    (xi, block) fills the device; blocks of at least 256 tiles."""
    gemm_tiles = -(-prob.num_output // 128) * -(-prob.channels // 128)
    want = -(-4 * backend.multiprocessor_count() // (16 * gemm_tiles))
    blocks = max(1, min(want, tiles // 256))
    block = -(-tiles // blocks)
    return -(-tiles // block), block


def backward_weight(prob: ConvProblem, x: int, dy: int, dw: int, buffer: Buffer) -> None:
    """``dw += dL/dw`` through the transforms' adjoints."""
    dtype, isz = prob.np_dtype, prob.itemsize
    ho, wo = prob.out_hw
    tiles = _tiles(ho, wo)
    nb_max = _chunk(prob)
    m, c = prob.num_output, prob.channels
    du = buffer("wino_du", 16 * m * c)
    for i, n0 in enumerate(range(0, prob.num, nb_max)):
        nb = min(nb_max, prob.num - n0)
        t = nb * tiles[0] * tiles[1]
        nblk, blk = _weight_blocks(prob, t)
        v = buffer("wino_v", 16 * c * nblk * blk)
        dmo = buffer("wino_m", 16 * m * nblk * blk)
        part = buffer("wino_part", 16 * nblk * m * c)
        ones = gm.ones_vector(nblk, dtype)
        n = m * nblk * blk
        k = backend.kernel(KERNELS, "winograd_output_grad", dtype, "iPiiiiiiiP")
        k(n, n, dy + n0 * m * ho * wo * isz, m, tiles[0], tiles[1], t, blk, ho, wo, dmo)
        _input(dtype, x + n0 * c * prob.in_plane * isz, nb, c, (prob.height, prob.width), prob.pad, tiles, v,
               blk, nblk)
        # part[xi, s] (m, c) = dMo[xi, s] (m, blk) . V[xi, s]^T (blk, c), one GEMM per (xi, block)
        blas.gemm_strided_batched(False, True, m, c, blk, 1.0, dmo, m * blk, v, c * blk, 0.0, part, m * c,
                                  16 * nblk, dtype)
        # dU[xi] (1, m*c) (+)= ones (1, nblk) . part[xi] (nblk, m*c)
        blas.gemm_strided_batched(False, False, 1, m * c, nblk, 1.0, ones, 0, part, nblk * m * c,
                                  1.0 if i else 0.0, du, m * c, 16, dtype)
    n = m * c
    backend.kernel(KERNELS, "winograd_filter_grad", dtype, "iPiiP")(n, n, du, m, c, dw)
