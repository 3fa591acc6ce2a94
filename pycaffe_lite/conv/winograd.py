"""The ``winograd`` convolution engine: F(2x2, 3x3) (transform kernels in ``winograd.cu``, the 16 products per
tile as cuBLAS strided-batched GEMMs over channels).

Applies to 3x3 kernels with stride 1, no dilation, one group and pads of at most 2 (the data
gradient is the forward transform of the top gradient padded by ``2 - pad`` with the flipped,
transposed filter). The multiply count is 16/36 of the direct convolution's. Batches whose
transformed tiles exceed :data:`BUFFER_BYTES` run in chunks of images. Each pass takes its
transform buffers as device pointers ``ws`` to regions of the sizes :meth:`WinogradEngine.scratch`
gives (the caller carves them from the shared device workspace).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..gpu import backend, blas
from ..gpu import math_functions as gm
from .problem import ConvProblem, epilogue_flags
from .registry import Engine, bias_backward, register_engine

KERNELS = Path(__file__).with_name("winograd.cu")
BUFFER_BYTES = 512 << 20  # per transformed-tile buffer; larger batches run in image chunks
REQUIREMENT = "a 3x3 kernel, stride 1, no dilation, group 1 and pad <= 2"


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
    backend.kernel(KERNELS, "winograd_input", dtype)(n, x, channels, hw[0], hw[1], pad[0], pad[1], tiles[0],
                                                     tiles[1], t, block, v)


def _output(dtype, mo: int, nb: int, channels: int, tiles: tuple[int, int], out_hw: tuple[int, int],
            bias: int | None, y: int, relu: bool = False) -> None:
    t = nb * tiles[0] * tiles[1]
    n = channels * t
    backend.kernel(KERNELS, "winograd_output", dtype)(n, mo, channels, tiles[0], tiles[1], t, out_hw[0], out_hw[1],
                                                      bias or mo, epilogue_flags(bias, relu), y)


def _sides(prob: ConvProblem, pass_: str) -> tuple[int, int, tuple[int, int]]:
    """(cin, cout, out_hw) of the 3x3 convolution a forward or data-gradient pass runs."""
    if pass_ == "forward":
        return prob.channels, prob.num_output, prob.out_hw
    return prob.num_output, prob.channels, (prob.height, prob.width)


def _weight_chunks(prob: ConvProblem) -> Iterator[tuple[int, int, int, int, int]]:
    """(first image, images, tiles, blocks, block) of each image chunk of the weight gradient."""
    nb_max = _chunk(prob)
    tiles = _tiles(*prob.out_hw)
    for n0 in range(0, prob.num, nb_max):
        nb = min(nb_max, prob.num - n0)
        t = nb * tiles[0] * tiles[1]
        yield (n0, nb, t, *_weight_blocks(prob, t))


def _convolve(prob: ConvProblem, pass_: str, in_hw, pad, x: int, w: int, flip: bool, bias: int | None, y: int,
              ws: list[int], relu: bool = False) -> None:
    """``y (num, cout, *out_hw) = conv3x3(x (num, cin, *in_hw) padded by pad)``."""
    dtype, isz = prob.np_dtype, prob.itemsize
    cin, cout, out_hw = _sides(prob, pass_)
    tiles = _tiles(*out_hw)
    u, v, mo = ws
    _filter_any(dtype, w, cin, cout, flip, u)
    nb_max = _chunk(prob)
    for n0 in range(0, prob.num, nb_max):
        nb = min(nb_max, prob.num - n0)
        t = nb * tiles[0] * tiles[1]
        _input(dtype, x + n0 * cin * in_hw[0] * in_hw[1] * isz, nb, cin, in_hw, pad, tiles, v)
        # Mo[xi] (cout, t) = U[xi] (cout, cin) . V[xi] (cin, t)
        blas.gemm_strided_batched(False, False, cout, t, cin, 1.0, u, cout * cin, v, cin * t, 0.0, mo, cout * t,
                                  16, dtype)
        _output(dtype, mo, nb, cout, tiles, out_hw, bias, y + n0 * cout * out_hw[0] * out_hw[1] * isz, relu)


def _filter_any(dtype, w: int, cin: int, cout: int, flip: bool, u: int) -> None:
    """U for y = conv(x): ``w`` is (cout, cin, 3, 3), or with ``flip`` (cin, cout, 3, 3) read flipped."""
    m, c = (cin, cout) if flip else (cout, cin)  # the weight blob is always (num_output, channels, 3, 3)
    backend.kernel(KERNELS, "winograd_filter", dtype)(m * c, w, m, c, int(flip), u)


def _weight_blocks(prob: ConvProblem, tiles: int) -> tuple[int, int]:
    """(blocks, block): the tile sum of the weight gradient split so the batched GEMM over
    (xi, block) fills the device; blocks of at least 256 tiles."""
    gemm_tiles = -(-prob.num_output // 128) * -(-prob.channels // 128)
    want = -(-4 * backend.multiprocessor_count() // (16 * gemm_tiles))
    blocks = max(1, min(want, tiles // 256))
    block = -(-tiles // blocks)
    return -(-tiles // block), block


@register_engine("WINOGRAD", order=20, summary="Winograd F(2x2, 3x3) transforms and 16 strided-batched "
                 "GEMMs per tile (3x3 kernels, stride 1, group 1)")
class WinogradEngine(Engine):
    name = "winograd"
    requirement = REQUIREMENT

    def supports(self, prob):
        return supports(prob)

    def scratch(self, prob, pass_, has_bias):
        """Bytes of each scratch region ``pass_`` uses: U, V, M for the forward and data-gradient
        passes; dU, V, dM, partial sums for the weight gradient."""
        isz = prob.itemsize
        if pass_ == "backward_weight":
            m, c = prob.num_output, prob.channels
            span = max(nblk * blk for *_, nblk, blk in _weight_chunks(prob))
            nblk = max(nblk for *_, nblk, _ in _weight_chunks(prob))
            return 16 * m * c * isz, 16 * c * span * isz, 16 * m * span * isz, 16 * nblk * m * c * isz
        cin, cout, out_hw = _sides(prob, pass_)
        th, tw = _tiles(*out_hw)
        nt = _chunk(prob) * th * tw
        return 16 * cin * cout * isz, 16 * cin * nt * isz, 16 * cout * nt * isz

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        """``y = conv(x, w) (+ bias)``, then ReLU when ``relu``."""
        _convolve(prob, "forward", (prob.height, prob.width), prob.pad, x, w, False, bias, y, ws, relu)

    def backward_data(self, prob, w, dy, dx, ws):
        """``dx = dL/dx`` (assigned): the forward transform of ``dy`` padded by ``2 - pad`` with the
        flipped, transposed filter."""
        pad = (2 - prob.pad[0], 2 - prob.pad[1])
        _convolve(prob, "backward_data", prob.out_hw, pad, dy, w, True, None, dx, ws)

    def backward_weight(self, prob, x, dy, dw, db, ws):
        """``dw += dL/dw`` through the transforms' adjoints, then ``db += dL/db`` when given."""
        dtype, isz = prob.np_dtype, prob.itemsize
        ho, wo = prob.out_hw
        tiles = _tiles(ho, wo)
        m, c = prob.num_output, prob.channels
        du, v, dmo, part = ws
        output_grad = backend.kernel(KERNELS, "winograd_output_grad", dtype)
        for n0, nb, t, nblk, blk in _weight_chunks(prob):
            output_grad(m * nblk * blk, dy + n0 * m * ho * wo * isz, m, tiles[0], tiles[1], t, blk, ho, wo, dmo)
            _input(dtype, x + n0 * c * prob.in_plane * isz, nb, c, (prob.height, prob.width), prob.pad, tiles, v,
                   blk, nblk)
            # part[xi, s] (m, c) = dMo[xi, s] (m, blk) . V[xi, s]^T (blk, c), one GEMM per (xi, block)
            blas.gemm_strided_batched(False, True, m, c, blk, 1.0, dmo, m * blk, v, c * blk, 0.0, part, m * c,
                                      16 * nblk, dtype)
            # dU[xi] (1, m*c) (+)= ones (1, nblk) . part[xi] (nblk, m*c)
            blas.gemm_strided_batched(False, False, 1, m * c, nblk, 1.0, gm.ones_vector(nblk, dtype), 0, part,
                                      nblk * m * c, 1.0 if n0 else 0.0, du, m * c, 16, dtype)
        backend.kernel(KERNELS, "winograd_filter_grad", dtype)(m * c, du, m, c, dw)
        if db is not None:
            bias_backward(prob, dy, db)
