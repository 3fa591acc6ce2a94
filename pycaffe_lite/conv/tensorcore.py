"""Implicit-GEMM convolution on TF32 tensor cores (kernels in ``conv_tensorcore.cu``).

The three passes of :mod:`conv_implicit` (same GEMM views, offset tables, launch grids and
deterministic split-K weight gradient with its fixed-order reduction ``ig_reduce_weight``), with the
inner products on tensor cores: operands rounded to TF32 (10-bit mantissa), products accumulated in
fp32. Offered only for float32 when TF32 is allowed (``caffe.set_allow_tf32(True)``), so the default
stays exact fp32. Tile shapes are named ``"BMxBN"`` (:data:`TILES`); every pass has each.

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
from ..gpu import math_functions as gm
from ..gpu.backend import CudaError
from . import implicit as ig
from .problem import ConvProblem, epilogue_flags

KERNELS = Path(__file__).with_name("tensorcore.cu")
TILES = ("128x128", "64x128", "64x64")
BK = 16  # contraction slice per shared-memory stage (the kernels' template argument)
BLOCK = (256, 1, 1)
SLICE, STAGES = 32, 3  # the channel-sliced kernels' TCS_BK and TCS_STAGES
REQUIREMENT = "float32 with TF32 allowed (caffe.set_allow_tf32), compute capability 8.0+, " + ig.REQUIREMENT


def supports(prob: ConvProblem) -> bool:
    return (prob.np_dtype == np.float32 and blas.tf32_allowed() and ig.supports(prob)
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
    return prob.cg % (ig.tile_shape(tile)[1] // 8) == 0


def _sliced_kernel(name: str, tile: str, prob: ConvProblem, b_kfast: bool):
    """The ``tcs_`` kernel ``name``, allowed the dynamic shared memory its stages take; (kernel, bytes)."""
    bm, bn = ig.tile_shape(tile)
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
        bm, bn = ig.tile_shape(tile)
        k, nbytes = _sliced_kernel(f"tcs_{pass_}_{tile}", tile, prob, False)
        plan = prob.cache[("tcs", pass_, tile)] = (k, (-(-cols // bn), -(-rows // bm), prob.group), nbytes)
        k.check_args(*args, *prob.geometry_args)
    k, grid, nbytes = plan
    ig.nonnull(*args[:2], args[-1])
    k.launch(grid, BLOCK, *args, *prob.geometry_args, shared=nbytes)


def _gather_launch(prob: ConvProblem, tile: str, pass_: str, cols: int, rows: int,
                   table: Callable[[ConvProblem], int], *args: int) -> None:
    """Launch ``tc_<pass_>_<tile>`` (the kernels that gather through ``conv_implicit``'s offset
    table ``table(prob)``, passed just before the output pointer, the last of ``args``) over a
    ``rows x cols`` output per group."""
    plan = prob.cache.get(("tc", pass_, tile))
    if plan is None:
        bm, bn = ig.tile_shape(tile)
        k = backend.kernel(KERNELS, f"tc_{pass_}_{tile}", prob.np_dtype)
        plan = prob.cache[("tc", pass_, tile)] = (k, (-(-cols // bn), -(-rows // bm), prob.group), table(prob))
        k.check_args(*args[:-1], plan[2], args[-1], *prob.geometry_args)
    k, grid, tab = plan
    ig.nonnull(*args[:2], args[-1])
    k.launch(grid, BLOCK, *args[:-1], tab, args[-1], *prob.geometry_args)


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


def forward(prob: ConvProblem, tile: str, x: int, w: int, bias: int | None, y: int, relu: bool = False,
            scratch: int | None = None) -> None:
    """``y = conv(x, w) (+ bias)`` over the whole batch, in one launch (two for the sliced kernels,
    which first permute the weights into ``scratch`` of :func:`weight_scratch_count` elements)."""
    epilogue = epilogue_flags(bias, relu)
    if sliced(prob, tile, "forward"):
        _permute(prob, "forward", w, scratch)
        w = scratch  # type: ignore[assignment]
        _sliced_launch(prob, tile, "forward", prob.num * prob.out_plane, prob.mg, x, w, bias or w, epilogue, y)
        return
    _gather_launch(prob, tile, "forward", prob.num * prob.out_plane, prob.mg, ig.forward_table,
                   x, w, bias or w, epilogue, y)


def backward_data(prob: ConvProblem, tile: str, w: int, dy: int, dx: int, scratch: int | None = None) -> None:
    """``dx = conv_transpose(dy, w)`` (assigned), in one launch (two for the sliced kernels, see
    :func:`forward`)."""
    if sliced(prob, tile, "backward_data"):
        _permute(prob, "backward_data", w, scratch)
        w = scratch  # type: ignore[assignment]
        _sliced_launch(prob, tile, "backward_data", prob.num * prob.in_plane, prob.cg, w, dy, dx)
        return
    _gather_launch(prob, tile, "backward_data", prob.num * prob.in_plane, prob.cg, ig.backward_data_table,
                   w, dy, dx)


def _weight_splits(prob: ConvProblem, tile: str, has_bias: bool) -> tuple[int, int]:
    """(splits, chunk) of the weight gradient's contraction for ``tile`` (ig.split_contraction)."""
    bm, bn = ig.tile_shape(tile)
    if sliced(prob, tile, "backward_weight"):
        k, nbytes = _sliced_kernel(f"tcs_backward_weight_{tile}", tile, prob, True)
        return ig.split_contraction(prob, bm, bn, SLICE, False, k.resident_blocks(BLOCK[0], nbytes))
    k = backend.kernel(KERNELS, f"tc_backward_weight_{tile}", prob.np_dtype)
    return ig.split_contraction(prob, bm, bn, BK, has_bias, k.resident_blocks(BLOCK[0]))


def workspace_count(prob: ConvProblem, tile: str, has_bias: bool) -> int:
    """Elements of the partial-sum scratch :func:`backward_weight` needs."""
    splits, _ = _weight_splits(prob, tile, has_bias)
    cols = prob.kg if sliced(prob, tile, "backward_weight") else prob.kg + int(has_bias)
    return prob.group * splits * prob.mg * cols


def backward_weight(prob: ConvProblem, tile: str, x: int, dy: int, dw: int, db: int | None, workspace: int) -> None:
    """``dw += dL/dw`` and, when ``db`` is given, ``db += dL/db`` (a column of ones in the same
    GEMM; the sliced kernels leave it to ``channel_sum``); ``workspace`` holds at least
    :func:`workspace_count` elements. Deterministic: split-K partial sums, then ``ig_reduce_weight``
    adds them in a fixed order."""
    is_sliced = sliced(prob, tile, "backward_weight")
    has_bias = int(db is not None and not is_sliced)
    key = ("tc_backward_weight", tile, has_bias)
    plan = prob.cache.get(key)
    if plan is None:
        bm, bn = ig.tile_shape(tile)
        splits, chunk = _weight_splits(prob, tile, bool(has_bias))
        cols = prob.kg + has_bias
        table: tuple[int, ...]
        flags: tuple[int, ...]
        if is_sliced:  # arguments: x, dy, ws, splits, chunk
            k, nbytes = _sliced_kernel(f"tcs_backward_weight_{tile}", tile, prob, True)
            table, flags = (), ()
        else:  # x, dy, offset table, ws, splits, chunk, has_bias
            k, nbytes = backend.kernel(KERNELS, f"tc_backward_weight_{tile}", prob.np_dtype), 0
            table, flags = (ig.forward_table(prob),), (has_bias,)
        grid = (-(-cols // bn), -(-prob.mg // bm), prob.group * splits)
        n = prob.group * prob.mg * cols
        r = backend.kernel(ig.KERNELS, "ig_reduce_weight", prob.np_dtype)
        rgrid = (min(-(-n // ig.THREADS), backend.MAX_BLOCKS), 1, 1)
        plan = prob.cache[key] = (k, grid, nbytes, table, flags, splits, chunk, r, rgrid, n)
        k.check_args(x, dy, *table, workspace, splits, chunk, *flags, *prob.geometry_args)
        r.check_args(n, workspace, splits, prob.mg, prob.kg, has_bias, dw, dw)
    k, grid, nbytes, table, flags, splits, chunk, r, rgrid, n = plan
    ig.nonnull(x, dy, dw, workspace)
    k.launch(grid, BLOCK, x, dy, *table, workspace, splits, chunk, *flags, *prob.geometry_args, shared=nbytes)
    r.launch(rgrid, ig.BLOCK, n, workspace, splits, prob.mg, prob.kg, has_bias, dw, db if has_bias else dw)
    if is_sliced and db is not None:  # db += dy summed over images and pixels
        gm.channel_sum(prob.num, prob.num_output, prob.out_plane, dy, db, prob.np_dtype, beta=1.0)
