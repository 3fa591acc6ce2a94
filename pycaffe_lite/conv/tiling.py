"""Planning shared by the implicit-GEMM engines (:mod:`.implicit` and :mod:`.tensorcore`).

Both view a convolution pass as a GEMM per group (forward: ``y (M/G, N*Ho*Wo) = W . columns``; data
gradient: ``dx (C/G, N*H*W)``; weight gradient: ``dW (M/G, C/G*kh*kw [+1 for the bias])`` contracted
over ``N*Ho*Wo``) tiled in ``BM x BN`` blocks named ``"BMxBN"``. This module holds what they share:

- tile names (:func:`tile_shape`) and the int32 limit (:func:`fits_int32`);
- the per-geometry offset tables the gathering kernels read (:func:`forward_table`,
  :func:`backward_data_table`), built on the host once and kept on the device;
- the split of the weight gradient's contraction into whole waves of blocks (:func:`split_contraction`)
  and its fixed-order reduction ``ig_reduce_weight`` (in ``implicit.cu``, :func:`reduce_plan`);
- the launch plans (:class:`Launch`, :class:`WeightLaunch`, :class:`Reduce`): frozen dataclasses kept
  in :attr:`.ConvProblem.cache` per pass and tile, so a call after the first only launches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CudaError
from ..gpu import backend
from .problem import ConvProblem

REDUCE_KERNELS = Path(__file__).with_name("implicit.cu")  # ig_reduce_weight, shared by both engines
THREADS = 256
BLOCK = (THREADS, 1, 1)
BLOCK_OVERHEAD = 8  # a weight-gradient block's fixed cost (fill, epilogue, partial sums), in slices
REQUIREMENT = "input and output of at most 2**31-1 elements each (int32 indexing)"


def tile_shape(name: str) -> tuple[int, int]:
    """(BM, BN) of a tile named ``"BMxBN"``."""
    bm, bn = name.split("x")
    return int(bm), int(bn)


def fits_int32(prob: ConvProblem) -> bool:
    """Input and output index within int32 (:data:`REQUIREMENT`)."""
    return max(prob.num * prob.channels * prob.in_plane, prob.num * prob.num_output * prob.out_plane) \
        <= backend.INT32_MAX


def nonnull(*ptrs: int) -> None:
    if not all(ptrs):
        raise CudaError("implicit-GEMM convolution: a null device pointer was passed")


# -- offset tables ---------------------------------------------------------------------------------
def _upload_table(key: tuple, rows: np.ndarray) -> int:
    """The device copy of the int32 table ``rows``, uploaded once per key and kept (the one place
    the implicit-GEMM engines allocate device memory)."""
    tables = backend.device_cache("conv.offset_tables")
    have = tables.get(key)
    if have is None:
        table = np.ascontiguousarray(rows, dtype=np.int32)
        alloc = backend.alloc(max(table.nbytes, 16))
        backend.memcpy_htod(int(alloc), table)
        tables[key] = have = alloc
    return int(have)


def forward_table(prob: ConvProblem) -> int:
    """Device int4 per k = (c, i, j) of a group: (c*H*W + i*dh*W + j*dw, i*dh, j*dw, 0)."""
    key = ("fwd", prob.cg, prob.height, prob.width, prob.kernel, prob.dilation)
    if key in (tables := backend.device_cache("conv.offset_tables")):
        return int(tables[key])
    c, i, j = np.meshgrid(np.arange(prob.cg), np.arange(prob.kernel[0]), np.arange(prob.kernel[1]), indexing="ij")
    di, dj = i.ravel() * prob.dilation[0], j.ravel() * prob.dilation[1]
    rows = np.stack([c.ravel() * prob.in_plane + di * prob.width + dj, di, dj, np.zeros_like(di)], axis=1)
    return _upload_table(key, rows)


def backward_data_table(prob: ConvProblem) -> int:
    """Device int4 per kk = (m, i, j) of a group: (m*Kg + i*kw + j, m*Ho*Wo, i*dh, j*dw)."""
    key = ("bwd", prob.mg, prob.kg, prob.out_plane, prob.kernel, prob.dilation)
    if key in (tables := backend.device_cache("conv.offset_tables")):
        return int(tables[key])
    mg, ig, jg = np.meshgrid(np.arange(prob.mg), np.arange(prob.kernel[0]), np.arange(prob.kernel[1]), indexing="ij")
    m, i, j = mg.ravel(), ig.ravel(), jg.ravel()
    rows = np.stack([m * prob.kg + i * prob.kernel[1] + j, m * prob.out_plane,
                     i * prob.dilation[0], j * prob.dilation[1]], axis=1)
    return _upload_table(key, rows)


# -- the weight gradient's split contraction -----------------------------------------------------
def split_contraction(prob: ConvProblem, bm: int, bn: int, bk: int, has_bias: bool,
                      resident: int, columns: int = 0) -> tuple[int, int]:
    """(splits, chunk) for a weight-gradient kernel of ``bm x bn`` tiles over ``columns`` (default:
    the group's C*kh*kw), ``bk`` slices and ``resident`` blocks per multiprocessor: split s sums
    ``t`` in ``[s*chunk, (s+1)*chunk)`` of the ``num * Ho * Wo`` contraction. The count minimises whole waves times each block's slices (plus
    :data:`BLOCK_OVERHEAD`): a last wave that leaves most multiprocessors idle costs a full one. Of
    counts within 1 % of the least cost the smallest wins (fewer partial sums to write and reduce)."""
    tiles = -(-prob.mg // bm) * -(-((columns or prob.kg) + int(has_bias)) // bn) * prob.group
    slots = resident * backend.multiprocessor_count()
    slices = -(-prob.num * prob.out_plane // bk)
    cap = max(1, min(slices // 4, 65535 // prob.group, 4 * -(-slots // tiles)))

    costs = [-(-tiles * s // slots) * (-(-slices // s) + BLOCK_OVERHEAD) for s in range(1, cap + 1)]
    best = min(costs)
    splits = next(s for s, c in enumerate(costs, 1) if c <= 1.01 * best)
    chunk = -(-slices // splits) * bk
    return -(-prob.num * prob.out_plane // chunk), chunk


# -- launch plans ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """One GEMM kernel launch: ``kernel`` over ``grid`` with :data:`BLOCK`; ``table`` the device offset
    table it gathers through (0: none), ``shared`` its dynamic shared-memory bytes."""

    kernel: Any  # backend.Kernel
    grid: tuple[int, int, int]
    table: int = 0
    shared: int = 0


@dataclass(frozen=True)
class Reduce:
    """``ig_reduce_weight``: the fixed-order sum of ``splits`` partial weight gradients of ``count``
    elements (``has_bias``: each row's last column is the bias gradient)."""

    kernel: Any
    grid: tuple[int, int, int]
    count: int
    splits: int
    has_bias: int

    def args(self, prob: ConvProblem, workspace: int, dw: int, db: int | None) -> tuple[int, ...]:
        return (self.count, workspace, self.splits, prob.mg, prob.kg, self.has_bias, dw,
                db if self.has_bias and db is not None else dw)

    def launch(self, prob: ConvProblem, workspace: int, dw: int, db: int | None) -> None:
        """``dw += sum of the partial sums`` (and ``db`` when the plan has the bias column)."""
        self.kernel.launch(self.grid, BLOCK, *self.args(prob, workspace, dw, db))


@dataclass(frozen=True)
class WeightLaunch:
    """A split-K weight-gradient launch and its reduction: ``kernel`` over ``grid`` writes ``splits``
    partial sums of ``chunk`` contraction elements each into the workspace; ``table`` and ``flags`` are
    the kernel's optional arguments (offset table; bias flag), ``shared`` its dynamic shared memory."""

    kernel: Any
    grid: tuple[int, int, int]
    splits: int
    chunk: int
    reduce: Reduce
    table: tuple[int, ...] = ()
    flags: tuple[int, ...] = ()
    shared: int = 0


def reduce_plan(prob: ConvProblem, splits: int, has_bias: int) -> Reduce:
    """The :class:`Reduce` of a weight gradient split ``splits`` ways (``has_bias``: a bias column)."""
    n = prob.group * prob.mg * (prob.kg + has_bias)
    kernel = backend.kernel(REDUCE_KERNELS, "ig_reduce_weight", prob.np_dtype)
    return Reduce(kernel, (min(-(-n // THREADS), backend.MAX_BLOCKS), 1, 1), n, splits, has_bias)
