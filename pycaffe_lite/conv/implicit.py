"""Implicit-GEMM convolution (kernels in ``conv_implicit.cu``): im2col fused into a tiled GEMM.

Three passes, each one launch per call (the weight gradient adds a deterministic reduction):
:func:`forward` (bias added in the epilogue), :func:`backward_data` (assigns ``dx``) and
:func:`backward_weight` (accumulates ``dw`` and, in the same GEMM through a column of ones,
``db``). Tile shapes are named ``"BMxBN"``; :data:`TILES` and :data:`WEIGHT_TILES` list the compiled ones.
Per-geometry offset tables (int4 per GEMM contraction index) are built on the host once and kept
on the device.
"""

from __future__ import annotations

from pathlib import Path
from typing import SupportsInt

import numpy as np

from ..errors import CudaError
from ..gpu import backend
from .problem import ConvProblem, epilogue_flags

KERNELS = Path(__file__).with_name("implicit.cu")
THREADS = 256
TILES = ("128x128", "64x128", "32x64", "16x128", "32x32")  # forward and data gradient
WEIGHT_TILES = ("64x64", "32x32")  # weight gradient
BLOCK_OVERHEAD = 8  # a weight-gradient block's fixed cost (fill, epilogue, partial sums), in slices
_BK = {"128x128": 8, "64x128": 16, "32x64": 16, "16x128": 16, "64x64": 16, "32x32": 16}
_tables: dict[tuple, SupportsInt] = {}


def tile_shape(name: str) -> tuple[int, int]:
    """(BM, BN) of a tile named ``"BMxBN"``."""
    bm, bn = name.split("x")
    return int(bm), int(bn)


REQUIREMENT = "input and output of at most 2**31-1 elements each (int32 indexing)"


def supports(prob: ConvProblem) -> bool:
    return max(prob.num * prob.channels * prob.in_plane, prob.num * prob.num_output * prob.out_plane) \
        <= backend.INT32_MAX


def _upload_table(key: tuple, rows: np.ndarray) -> int:
    """The device copy of the int32 table ``rows``, uploaded once per key and kept (the one place
    this module allocates device memory)."""
    have = _tables.get(key)
    if have is None:
        table = np.ascontiguousarray(rows, dtype=np.int32)
        alloc = backend.alloc(max(table.nbytes, 16))
        backend.memcpy_htod(int(alloc), table)
        _tables[key] = have = alloc
    return int(have)


def forward_table(prob: ConvProblem) -> int:
    """Device int4 per k = (c, i, j) of a group: (c*H*W + i*dh*W + j*dw, i*dh, j*dw, 0)."""
    key = ("fwd", backend.state().device_id, prob.cg, prob.height, prob.width, prob.kernel, prob.dilation)
    if key in _tables:
        return int(_tables[key])
    c, i, j = np.meshgrid(np.arange(prob.cg), np.arange(prob.kernel[0]), np.arange(prob.kernel[1]), indexing="ij")
    di, dj = i.ravel() * prob.dilation[0], j.ravel() * prob.dilation[1]
    rows = np.stack([c.ravel() * prob.in_plane + di * prob.width + dj, di, dj, np.zeros_like(di)], axis=1)
    return _upload_table(key, rows)


def backward_data_table(prob: ConvProblem) -> int:
    """Device int4 per kk = (m, i, j) of a group: (m*Kg + i*kw + j, m*Ho*Wo, i*dh, j*dw)."""
    key = ("bwd", backend.state().device_id, prob.mg, prob.kg, prob.out_plane, prob.kernel, prob.dilation)
    if key in _tables:
        return int(_tables[key])
    mg, ig, jg = np.meshgrid(np.arange(prob.mg), np.arange(prob.kernel[0]), np.arange(prob.kernel[1]), indexing="ij")
    m, i, j = mg.ravel(), ig.ravel(), jg.ravel()
    rows = np.stack([m * prob.kg + i * prob.kernel[1] + j, m * prob.out_plane,
                     i * prob.dilation[0], j * prob.dilation[1]], axis=1)
    return _upload_table(key, rows)


BLOCK = (THREADS, 1, 1)


def nonnull(*ptrs: int) -> None:
    if not all(ptrs):
        raise CudaError("implicit-GEMM convolution: a null device pointer was passed")


def forward(prob: ConvProblem, tile: str, x: int, w: int, bias: int | None, y: int, relu: bool = False) -> None:
    """``y = conv(x, w) (+ bias)``, then ReLU when ``relu``, over the whole batch in one launch."""
    epilogue = epilogue_flags(bias, relu)
    plan = prob.cache.get(("ig_forward", tile))
    if plan is None:
        bm, bn = tile_shape(tile)
        k = backend.kernel(KERNELS, f"ig_forward_{tile}", prob.np_dtype)
        grid = ((prob.num * prob.out_plane + bn - 1) // bn, (prob.mg + bm - 1) // bm, prob.group)
        plan = prob.cache[("ig_forward", tile)] = (k, grid, forward_table(prob))
        k.check_args(x, w, bias or w, epilogue, plan[2], y, *prob.geometry_args)
    k, grid, tab = plan
    nonnull(x, w, y)
    k.launch(grid, BLOCK, x, w, bias or w, epilogue, tab, y, *prob.geometry_args)


def backward_data(prob: ConvProblem, tile: str, w: int, dy: int, dx: int) -> None:
    """``dx = conv_transpose(dy, w)`` (assigned), in one launch."""
    plan = prob.cache.get(("ig_backward_data", tile))
    if plan is None:
        bm, bn = tile_shape(tile)
        k = backend.kernel(KERNELS, f"ig_backward_data_{tile}", prob.np_dtype)
        grid = ((prob.num * prob.in_plane + bn - 1) // bn, (prob.cg + bm - 1) // bm, prob.group)
        plan = prob.cache[("ig_backward_data", tile)] = (k, grid, backward_data_table(prob))
        k.check_args(w, dy, plan[2], dx, *prob.geometry_args)
    k, grid, tab = plan
    nonnull(w, dy, dx)
    k.launch(grid, BLOCK, w, dy, tab, dx, *prob.geometry_args)


def weight_splits(prob: ConvProblem, tile: str, has_bias: bool) -> tuple[int, int]:
    """(splits, chunk) of the contraction over ``num * Ho * Wo`` so the grid fills the device."""
    k = backend.kernel(KERNELS, f"ig_backward_weight_{tile}", prob.np_dtype)
    return split_contraction(prob, *tile_shape(tile), _BK[tile], has_bias, k.resident_blocks(THREADS))


def split_contraction(prob: ConvProblem, bm: int, bn: int, bk: int, has_bias: bool,
                      resident: int) -> tuple[int, int]:
    """(splits, chunk) for a weight-gradient kernel of ``bm x bn`` tiles, ``bk`` slices and
    ``resident`` blocks per multiprocessor: split s sums ``t`` in ``[s*chunk, (s+1)*chunk)`` of the
    ``num * Ho * Wo`` contraction. The count minimises whole waves times each block's slices (plus
    :data:`BLOCK_OVERHEAD`): a last wave that leaves most multiprocessors idle costs a full one. Of
    counts within 1 % of the least cost the smallest wins (fewer partial sums to write and reduce)."""
    tiles = -(-prob.mg // bm) * -(-(prob.kg + int(has_bias)) // bn) * prob.group
    slots = resident * backend.multiprocessor_count()
    slices = -(-prob.num * prob.out_plane // bk)
    cap = max(1, min(slices // 4, 65535 // prob.group, 4 * -(-slots // tiles)))

    costs = [-(-tiles * s // slots) * (-(-slices // s) + BLOCK_OVERHEAD) for s in range(1, cap + 1)]
    best = min(costs)
    splits = next(s for s, c in enumerate(costs, 1) if c <= 1.01 * best)
    chunk = -(-slices // splits) * bk
    return -(-prob.num * prob.out_plane // chunk), chunk


def workspace_count(prob: ConvProblem, tile: str, has_bias: bool) -> int:
    """Elements of the partial-sum scratch :func:`backward_weight` needs."""
    key = ("ig_workspace", tile, has_bias)
    count = prob.cache.get(key)
    if count is None:
        splits, _ = weight_splits(prob, tile, has_bias)
        count = prob.cache[key] = prob.group * splits * prob.mg * (prob.kg + int(has_bias))
    return count


def backward_weight(prob: ConvProblem, tile: str, x: int, dy: int, dw: int, db: int | None, workspace: int) -> None:
    """``dw += dL/dw`` and, when ``db`` is given, ``db += dL/db``; ``workspace`` (scratch from the
    shared device workspace) holds at least :func:`workspace_count` elements. Sums in a fixed order
    (deterministic)."""
    has_bias = int(db is not None)
    key = ("ig_backward_weight", tile, has_bias)
    plan = prob.cache.get(key)
    if plan is None:
        bm, bn = tile_shape(tile)
        splits, chunk = weight_splits(prob, tile, bool(has_bias))
        cols = prob.kg + has_bias
        k = backend.kernel(KERNELS, f"ig_backward_weight_{tile}", prob.np_dtype)
        grid = ((cols + bn - 1) // bn, (prob.mg + bm - 1) // bm, prob.group * splits)
        n = prob.group * prob.mg * cols
        r = backend.kernel(KERNELS, "ig_reduce_weight", prob.np_dtype)
        rgrid = (min((n + THREADS - 1) // THREADS, backend.MAX_BLOCKS), 1, 1)
        plan = prob.cache[key] = (k, grid, (forward_table(prob), splits, chunk, has_bias), r, rgrid,
                                  (splits, prob.mg, prob.kg, has_bias))
        k.check_args(x, dy, plan[2][0], workspace, splits, chunk, has_bias, *prob.geometry_args)
        r.check_args(n, workspace, splits, prob.mg, prob.kg, has_bias, dw, db or dw)
    k, grid, (tab, splits, chunk, _), r, rgrid, rargs = plan
    nonnull(x, dy, dw, workspace)
    k.launch(grid, BLOCK, x, dy, tab, workspace, splits, chunk, has_bias, *prob.geometry_args)
    n = prob.group * prob.mg * (prob.kg + has_bias)
    r.launch(rgrid, BLOCK, n, workspace, *rargs, dw, db or dw)
