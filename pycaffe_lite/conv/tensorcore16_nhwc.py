"""The ``tensorcore16-nhwc-BMxBN`` convolution engines: the implicit GEMM on fp16 / bf16 tensor cores
with both operands staged channels-last (kernels in ``tensorcore16_nhwc.cu``).

Each pass first re-lays its operands in the pass's scratch, then runs one GEMM kernel
(``t16n_conv_<tile>``) that copies both operands with 16-byte ``cp.async`` into a
:data:`STAGES`-deep shared-memory ring and multiplies them with ``mma.sync`` m16n8k16 (fp32
accumulation, one rounding in the epilogue):

- **forward**: ``x`` NCHW -> NHWC (``t16n_to_nhwc``: 64 x 64 shared-memory tiles, 16-byte stores;
  :class:`Stage`), the weights ``(M, C, kh, kw)`` -> ``(M, kh, kw, C)`` (``t16n_permute_weights``); the kernel writes
  ``y`` NCHW with the bias and the fused ReLU (any kernel size, stride and padding);
- **data gradient**, M a multiple of 8: the same kernel on ``dy`` staged NHWC (staged by the weight
  gradient when this engine family runs both: :meth:`TensorCore16NhwcEngine.backward_pair`), once per output
  phase of the stride (:func:`phases`; one at stride 1): the transposed filter's taps of that phase,
  flipped, ``(C, uh, uw, M)``, as a stride-1 convolution writing every stride-th row and column of
  ``dx`` (dx zeroed first where a phase has no taps; such a phase launches nothing); other M run tensorcore16's data gradient (:func:`own_data_gradient`, :func:`delegate_tile`),
  so the autotune sees one timing per tile either way;
- **weight gradient**, M a multiple of 8: ``x`` and ``dy`` staged NHWC, ``t16n_wgrad_<tile>`` sums
  the contraction over N*Ho*Wo in splits (:func:`.tiling.split_contraction`) into fp32 partial sums
  that tensorcore16's ``t16_reduce_weight`` adds to ``dw`` in a fixed order (deterministic, one
  rounding); the bias gradient is the Mtype channel reduction (``bias_backward``). Other M: tensorcore16's.

Offered (:func:`supports`) for float16 and bfloat16 problems on compute capability 8.0+ with one
group and no dilation. The kernels read a pixel's channels in 16-byte pieces: C off the multiple of 8
(an RGB stem's 3) is staged zero-padded to :func:`staged_channels` (``t16n_to_nhwc_narrow``), with
the permuted weights padded alike; the weight gradient writes only the weights' own channels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CudaError
from ..gpu import backend, blas
from . import tensorcore16 as t16
from . import tiling
from .problem import ConvProblem, epilogue_flags
from .registry import TiledEngine, bias_backward, register_engine
from .tiling import BLOCK, THREADS, nonnull, tile_shape

KERNELS = Path(__file__).with_suffix(".cu")
TILES = ("128x128", "128x64", "64x128", "64x64")  # T16N_CONV lines of the .cu
STAGES = 4  # slices in flight (the STAGES of every T16N_CONV line)
BK = 32  # contraction elements (channels at one tap) per slice: T16N_BK
CHANNEL_MULTIPLE = 8  # contraction channels per 16-byte cp.async piece
REQUIREMENT = "float16 or bfloat16 storage, compute capability 8.0+, group 1, no dilation, " + tiling.REQUIREMENT


def shared_bytes(tile: str) -> int:
    """Dynamic shared memory of ``t16n_conv_<tile>``: the stage ring (A and B rows of :data:`BK`
    halves) or the epilogue tile (BM rows of BN + 8 halves), whichever is larger."""
    bm, bn = tile_shape(tile)
    return 2 * max(STAGES * (bm + bn) * BK, bm * (bn + 8))


def padded_channels(channels: int) -> int:
    """``channels`` rounded up to :data:`CHANNEL_MULTIPLE` (a pixel's channels in whole 16-byte pieces)."""
    return -(-channels // CHANNEL_MULTIPLE) * CHANNEL_MULTIPLE


def staged_channels(prob: ConvProblem) -> int:
    """The input's channels as the kernels read them: C rounded up to :data:`CHANNEL_MULTIPLE` (the
    staged input and the permuted weights hold zeros past C)."""
    return padded_channels(prob.channels)


def staged_kg(prob: ConvProblem) -> int:
    """A permuted weight row as the kernels read it: kh * kw * :func:`staged_channels` (the forward's
    contraction, the weight gradient's columns)."""
    return prob.kernel[0] * prob.kernel[1] * staged_channels(prob)


def supports(prob: ConvProblem) -> bool:
    """Half storage (checked first: float32/float64 problems are refused without a device), one group,
    no dilation, int32 indexing (of the padded input too), an sm_80+ device."""
    return (prob.np_dtype in t16.HALF_DTYPES and prob.group == 1 and prob.dilation == (1, 1)
            and tiling.fits_int32(prob) and prob.num * staged_channels(prob) * prob.in_plane <= backend.INT32_MAX
            and t16.compute_capability() >= (8, 0))


def own_data_gradient(prob: ConvProblem) -> bool:
    """Whether the data gradient runs this engine's kernel (M a multiple of 8); else it runs
    tensorcore16's data gradient of the delegate tile."""
    return prob.num_output % CHANNEL_MULTIPLE == 0


def own_weight_gradient(prob: ConvProblem) -> bool:
    """Whether the weight gradient runs this engine's kernel (M a multiple of 8; C is by
    :func:`supports`); else tensorcore16's weight gradient of the delegate tile."""
    return prob.num_output % CHANNEL_MULTIPLE == 0


def owns(prob: ConvProblem, pass_: str) -> bool:
    """Whether ``pass_`` runs this engine's kernels (else tensorcore16's of :func:`delegate_tile`)."""
    if pass_ == "forward":
        return True
    return own_data_gradient(prob) if pass_ == "backward_data" else own_weight_gradient(prob)


def subsampled(prob: ConvProblem) -> bool:
    """Whether the input is staged subsampled: a 1x1 kernel at a stride above 1 without padding reads
    only the pixels (oy*sh, ox*sw), so the forward and the weight gradient stage those (Ho x Wo) and
    run as the stride-1 1x1 convolution of them (C a multiple of 8: the tile transpose's copy)."""
    return (prob.kernel == (1, 1) and prob.pad == (0, 0) and prob.stride != (1, 1)
            and prob.channels % CHANNEL_MULTIPLE == 0)


def staged_counts(prob: ConvProblem, pass_: str) -> tuple[int, int]:
    """Elements of what ``pass_`` stages: forward, the NHWC input and the permuted weights (both of
    :func:`staged_channels`); data gradient, the NHWC dy and the permuted weights; weight gradient,
    the NHWC dy and input."""
    x, dy, weights = (prob.num * staged_channels(prob) * (prob.out_plane if subsampled(prob) else prob.in_plane),
                      prob.num * prob.num_output * prob.out_plane, prob.num_output * staged_kg(prob))
    return {"forward": (x, weights), "backward_data": (dy, weights), "backward_weight": (dy, x)}[pass_]


def conv_geometry(prob: ConvProblem) -> tuple[int, ...]:
    """The forward's ``t16n_conv`` geometry arguments: (num, C, H, W, M, kh, kw, pad_h, pad_w,
    stride_h, stride_w, Ho, Wo), C the :func:`staged_channels`; :func:`subsampled`: the stride-1 1x1
    convolution of the staged Ho x Wo input."""
    (kh, kw), (ph, pw), (ho, wo) = prob.kernel, prob.pad, prob.out_hw
    if subsampled(prob):
        return (prob.num, prob.channels, ho, wo, prob.num_output, 1, 1, 0, 0, 1, 1, ho, wo)
    return (prob.num, staged_channels(prob), prob.height, prob.width, prob.num_output, kh, kw, ph, pw,
            prob.stride[0], prob.stride[1], ho, wo)


@dataclass(frozen=True)
class Phase:
    """One ``t16n_conv`` launch: its geometry and out_* arguments, and the ``t16n_permute_weights``
    arguments (count, rows, chans, kh, kw, uh, uw, i0, j0, sh, sw, data_grad, wchans) of its weights."""

    geometry: tuple[int, ...]
    out: tuple[int, ...]
    permute: tuple[int, ...]

    @property
    def dense(self) -> bool:
        """Whether the output is the GEMM's columns in order with Ho*Wo % 8 == 0: the kernel may store
        8 columns at once (``vec_out``, when the output pointer is 16-byte aligned too)."""
        ho, wo = self.geometry[11], self.geometry[12]
        return self.out == (ho, wo, 1, 1, 0, 0) and (ho * wo) % CHANNEL_MULTIPLE == 0


def _phase_axis(size: int, k: int, pad: int, stride: int, phase: int) -> tuple[int, int, int, int]:
    """One axis of a data-gradient phase: (first tap i0, taps u, padding, output positions). dx
    positions phase + stride*a take the taps i = i0 + stride*u' with i0 = (phase + pad) % stride,
    reading dy at a + (phase + pad - i0)/stride - u': a stride-1 convolution over the flipped taps
    with padding u - 1 - (phase + pad - i0)/stride."""
    i0 = (phase + pad) % stride
    taps = max(0, -(-(k - i0) // stride))
    return i0, taps, taps - 1 - (phase + pad - i0) // stride, -(-(size - phase) // stride)


def phases(prob: ConvProblem, pass_: str) -> tuple[Phase, ...]:
    """The ``t16n_conv`` launches of ``pass_``: the forward's one; the data gradient's one per output
    phase (py, px) of the stride (one at stride 1), each the stride-1 convolution of dy (M channels,
    Ho x Wo) by that phase's flipped taps of the transposed filter into dx rows py + sh*a, columns
    px + sw*b (phases without taps write zeros)."""
    (kh, kw), (ph, pw), (sh, sw), (ho, wo) = prob.kernel, prob.pad, prob.stride, prob.out_hw
    m, c = prob.num_output, prob.channels
    if pass_ == "forward":
        return (Phase(conv_geometry(prob), (ho, wo, 1, 1, 0, 0),
                      (m * staged_kg(prob), m, staged_channels(prob), kh, kw, kh, kw, 0, 0, 1, 1, 0, c)),)
    out = []
    for py in range(min(sh, prob.height)):
        i0, uh, pad_h, hp = _phase_axis(prob.height, kh, ph, sh, py)
        for px in range(min(sw, prob.width)):
            j0, uw, pad_w, wp = _phase_axis(prob.width, kw, pw, sw, px)
            out.append(Phase((prob.num, m, ho, wo, c, uh, uw, pad_h, pad_w, 1, 1, hp, wp),
                             (prob.height, prob.width, sh, sw, py, px),
                             (c * uh * uw * m, c, m, kh, kw, uh, uw, i0, j0, sh, sw, 1, m)))
    return tuple(out)


TRANSPOSE_TILE = 64  # T16N_TT: pixels and channels of a t16n_to_nhwc block


@dataclass(frozen=True)
class Stage:
    """An NCHW -> NHWC staging launch: ``kernel`` over ``grid`` with ``head`` arguments, then source
    and destination, then ``tail`` (``t16n_to_nhwc``'s or ``t16n_to_nhwc_narrow``'s)."""

    kernel: Any
    grid: tuple[int, int, int]
    head: tuple[int, ...]
    tail: tuple[int, ...]

    def __call__(self, src: int, dst: int) -> None:
        self.kernel.launch(self.grid, BLOCK, *self.head, src, dst, *self.tail)


def stage_plan(prob: ConvProblem, num: int, channels: int, plane: int,
               source: tuple[int, int, int, int, int] | None = None) -> Stage:
    """The :class:`Stage` of a (num, channels, plane) operand of ``prob``'s dtype to (num, plane,
    padded) with padded = channels rounded up to :data:`CHANNEL_MULTIPLE`: channels a multiple of 8
    the 64 x 64 tile transpose ``t16n_to_nhwc``, others ``t16n_to_nhwc_narrow`` (zeros past C).
    ``source`` (out_w, in_plane, in_w, sh, sw): the operand is (num, channels, in_plane) and pixel p
    of the staged one its pixel (p // out_w) * sh * in_w + (p % out_w) * sw (channels % 8 == 0)."""
    if num > backend.MAX_GRID_YZ:
        raise CudaError(f"fp16/bf16 NHWC staging: {num} images (at most {backend.MAX_GRID_YZ})")
    if channels % CHANNEL_MULTIPLE == 0:
        tiles = -(-channels // TRANSPOSE_TILE) * -(-plane // TRANSPOSE_TILE)
        return Stage(backend.kernel(KERNELS, "t16n_to_nhwc", prob.np_dtype), (tiles, num, 1), (),
                     (channels, plane, *(source or (plane, plane, plane, 1, 1))))
    if source is not None:
        raise CudaError(f"fp16/bf16 NHWC staging: a subsampled copy of {channels} channels (a multiple of 8 expected)")
    padded = padded_channels(channels)
    count = num * plane * padded // CHANNEL_MULTIPLE
    return Stage(backend.kernel(KERNELS, "t16n_to_nhwc_narrow", prob.np_dtype),
                 (min(-(-count // THREADS), backend.MAX_BLOCKS), 1, 1), (count,),
                 (channels, padded, plane))


@dataclass(frozen=True)
class Plan:
    """One pass of one tile: stage the image operand (``stage``); zero the output's ``zero_first``
    elements when some phase has no taps (1x1 at stride 2: those positions of dx are 0); then per
    :class:`Phase` with taps permute the weights (``permute_w``) and run ``kernel`` over its grid
    (``grids``) with ``shared`` bytes of dynamic shared memory."""

    kernel: Any
    shared: int
    stage: Stage
    permute_w: Any
    phases: tuple[Phase, ...]
    grids: tuple[tuple[int, int, int], ...]
    zero_first: int


def input_stage(prob: ConvProblem) -> Stage:
    """The :class:`Stage` of the input x for the forward and the weight gradient: its channels padded
    to :func:`staged_channels`, its pixels subsampled where :func:`subsampled`."""
    if subsampled(prob):
        (ho, wo), (sh, sw) = prob.out_hw, prob.stride
        return stage_plan(prob, prob.num, prob.channels, ho * wo, (wo, prob.in_plane, prob.width, sh, sw))
    return stage_plan(prob, prob.num, prob.channels, prob.in_plane)


def conv_kernel(tile: str, dtype) -> tuple[Any, int]:
    """``t16n_conv_<tile>`` compiled for ``dtype``, and its dynamic shared memory (bytes)."""
    return backend.kernel(KERNELS, f"t16n_conv_{tile}", dtype), shared_bytes(tile)


def plan(prob: ConvProblem, pass_: str, tile: str, kernel_of: Callable[[str, Any], tuple[Any, int]] = conv_kernel
         ) -> Plan:
    """The cached :class:`Plan` of ``pass_`` ("forward" or "backward_data") for ``tile``, its GEMM
    ``kernel_of(tile, dtype)`` (:func:`conv_kernel`, or another kernel of t16n_conv's arguments)."""
    key = ("t16n", kernel_of.__module__, pass_, tile)
    have = prob.cache.get(key)
    if have is not None:
        return have
    bm, bn = tile_shape(tile)
    every = phases(prob, pass_)
    todo = tuple(ph for ph in every if ph.geometry[5] * ph.geometry[6])
    zero_first = 0 if len(todo) == len(every) else prob.num * prob.channels * prob.in_plane  # dx, data gradient
    grids = []
    for ph in todo:
        blocks = -(-ph.geometry[4] // bm) * -(-ph.geometry[0] * ph.geometry[11] * ph.geometry[12] // bn)
        if blocks > backend.INT32_MAX:
            raise CudaError(f"fp16/bf16 NHWC tensor-core {pass_}: {blocks} blocks exceed a one-dimensional grid")
        grids.append((blocks, 1, 1))
    k, shared = kernel_of(tile, prob.np_dtype)
    k.allow_shared(shared)
    num, chans, h, w = every[0].geometry[:4]
    stage = input_stage(prob) if pass_ == "forward" else stage_plan(prob, num, chans, h * w)
    made = prob.cache[key] = Plan(k, shared, stage,
                                  backend.kernel(KERNELS, "t16n_permute_weights", prob.np_dtype), todo, tuple(grids),
                                  zero_first)
    return made


@dataclass(frozen=True)
class WeightPlan:
    """The weight gradient of one tile: stage dy and x (``stage_dy``, ``stage_x``), run ``kernel``
    over ``grid`` (splits of ``chunk`` pixels), then ``reduce`` the fp32 partial sums into dw."""

    kernel: Any
    grid: tuple[int, int, int]
    shared: int
    chunk: int
    splits: int
    geometry: tuple[int, ...]
    stage_dy: Stage
    stage_x: Stage
    reduce: tiling.Reduce


def weight_splits(prob: ConvProblem, tile: str) -> tuple[int, int]:
    """(splits, chunk) of the weight gradient's contraction over N*Ho*Wo for ``tile``
    (:func:`.tiling.split_contraction` with the kernel's resident blocks), cached per problem."""
    key = ("t16n_splits", tile)
    have = prob.cache.get(key)
    if have is None:
        bm, bn = tile_shape(tile)
        k = backend.kernel(KERNELS, f"t16n_wgrad_{tile}", prob.np_dtype)
        resident = k.resident_blocks(THREADS, shared_bytes(tile))
        have = prob.cache[key] = tiling.split_contraction(prob, bm, bn, BK, False, resident, staged_kg(prob))
    return have


def partial_count(prob: ConvProblem, tile: str) -> int:
    """fp32 partial sums the weight gradient of ``tile`` writes (elements; 4 bytes each)."""
    return weight_splits(prob, tile)[0] * prob.num_output * prob.kg


def weight_plan(prob: ConvProblem, tile: str) -> WeightPlan:
    """The cached :class:`WeightPlan` of ``tile``."""
    key = ("t16n", "backward_weight", tile)
    have = prob.cache.get(key)
    if have is not None:
        return have
    bm, bn = tile_shape(tile)
    splits, chunk = weight_splits(prob, tile)
    k = backend.kernel(KERNELS, f"t16n_wgrad_{tile}", prob.np_dtype)
    shared = shared_bytes(tile)
    k.allow_shared(shared)
    blocks = -(-prob.num_output // bm) * -(-staged_kg(prob) // bn)
    made = prob.cache[key] = WeightPlan(
        k, (blocks, splits, 1), shared, chunk, splits, conv_geometry(prob),
        stage_plan(prob, prob.num, prob.num_output, prob.out_plane), input_stage(prob),
        t16.reduce_plan(prob, splits, 0))
    return made


def delegate_tile(tile: str) -> str:
    """The tensorcore16 tile that runs a gradient this engine does not (M % 8 != 0): its own tile
    where tensorcore16 has it."""
    return tile if tile in t16.TILES else "64x64"


def _staged(prob: ConvProblem, pass_: str, ws: list[int]) -> tuple[int, int]:
    if len(ws) < 2 or not ws[0] or not ws[1]:
        raise CudaError(f"fp16/bf16 NHWC tensor-core {pass_}: needs its two scratch regions (the NHWC image "
                        "operand and the permuted weights: TensorCore16NhwcEngine.scratch)")
    return ws[0], ws[1]


def run_pass(prob: ConvProblem, pass_: str, tile: str, image: int, w: int, bias: int, epilogue: int, out: int,
             ws: list[int], restage: bool = True,
             kernel_of: Callable[[str, Any], tuple[Any, int]] = conv_kernel) -> None:
    """Stage ``image`` (NCHW) and ``w`` into ``ws`` and run the GEMM kernel (:func:`plan`) into
    ``out`` (NCHW); ``restage`` False: ``ws[0]`` already holds ``image`` staged."""
    staged, wp = _staged(prob, pass_, ws)
    p = plan(prob, pass_, tile, kernel_of)
    nonnull(image, w, out)
    if restage:
        p.stage(image, staged)
    if p.zero_first:
        backend.memset_zero(out, p.zero_first * prob.itemsize)
    for ph, grid in zip(p.phases, p.grids):  # in stream order: each phase's weights, then its GEMM
        n, *args = ph.permute
        p.permute_w(n, w, *args, wp)
        vec_out = int(ph.dense and out % 16 == 0)
        p.kernel.launch(grid, BLOCK, staged, wp, bias, epilogue, out, *ph.geometry, *ph.out, vec_out, shared=p.shared)


@register_engine("TENSOR_CORE_16", order=56, summary="the implicit GEMM on fp16/bf16 tensor cores with operands "
                 "staged NHWC (cp.async into a 4-stage ring, mma.sync m16n8k16, fp32 accumulation; float16 and "
                 "bfloat16 blobs, compute capability 8.0+, group 1, no dilation, C a multiple of 8)")
class TensorCore16NhwcEngine(TiledEngine):
    """The NHWC-staged fp16/bf16 tensor-core implicit GEMM with ``tile`` tiles in every pass."""

    requirement = REQUIREMENT
    prefix = "tensorcore16-nhwc"
    tiles: tuple[str, ...] = TILES
    kernel_of = staticmethod(conv_kernel)  # the forward's and data gradient's GEMM kernel (plan)

    def supports(self, prob):
        return supports(prob)

    def scratch(self, prob, pass_, has_bias):
        """Bytes: what the pass stages (:func:`staged_counts`), and for the weight gradient its fp32
        partial sums; a delegated pass (:func:`owns`): tensorcore16's scratch."""
        if not owns(prob, pass_):
            return t16.TensorCore16Engine(delegate_tile(self.tile)).scratch(prob, pass_, has_bias)
        staged = tuple(n * prob.itemsize for n in staged_counts(prob, pass_))
        if pass_ == "backward_weight":
            return (*staged, partial_count(prob, self.tile) * t16.PARTIAL_ITEMSIZE)
        return staged

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        """``y = conv(x, w) (+ bias)``, then ReLU when ``relu``: stage x NHWC and w (M, kh, kw, C), one GEMM."""
        run_pass(prob, "forward", self.tile, x, w, bias or w, epilogue_flags(bias, relu), y, ws, kernel_of=self.kernel_of)

    def backward_data(self, prob, w, dy, dx, ws):
        """``dx = conv_transpose(dy, w)`` (assigned): one GEMM per stride phase; tensorcore16's for M % 8 != 0."""
        if not own_data_gradient(prob):
            t16.TensorCore16Engine(delegate_tile(self.tile)).backward_data(prob, w, dy, dx, ws)
            return
        run_pass(prob, "backward_data", self.tile, dy, w, w, 0, dx, ws, kernel_of=self.kernel_of)

    def backward_weight(self, prob, x, dy, dw, db, ws):
        """``dw += dL/dw`` (fp32 split-K partial sums, reduced in a fixed order: deterministic) and
        ``db += dL/db`` (channel reduction) when ``db`` is given; tensorcore16's for M % 8 != 0."""
        if not own_weight_gradient(prob):
            t16.TensorCore16Engine(delegate_tile(self.tile)).backward_weight(prob, x, dy, dw, db, ws)
            return
        if len(ws) < 3 or not all(ws[:3]):
            raise CudaError("fp16/bf16 NHWC tensor-core backward_weight: needs its three scratch regions (NHWC dy, "
                            "NHWC input, fp32 partial sums: TensorCore16NhwcEngine.scratch)")
        self._weight_gradient(prob, x, dy, dw, db, *ws[:3])

    def _weight_gradient(self, prob, x, dy, dw, db, dy_h, x_h, part) -> None:
        """Stage dy into ``dy_h`` and x into ``x_h``, sum into ``part``, reduce into dw; db."""
        p = weight_plan(prob, self.tile)
        nonnull(x, dy, dw)
        p.stage_dy(dy, dy_h)
        p.stage_x(x, x_h)
        p.kernel.launch(p.grid, BLOCK, dy_h, x_h, part, p.chunk, prob.channels, *p.geometry, shared=p.shared)
        p.reduce.launch(prob, part, dw, None)
        if db is not None:
            bias_backward(prob, dy, db)

    def backward_pair(self, prob, data_engine, x, w, dy, dw, db, dx):
        """With another NHWC engine for the data gradient (any tile) and M % 8 == 0: dy is staged
        once, for the weight gradient, and the data gradient's GEMMs read it there."""
        if not (isinstance(data_engine, TensorCore16NhwcEngine) and "backward_data" in data_engine.passes
                and own_weight_gradient(prob) and own_data_gradient(prob)):
            return False
        weights = data_engine.scratch(prob, "backward_data", False)[1]  # (its staged dy is the weight pass's)
        *mine, wp = backend.workspace(*self.scratch(prob, "backward_weight", db is not None), weights)
        self._weight_gradient(prob, x, dy, dw, db, *mine)
        run_pass(prob, "backward_data", data_engine.tile, dy, w, w, 0, dx, [mine[0], wp], restage=False,
                 kernel_of=data_engine.kernel_of)
        return True


def cublas_supports(prob: ConvProblem) -> bool:
    """A 1x1 convolution tensorcore16-nhwc runs, at stride 1 without padding or :func:`subsampled`,
    with C and M multiples of 8: its weight gradient is one GEMM of the staged operands."""
    return (supports(prob) and prob.kernel == (1, 1) and prob.channels % CHANNEL_MULTIPLE == 0
            and prob.num_output % CHANNEL_MULTIPLE == 0
            and ((prob.stride == (1, 1) and prob.pad == (0, 0)) or subsampled(prob)))


@register_engine("TENSOR_CORE_16", order=58, summary="the weight gradient of 1x1 fp16/bf16 convolutions as one "
                 "cuBLAS GEMM (cublasGemmEx, fp32 accumulation) of dy and x staged NHWC: dw += dy^T . x over "
                 "N*Ho*Wo; stride 1 without padding or subsampled, C and M multiples of 8")
class TensorCore16NhwcCublasEngine(TensorCore16NhwcEngine):
    """tensorcore16-nhwc's staging with the 1x1 weight gradient's contraction over every pixel done
    by cuBLAS: ``g (M, C) = dy_nhwc^T (M, T) . x_nhwc (T, C)`` in fp32 (T = N*Ho*Wo), then
    ``t16_reduce_weight`` adds it onto dw with one rounding."""

    tiles = ("cublas",)  # one variant, named tensorcore16-nhwc-cublas (no tile of its own)
    passes = ("backward_weight",)

    def supports(self, prob):
        return cublas_supports(prob)

    def scratch(self, prob, pass_, has_bias):
        """Bytes of the staged dy and x, and of the fp32 gradient (M x C)."""
        return (*(n * prob.itemsize for n in staged_counts(prob, "backward_weight")),
                prob.num_output * prob.kg * t16.PARTIAL_ITEMSIZE)

    def _weight_gradient(self, prob, x, dy, dw, db, dy_h, x_h, part) -> None:
        key = ("t16n", "cublas_weight")
        have = prob.cache.get(key)
        if have is None:
            have = prob.cache[key] = (stage_plan(prob, prob.num, prob.num_output, prob.out_plane), input_stage(prob),
                                      t16.reduce_plan(prob, 1, 0))
        stage_dy, stage_x, reduce = have
        nonnull(x, dy, dw)
        stage_dy(dy, dy_h)
        stage_x(x, x_h)
        blas.gemm(True, False, prob.num_output, prob.channels, prob.num * prob.out_plane, 1.0, dy_h, x_h, 0.0, part,
                  prob.np_dtype, c_float=True)
        reduce.launch(prob, part, dw, None)
        if db is not None:
            bias_backward(prob, dy, db)
