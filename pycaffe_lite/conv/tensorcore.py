"""The ``tensorcore-BMxBN`` convolution engines: the implicit GEMM on TF32 tensor cores (kernels in
``tensorcore.cu``).

The three passes of :mod:`.implicit` (same GEMM views, offset tables, launch grids and deterministic
split-K weight gradient with its fixed-order reduction, all from :mod:`.tiling`), with the inner
products on tensor cores: operands rounded to TF32 (10-bit mantissa), products accumulated in fp32.
Offered only for float32 when TF32 is allowed (``caffe.set_allow_tf32(True)``), so the default stays
exact fp32. Tile shapes are named ``"BMxBN"`` (:data:`TILES`); one engine per tile, every pass.

A pass whose contraction splits into slices of :data:`SLICE` channels at one filter tap (see
:func:`sliced`) runs the channel-sliced kernels (``tcs_*``): cp.async copies in a
:data:`STAGES`-deep shared-memory pipeline, one bounds check per slice; the weight gradient's bias
then comes from the fp32 channel reduction (``channel_sum``) instead of a column of ones.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..gpu import backend, blas
from ..gpu.backend import CudaError
from . import tiling
from .problem import ConvProblem, epilogue_flags
from .registry import TiledEngine, bias_backward, register_engine
from .tiling import BLOCK, Launch, WeightLaunch, nonnull, tile_shape

KERNELS = Path(__file__).with_name("tensorcore.cu")
TILES = ("128x128", "64x128", "64x64")
BK = 16  # contraction slice per shared-memory stage (the kernels' template argument)
SLICE, STAGES = 32, 3  # the channel-sliced kernels' TCS_BK and TCS_STAGES
REQUIREMENT = "float32 with TF32 allowed (caffe.set_allow_tf32), compute capability 8.0+, " + tiling.REQUIREMENT


def supports(prob: ConvProblem) -> bool:
    return (prob.np_dtype == np.float32 and blas.tf32_allowed() and tiling.fits_int32(prob)
            and backend.state().device.compute_capability() >= (8, 0))


def sliced(prob: ConvProblem, tile: str, pass_: str) -> bool:
    """Whether ``pass_`` of ``prob`` runs the channel-sliced kernels: the contraction's channel axis
    (C/G forward, M/G data gradient) is a multiple of :data:`SLICE`, or for the weight gradient C/G
    a multiple of an eighth of the tile's width (each thread's columns share a tap); no dilation."""
    if prob.dilation != (1, 1):
        return False
    if pass_ == "forward":
        return prob.cg % SLICE == 0
    if pass_ == "backward_data":
        return prob.mg % SLICE == 0
    return prob.cg % (tile_shape(tile)[1] // 8) == 0


def _sliced_kernel(name: str, tile: str, prob: ConvProblem, b_kfast: bool):
    """The ``tcs_`` kernel ``name``, allowed the dynamic shared memory its stages take; (kernel, bytes)."""
    bm, bn = tile_shape(tile)
    ldb = SLICE + 4 if b_kfast else bn + 8
    floats = STAGES * (bm * (SLICE + 4) + (bn if b_kfast else SLICE) * ldb)
    k = backend.kernel(KERNELS, name, prob.np_dtype)
    nbytes = floats * 4
    k.allow_shared(nbytes)
    return k, nbytes


def _sliced_launch(prob: ConvProblem, tile: str, pass_: str, cols: int, rows: int, *args: int) -> None:
    """Launch ``tcs_<pass_>_<tile>`` over a ``rows x cols`` output per group (``args``: its pointer
    and flag arguments, pointers first; the geometry follows)."""
    plan = prob.cache.get(("tcs", pass_, tile))
    if plan is None:
        bm, bn = tile_shape(tile)
        k, nbytes = _sliced_kernel(f"tcs_{pass_}_{tile}", tile, prob, False)
        plan = prob.cache[("tcs", pass_, tile)] = Launch(k, (-(-cols // bn), -(-rows // bm), prob.group),
                                                         shared=nbytes)
        k.check_args(*args, *prob.geometry_args)
    nonnull(*args[:2], args[-1])
    plan.kernel.launch(plan.grid, BLOCK, *args, *prob.geometry_args, shared=plan.shared)


def _gather_launch(prob: ConvProblem, tile: str, pass_: str, cols: int, rows: int,
                   table: Callable[[ConvProblem], int], *args: int) -> None:
    """Launch ``tc_<pass_>_<tile>`` (the kernels that gather through the offset table ``table(prob)``
    of :mod:`.tiling`, passed just before the output pointer, the last of ``args``) over a
    ``rows x cols`` output per group."""
    plan = prob.cache.get(("tc", pass_, tile))
    if plan is None:
        bm, bn = tile_shape(tile)
        k = backend.kernel(KERNELS, f"tc_{pass_}_{tile}", prob.np_dtype)
        plan = prob.cache[("tc", pass_, tile)] = Launch(k, (-(-cols // bn), -(-rows // bm), prob.group), table(prob))
        k.check_args(*args[:-1], plan.table, args[-1], *prob.geometry_args)
    nonnull(*args[:2], args[-1])
    plan.kernel.launch(plan.grid, BLOCK, *args[:-1], plan.table, args[-1], *prob.geometry_args)


def weight_scratch_count(prob: ConvProblem, tile: str, pass_: str) -> int:
    """Elements of the permuted-weight scratch the forward or data-gradient pass needs (0: none)."""
    return prob.num_output * prob.kg if pass_ != "backward_weight" and sliced(prob, tile, pass_) else 0


def _permute(prob: ConvProblem, pass_: str, w: int, out: int | None) -> None:
    if not out:
        raise CudaError(f"tensor-core {pass_}: the channel-sliced kernels need the permuted-weight scratch "
                        "(weight_scratch_count elements)")
    n = prob.num_output * prob.kg
    k = backend.kernel(KERNELS, f"tc_permute_{pass_}", prob.np_dtype)
    if pass_ == "forward":
        k(n, w, prob.cg, prob.khkw, out)
    else:
        k(n, w, prob.cg, prob.khkw, prob.mg, out)


def _weight_splits(prob: ConvProblem, tile: str, has_bias: bool) -> tuple[int, int]:
    """(splits, chunk) of the weight gradient's contraction for ``tile`` (tiling.split_contraction)."""
    bm, bn = tile_shape(tile)
    if sliced(prob, tile, "backward_weight"):
        k, nbytes = _sliced_kernel(f"tcs_backward_weight_{tile}", tile, prob, True)
        return tiling.split_contraction(prob, bm, bn, SLICE, False, k.resident_blocks(BLOCK[0], nbytes))
    k = backend.kernel(KERNELS, f"tc_backward_weight_{tile}", prob.np_dtype)
    return tiling.split_contraction(prob, bm, bn, BK, has_bias, k.resident_blocks(BLOCK[0]))


def workspace_count(prob: ConvProblem, tile: str, has_bias: bool) -> int:
    """Elements of the partial-sum scratch the weight pass needs."""
    splits, _ = _weight_splits(prob, tile, has_bias)
    cols = prob.kg if sliced(prob, tile, "backward_weight") else prob.kg + int(has_bias)
    return prob.group * splits * prob.mg * cols


@register_engine("TENSOR_CORE", order=50, summary="the implicit GEMM on TF32 tensor cores (float32 with "
                 "TF32 allowed, compute capability 8.0+)")
class TensorCoreEngine(TiledEngine):
    """The implicit GEMM on TF32 tensor cores with ``tile`` tiles in every pass."""

    requirement = REQUIREMENT
    prefix, tiles = "tensorcore", TILES

    def supports(self, prob):
        return supports(prob)

    def scratch(self, prob, pass_, has_bias):
        """The weight pass: its partial sums; forward and data gradient: the permuted weights that the
        channel-sliced kernels read (none otherwise)."""
        if pass_ == "backward_weight":
            return (workspace_count(prob, self.tile, has_bias) * prob.itemsize,)
        n = weight_scratch_count(prob, self.tile, pass_)
        return (n * prob.itemsize,) if n else ()

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        """``y = conv(x, w) (+ bias)`` over the whole batch, in one launch (two for the sliced kernels,
        which first permute the weights into ``ws[0]``)."""
        tile = self.tile
        epilogue = epilogue_flags(bias, relu)
        if sliced(prob, tile, "forward"):
            scratch = ws[0] if ws else None
            _permute(prob, "forward", w, scratch)
            w = scratch
            _sliced_launch(prob, tile, "forward", prob.num * prob.out_plane, prob.mg, x, w, bias or w, epilogue, y)
            return
        _gather_launch(prob, tile, "forward", prob.num * prob.out_plane, prob.mg, tiling.forward_table,
                       x, w, bias or w, epilogue, y)

    def backward_data(self, prob, w, dy, dx, ws):
        """``dx = conv_transpose(dy, w)`` (assigned), in one launch (two for the sliced kernels, see
        :meth:`forward`)."""
        tile = self.tile
        if sliced(prob, tile, "backward_data"):
            scratch = ws[0] if ws else None
            _permute(prob, "backward_data", w, scratch)
            w = scratch
            _sliced_launch(prob, tile, "backward_data", prob.num * prob.in_plane, prob.cg, w, dy, dx)
            return
        _gather_launch(prob, tile, "backward_data", prob.num * prob.in_plane, prob.cg, tiling.backward_data_table,
                       w, dy, dx)

    def backward_weight(self, prob, x, dy, dw, db, ws):
        """``dw += dL/dw`` and, when ``db`` is given, ``db += dL/db`` (a column of ones in the same
        GEMM; the sliced kernels leave it to ``channel_sum``); ``ws[0]`` holds at least
        :func:`workspace_count` elements. Deterministic: split-K partial sums, then
        ``ig_reduce_weight`` adds them in a fixed order."""
        tile, workspace = self.tile, ws[0]
        is_sliced = sliced(prob, tile, "backward_weight")
        has_bias = int(db is not None and not is_sliced)
        key = ("tc_backward_weight", tile, has_bias)
        plan = prob.cache.get(key)
        if plan is None:
            bm, bn = tile_shape(tile)
            splits, chunk = _weight_splits(prob, tile, bool(has_bias))
            cols = prob.kg + has_bias
            grid = (-(-cols // bn), -(-prob.mg // bm), prob.group * splits)
            reduce = tiling.reduce_plan(prob, splits, has_bias)
            if is_sliced:  # arguments: x, dy, ws, splits, chunk
                k, nbytes = _sliced_kernel(f"tcs_backward_weight_{tile}", tile, prob, True)
                plan = WeightLaunch(k, grid, splits, chunk, reduce, shared=nbytes)
            else:  # x, dy, offset table, ws, splits, chunk, has_bias
                k = backend.kernel(KERNELS, f"tc_backward_weight_{tile}", prob.np_dtype)
                plan = WeightLaunch(k, grid, splits, chunk, reduce, table=(tiling.forward_table(prob),),
                                    flags=(has_bias,))
            prob.cache[key] = plan
            k.check_args(x, dy, *plan.table, workspace, splits, chunk, *plan.flags, *prob.geometry_args)
            reduce.kernel.check_args(*reduce.args(prob, workspace, dw, db))
        nonnull(x, dy, dw, workspace)
        plan.kernel.launch(plan.grid, BLOCK, x, dy, *plan.table, workspace, plan.splits, plan.chunk, *plan.flags,
                           *prob.geometry_args, shared=plan.shared)
        plan.reduce.launch(prob, workspace, dw, db)
        if is_sliced and db is not None:  # db += dy summed over images and pixels
            bias_backward(prob, dy, db)
