"""Implicit-GEMM convolution on TF32 tensor cores (kernels in ``conv_tensorcore.cu``).

The three passes of :mod:`conv_implicit` (same GEMM views, offset tables, launch grids and
deterministic split-K weight gradient with its fixed-order reduction ``ig_reduce_weight``), with the
inner products on tensor cores: operands rounded to TF32 (10-bit mantissa), products accumulated in
fp32. Offered only for float32 when TF32 is allowed (``caffe.set_allow_tf32(True)``), so the default
stays exact fp32. Tile shapes are named ``"BMxBN"`` (:data:`TILES`); every pass has each.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import backend, blas
from . import conv_implicit as ig
from .conv_problem import ConvProblem, epilogue_flags

KERNELS = Path(__file__).with_name("conv_tensorcore.cu")
TILES = ("128x128", "64x128", "64x64")
BK = 16  # contraction slice per shared-memory stage (the kernels' template argument)
BLOCK = (256, 1, 1)
REQUIREMENT = "float32 with TF32 allowed (caffe.set_allow_tf32), compute capability 8.0+, " + ig.REQUIREMENT


def supports(prob: ConvProblem) -> bool:
    return (prob.np_dtype == np.float32 and blas.tf32_allowed() and ig.supports(prob)
            and backend.state().device.compute_capability() >= (8, 0))


def forward(prob: ConvProblem, tile: str, x: int, w: int, bias: int | None, y: int, relu: bool = False) -> None:
    """``y = conv(x, w) (+ bias)`` over the whole batch, in one launch."""
    epilogue = epilogue_flags(bias, relu)
    plan = prob.cache.get(("tc_forward", tile))
    if plan is None:
        bm, bn = ig.tile_shape(tile)
        k = backend.kernel(KERNELS, f"tc_forward_{tile}", prob.np_dtype)
        grid = (-(-prob.num * prob.out_plane // bn), -(-prob.mg // bm), prob.group)
        plan = prob.cache[("tc_forward", tile)] = (k, grid, ig.forward_table(prob))
        k.check_args(x, w, bias or w, epilogue, plan[2], y, *prob.geometry_args)
    k, grid, tab = plan
    ig.nonnull(x, w, y)
    k.launch(grid, BLOCK, x, w, bias or w, epilogue, tab, y, *prob.geometry_args)


def backward_data(prob: ConvProblem, tile: str, w: int, dy: int, dx: int) -> None:
    """``dx = conv_transpose(dy, w)`` (assigned), in one launch."""
    plan = prob.cache.get(("tc_backward_data", tile))
    if plan is None:
        bm, bn = ig.tile_shape(tile)
        k = backend.kernel(KERNELS, f"tc_backward_data_{tile}", prob.np_dtype)
        grid = (-(-prob.num * prob.in_plane // bn), -(-prob.cg // bm), prob.group)
        plan = prob.cache[("tc_backward_data", tile)] = (k, grid, ig.backward_data_table(prob))
        k.check_args(w, dy, plan[2], dx, *prob.geometry_args)
    k, grid, tab = plan
    ig.nonnull(w, dy, dx)
    k.launch(grid, BLOCK, w, dy, tab, dx, *prob.geometry_args)


def workspace_count(prob: ConvProblem, tile: str, has_bias: bool) -> int:
    """Elements of the partial-sum scratch :func:`backward_weight` needs."""
    splits, _ = ig.split_contraction(prob, *ig.tile_shape(tile), BK, has_bias)
    return prob.group * splits * prob.mg * (prob.kg + int(has_bias))


def backward_weight(prob: ConvProblem, tile: str, x: int, dy: int, dw: int, db: int | None, workspace: int) -> None:
    """``dw += dL/dw`` and, when ``db`` is given, ``db += dL/db`` (a column of ones in the same
    GEMM); ``workspace`` holds at least :func:`workspace_count` elements. Deterministic: split-K
    partial sums, then ``ig_reduce_weight`` adds them in a fixed order."""
    has_bias = int(db is not None)
    key = ("tc_backward_weight", tile, has_bias)
    plan = prob.cache.get(key)
    if plan is None:
        bm, bn = ig.tile_shape(tile)
        splits, chunk = ig.split_contraction(prob, bm, bn, BK, bool(has_bias))
        cols = prob.kg + has_bias
        k = backend.kernel(KERNELS, f"tc_backward_weight_{tile}", prob.np_dtype)
        grid = (-(-cols // bn), -(-prob.mg // bm), prob.group * splits)
        n = prob.group * prob.mg * cols
        r = backend.kernel(ig.KERNELS, "ig_reduce_weight", prob.np_dtype)
        rgrid = (min(-(-n // ig.THREADS), backend.MAX_BLOCKS), 1, 1)
        plan = prob.cache[key] = (k, grid, (ig.forward_table(prob), splits, chunk), r, rgrid, n)
        k.check_args(x, dy, plan[2][0], workspace, splits, chunk, has_bias, *prob.geometry_args)
        r.check_args(n, workspace, splits, prob.mg, prob.kg, has_bias, dw, db or dw)
    k, grid, (tab, splits, chunk), r, rgrid, n = plan
    ig.nonnull(x, dy, dw, workspace)
    k.launch(grid, BLOCK, x, dy, tab, workspace, splits, chunk, has_bias, *prob.geometry_args)
    r.launch(rgrid, ig.BLOCK, n, workspace, splits, prob.mg, prob.kg, has_bias, dw, db or dw)
