"""The ``tensorcore16-BMxBN`` convolution engines: the implicit GEMM on fp16 / bf16 tensor cores
(kernels in ``tensorcore16.cu``).

The three passes of :mod:`.implicit` (its GEMM views and operand gathers, :mod:`.tiling`'s offset
tables, launch grids and split contraction) with the inner products on ``mma.sync`` m16n8k16:
half operands exactly as stored (no rounding: the blobs already hold fp16 or bf16 values), products
accumulated in fp32. The forward epilogue adds the bias and applies the fused ReLU in fp32 and
rounds once; the weight gradient writes fp32 partial sums of its split contraction (fp32 scratch,
4 bytes an element whatever the storage type) and ``t16_reduce_weight`` adds them to ``dw`` (and
``db``, a column of ones in the same GEMM) in a fixed order, rounding once: deterministic.

Offered for float16 and bfloat16 (uint16 bit patterns) problems on compute capability 8.0+.
Tile shapes (:data:`TILES`) are the TF32 engine's; a shared-memory slice holds :data:`BK` = 32
contraction elements, twice the TF32 engine's, since an element takes half the bytes.

A forward or data-gradient pass whose contraction splits into slices of :data:`BK` channels at one
filter tap (:func:`sliced`) runs the channel-sliced kernels (``t16s_*``), as the TF32 engine does:
the weights permuted first (``t16_permute_*``, into scratch) so that each row's slice is 64
contiguous bytes copied by cp.async into a two-stage buffer, and one bounds check per slice for the
image columns. The weight gradient's sliced kernels (C/G a multiple of an eighth of the tile's
width) load a 32-pixel slice per thread row through registers, stepping each thread's pixel; their
bias gradient comes from the Mtype channel reduction (``channel_sum``) instead of a column of ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import CudaError
from ..gpu import backend
from . import tiling
from .problem import ConvProblem, epilogue_flags
from .registry import TiledEngine, bias_backward, register_engine
from .tiling import BLOCK, THREADS, Launch, Reduce, WeightLaunch, nonnull, tile_shape

KERNELS = Path(__file__).with_name("tensorcore16.cu")
TILES = ("128x128", "64x128", "64x64")
BK = 32  # contraction elements per shared-memory slice (T16_BK)
HALF_DTYPES = (np.dtype(np.float16), np.dtype(np.uint16))  # float16, bfloat16 as uint16 bit patterns
PARTIAL_ITEMSIZE = 4  # the weight gradient's partial sums are fp32
REQUIREMENT = "float16 or bfloat16 storage, compute capability 8.0+, " + tiling.REQUIREMENT


def compute_capability() -> tuple[int, int]:
    """The current device's compute capability (a function of its own so CPU tests can replace it)."""
    major, minor = backend.state().device.compute_capability()
    return int(major), int(minor)


def supports(prob: ConvProblem) -> bool:
    """Half storage (the dtype is checked first, so float32/float64 problems are refused without a
    device), int32 indexing, and an sm_80+ device (m16n8k16 mma.sync in fp16 and bf16)."""
    return prob.np_dtype in HALF_DTYPES and tiling.fits_int32(prob) and compute_capability() >= (8, 0)


def sliced(prob: ConvProblem, pass_: str, tile: str = "") -> bool:
    """Whether ``pass_`` runs the channel-sliced kernels: no dilation and the contraction's channel
    axis (C/G forward, M/G data gradient) a multiple of :data:`BK`; for the weight gradient (of
    ``tile``) C/G a multiple of an eighth of the tile's width (each thread's columns share a tap)."""
    if prob.dilation != (1, 1):
        return False
    if pass_ == "forward":
        return prob.cg % BK == 0
    if pass_ == "backward_data":
        return prob.mg % BK == 0
    return prob.cg % (tile_shape(tile)[1] // 8) == 0


def weight_scratch_count(prob: ConvProblem, pass_: str) -> int:
    """Elements of the permuted-weight scratch the forward or data-gradient pass needs (0: none)."""
    return prob.num_output * prob.kg if sliced(prob, pass_) else 0


def _permute(prob: ConvProblem, pass_: str, w: int, ws: list[int]) -> int:
    """The weights permuted for the sliced ``pass_`` into ``ws[0]``; returns that pointer."""
    if not ws or not ws[0]:
        raise CudaError(f"fp16/bf16 tensor-core {pass_}: the channel-sliced kernels need the permuted-weight "
                        "scratch (weight_scratch_count elements)")
    n = prob.num_output * prob.kg
    k = backend.kernel(KERNELS, f"t16_permute_{pass_}", prob.np_dtype)
    if pass_ == "forward":
        k(n, w, prob.cg, prob.khkw, ws[0])
    else:
        k(n, w, prob.cg, prob.khkw, prob.mg, ws[0])
    return ws[0]


def _weight_kernel(prob: ConvProblem, tile: str):
    """The weight pass's kernel for ``tile``: channel-sliced (``t16s_``) or gathering (``t16_``)."""
    prefix = "t16s" if sliced(prob, "backward_weight", tile) else "t16"
    return backend.kernel(KERNELS, f"{prefix}_backward_weight_{tile}", prob.np_dtype)


def weight_splits(prob: ConvProblem, tile: str, has_bias: bool) -> tuple[int, int]:
    """(splits, chunk) of the weight gradient's contraction for ``tile`` (tiling.split_contraction;
    the sliced kernels take no bias column)."""
    bm, bn = tile_shape(tile)
    bias = has_bias and not sliced(prob, "backward_weight", tile)
    return tiling.split_contraction(prob, bm, bn, BK, bias, _weight_kernel(prob, tile).resident_blocks(THREADS))


def workspace_count(prob: ConvProblem, tile: str, has_bias: bool) -> int:
    """fp32 partial sums the weight pass of ``tile`` needs (elements; bytes are 4 times that)."""
    key = ("t16_workspace", tile, has_bias)
    count = prob.cache.get(key)
    if count is None:
        splits, _ = weight_splits(prob, tile, has_bias)
        bias = has_bias and not sliced(prob, "backward_weight", tile)
        count = prob.cache[key] = prob.group * splits * prob.mg * (prob.kg + int(bias))
    return count


def reduce_plan(prob: ConvProblem, splits: int, has_bias: int) -> Reduce:
    """``t16_reduce_weight`` over ``splits`` fp32 partial weight gradients (tiling.Reduce's arguments)."""
    n = prob.group * prob.mg * (prob.kg + has_bias)
    kernel = backend.kernel(KERNELS, "t16_reduce_weight", prob.np_dtype)
    return Reduce(kernel, (min(-(-n // THREADS), backend.MAX_BLOCKS), 1, 1), n, splits, has_bias)


@register_engine("TENSOR_CORE_16", order=55, summary="the implicit GEMM on fp16/bf16 tensor cores (mma.sync "
                 "m16n8k16, fp32 accumulation; float16 and bfloat16 blobs, compute capability 8.0+)")
class TensorCore16Engine(TiledEngine):
    """The implicit GEMM on fp16/bf16 tensor cores with ``tile`` tiles in every pass."""

    requirement = REQUIREMENT
    prefix, tiles = "tensorcore16", TILES

    def supports(self, prob):
        return supports(prob)

    def scratch(self, prob, pass_, has_bias):
        """The weight pass: its fp32 partial sums; forward and data gradient: the permuted weights the
        channel-sliced kernels read (none otherwise)."""
        if pass_ == "backward_weight":
            return (workspace_count(prob, self.tile, has_bias) * PARTIAL_ITEMSIZE,)
        n = weight_scratch_count(prob, pass_)
        return (n * prob.itemsize,) if n else ()

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        """``y = conv(x, w) (+ bias)``, then ReLU when ``relu``, over the whole batch in one launch."""
        tile = self.tile
        epilogue = epilogue_flags(bias, relu)
        if sliced(prob, "forward"):
            w = _permute(prob, "forward", w, ws)
            args = (x, w, bias or w, epilogue, y)
            plan = self._sliced_plan(prob, "forward", prob.num * prob.out_plane, prob.mg, args)
            nonnull(x, w, y)
            plan.kernel.launch(plan.grid, BLOCK, *args, *prob.geometry_args)
            return
        plan = prob.cache.get(("t16_forward", tile))
        if plan is None:
            bm, bn = tile_shape(tile)
            k = backend.kernel(KERNELS, f"t16_forward_{tile}", prob.np_dtype)
            grid = (-(-prob.num * prob.out_plane // bn), -(-prob.mg // bm), prob.group)
            plan = prob.cache[("t16_forward", tile)] = Launch(k, grid, tiling.forward_table(prob))
            k.check_args(x, w, bias or w, epilogue, plan.table, y, *prob.geometry_args)
        nonnull(x, w, y)
        plan.kernel.launch(plan.grid, BLOCK, x, w, bias or w, epilogue, plan.table, y, *prob.geometry_args)

    def backward_data(self, prob, w, dy, dx, ws):
        """``dx = conv_transpose(dy, w)`` (assigned), in one launch."""
        tile = self.tile
        if sliced(prob, "backward_data"):
            w = _permute(prob, "backward_data", w, ws)
            plan = self._sliced_plan(prob, "backward_data", prob.num * prob.in_plane, prob.cg, (w, dy, dx))
            nonnull(w, dy, dx)
            plan.kernel.launch(plan.grid, BLOCK, w, dy, dx, *prob.geometry_args)
            return
        plan = prob.cache.get(("t16_backward_data", tile))
        if plan is None:
            bm, bn = tile_shape(tile)
            k = backend.kernel(KERNELS, f"t16_backward_data_{tile}", prob.np_dtype)
            grid = (-(-prob.num * prob.in_plane // bn), -(-prob.cg // bm), prob.group)
            plan = prob.cache[("t16_backward_data", tile)] = Launch(k, grid, tiling.backward_data_table(prob))
            k.check_args(w, dy, plan.table, dx, *prob.geometry_args)
        nonnull(w, dy, dx)
        plan.kernel.launch(plan.grid, BLOCK, w, dy, plan.table, dx, *prob.geometry_args)

    def _sliced_plan(self, prob: ConvProblem, pass_: str, cols: int, rows: int, args: tuple) -> Launch:
        """The launch of ``t16s_<pass_>_<tile>`` over a ``rows x cols`` output per group (``args``:
        its arguments before the geometry, checked against the signature on the first call)."""
        key = ("t16s", pass_, self.tile)
        plan = prob.cache.get(key)
        if plan is None:
            bm, bn = tile_shape(self.tile)
            k = backend.kernel(KERNELS, f"t16s_{pass_}_{self.tile}", prob.np_dtype)
            plan = prob.cache[key] = Launch(k, (-(-cols // bn), -(-rows // bm), prob.group))
            k.check_args(*args, *prob.geometry_args)
        return plan

    def backward_weight(self, prob, x, dy, dw, db, ws):
        """``dw += dL/dw`` and, when ``db`` is given, ``db += dL/db`` (a column of ones in the same
        GEMM; the sliced kernels leave it to ``channel_sum``); ``ws[0]`` holds at least
        :func:`workspace_count` fp32 elements. Deterministic: fp32 split-K partial sums, then
        ``t16_reduce_weight`` adds them in a fixed order."""
        tile, workspace = self.tile, ws[0]
        is_sliced = sliced(prob, "backward_weight", tile)
        has_bias = int(db is not None and not is_sliced)
        key = ("t16_backward_weight", tile, has_bias)
        plan = prob.cache.get(key)
        if plan is None:
            bm, bn = tile_shape(tile)
            splits, chunk = weight_splits(prob, tile, bool(has_bias))
            cols = prob.kg + has_bias
            k = _weight_kernel(prob, tile)
            grid = (-(-cols // bn), -(-prob.mg // bm), prob.group * splits)
            reduce = reduce_plan(prob, splits, has_bias)
            if is_sliced:  # x, dy, ws, splits, chunk
                plan = WeightLaunch(k, grid, splits, chunk, reduce)
            else:  # x, dy, offset table, ws, splits, chunk, has_bias
                plan = WeightLaunch(k, grid, splits, chunk, reduce, table=(tiling.forward_table(prob),),
                                    flags=(has_bias,))
            prob.cache[key] = plan
            k.check_args(x, dy, *plan.table, workspace, splits, chunk, *plan.flags, *prob.geometry_args)
            reduce.kernel.check_args(*reduce.args(prob, workspace, dw, db))
        nonnull(x, dy, dw, workspace)
        plan.kernel.launch(plan.grid, BLOCK, x, dy, *plan.table, workspace, plan.splits, plan.chunk, *plan.flags,
                           *prob.geometry_args)
        plan.reduce.launch(prob, workspace, dw, db)
        if is_sliced and db is not None:  # db += dy summed over images and pixels
            bias_backward(prob, dy, db)
