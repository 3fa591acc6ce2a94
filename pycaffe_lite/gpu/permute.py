"""Axis permutations on the GPU: ``dst = src.transpose(order)`` of a C-contiguous ``src`` of
``shape`` into a C-contiguous ``dst`` (Permute, Transpose, ShuffleChannel). Every element is
written once (a bijection, no accumulation); the gradient is the inverse plan
(:meth:`Plan.inverse`) run from the top diff into the bottom diff.

:func:`plan` works on the host, once per (shape, order) (cached), and needs no GPU:

1. :func:`collapse`: size-1 axes are dropped, and dst-neighbouring axes that are also src
   neighbours in the same order merge (NCHW -> NHWC is (N, C, HW) -> (N, HW, C)). One axis left
   (or none): the permutation is a copy.
2. If the innermost dst axis is also innermost in src, dst is made of contiguous runs of src:
   ``permute_gather`` (permute.cu) writes dst in order, each unit's src offset from the unit's
   digits in the radix of the dst axes (magic-number divisions: :func:`magic`), 4 elements a
   unit when the run length and the pointers allow (ShuffleChannel: whole channel planes).
3. Else the innermost dst axis ``t`` and the innermost src axis ``i`` span a (t, i) plane that
   ``permute_tiles`` moves in 2^a x 2^b tiles through shared memory (:func:`choose_tile`: at most
   2048 elements, sides of at least 32 where the axis is that long), reading along i and writing
   along t, both coalesced; the other axes are the tile's batch, decoded once per block. Planes
   whose best tile is under 512 elements go to ``permute_gather`` (one element a unit) instead.
   Before either: 2 or 3 axes (batch, i, t) with a side of the plane of at most NARROW elements
   (NCHW <-> NHWC with few channels) take ``permute_narrow_t`` / ``_i`` (:func:`_narrow`): a warp
   per 32 positions of the long side, so the small planes still fill the GPU. When both sides are
   multiples of 4 (and the strides and pointers allow), ``permute_quads`` (:func:`_quads`) runs
   instead: a thread moves a 4 x 4 block with four 4-wide loads and four 4-wide stores.

The kernels decode at most 5 axes (gather) or 4 batch axes (tiles); more that do not collapse are
handled by one launch per index of the outermost ones. Launch arguments are plain ints fixed by
the plan, so calls are capturable in CUDA graphs (no device tables, reads or allocations).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import backend

KERNELS = Path(__file__).with_suffix(".cu")
THREADS = 256  # PERMUTE_THREADS in permute.cu
TILE = 2048  # PERMUTE_TILE: elements of a full tile
SMEM = TILE + TILE // 2  # PERMUTE_SMEM: shared elements (tile rows x pitch)
GATHER_ITEMS = 4  # PERMUTE_GATHER_ITEMS: units a thread loads before it stores
GATHER_AXES = 5  # axes permute_gather decodes
BATCH_AXES = 4  # batch axes permute_tiles decodes
MIN_TILE = TILE // 4  # smaller planes are gathered
MAX_BLOCKS = 65535 * 4  # backend.MAX_BLOCKS: the cap of a grid-stride launch
INT32_MAX = 2**31 - 1
BLOCK_COST = 256  # choose_tile: a block's overhead, in elements of tile area
NARROW = 32  # PERMUTE_NARROW: planes with a side this short or shorter take permute_narrow_*
NARROW_THREADS = 64  # permute_narrow_* block size (at most PERMUTE_NARROW_WARPS warps; 64 timed best)
QUAD_THREADS = 64  # permute_quads block size (at most PERMUTE_QUAD_THREADS; 64 timed best of 64-256)


@dataclass(frozen=True)
class Axis:
    """One axis of a collapsed permutation: its size and its strides in src and dst (elements)."""

    size: int
    src: int
    dst: int


def _check(shape: Sequence[int], order: Sequence[int]) -> None:
    if sorted(order) != list(range(len(shape))):
        raise ValueError(f"order {list(order)} is not a permutation of the {len(shape)} axes of shape {tuple(shape)}")
    if any(d < 0 for d in shape):
        raise ValueError(f"negative size in shape {tuple(shape)}")


def collapse(shape: Sequence[int], order: Sequence[int]) -> tuple[Axis, ...]:
    """The axes of ``src.transpose(order)`` in dst order, outermost first: size-1 axes dropped,
    neighbours that are src neighbours in the same order merged; dst strides are contiguous."""
    _check(shape, order)
    src_strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    merged: list[list[int]] = []  # [size, src stride]
    for o in order:
        if shape[o] == 1:
            continue
        if merged and merged[-1][1] == shape[o] * src_strides[o]:
            merged[-1] = [merged[-1][0] * shape[o], src_strides[o]]
        else:
            merged.append([shape[o], src_strides[o]])
    out: list[Axis] = []
    stride = 1
    for size, src in reversed(merged):
        out.append(Axis(size, src, stride))
        stride *= size
    return tuple(reversed(out))


def magic(d: int) -> tuple[int, int]:
    """(magic, shift) with ``n // d == (umulhi(n, magic) + n) >> shift`` for 0 <= n < 2^31, as
    permute.cu's ``fast_div`` computes it (umulhi: the high 32 bits of the 64-bit product)."""
    if not 1 <= d <= INT32_MAX:
        raise ValueError(f"divisor {d} out of range")
    shift = (d - 1).bit_length()
    return ((1 << 32) * ((1 << shift) - d)) // d + 1, shift


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def pitch(lgt: int, lgi: int) -> int:
    """Shared-memory row length of a 2^lgt x 2^lgi tile: a warp reading a column (one i, 32
    consecutive t, or 32 / 2^lgt t's of as many i's) hits 32 distinct banks."""
    tt, ti = 1 << lgt, 1 << lgi
    return ti + 1 if tt >= 32 else ti + 32 // tt


def choose_tile(nt: int, ni: int) -> tuple[int, int]:
    """(lgt, lgi) of the tile of the (nt, ni) plane: powers of two, at most TILE elements, each side
    at least 32 (or the axis rounded up to a power of two, when shorter), at most that rounding;
    the least padded area plus BLOCK_COST per block, then the squarer tile."""
    best: tuple[tuple[int, int], tuple[int, int]] | None = None
    pt, pi = _pow2(nt), _pow2(ni)
    for lgt in range(min(pt, 32).bit_length() - 1, pt.bit_length()):
        for lgi in range(min(pi, 32).bit_length() - 1, pi.bit_length()):
            if (1 << (lgt + lgi)) > TILE:
                continue
            tiles = -(-nt >> lgt) * -(-ni >> lgi)
            key = (tiles * ((1 << (lgt + lgi)) + BLOCK_COST), abs(lgt - lgi))
            if best is None or key < best[0]:
                best = (key, (lgt, lgi))
    assert best is not None
    return best[1]


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``kernel(*head, src + src_off, dst + dst_off, *tail)`` (offsets in
    elements) over ``grid`` blocks of THREADS threads."""

    kernel: str
    src_off: int
    dst_off: int
    head: tuple[int, ...]
    tail: tuple[int, ...]
    grid: int
    block: int = THREADS


def _outer_offsets(outer: Sequence[Axis], scale: int = 1) -> list[tuple[int, int]]:
    """(src, dst) offsets, in units of ``scale`` elements, of every index of the ``outer`` axes."""
    offs = []
    for idx in itertools.product(*(range(a.size) for a in outer)):
        offs.append((sum(i * a.src for i, a in zip(idx, outer)) // scale,
                     sum(i * a.dst for i, a in zip(idx, outer)) // scale))
    return offs


def _gather(axes: Sequence[Axis], w: int) -> tuple[Launch, ...]:
    """permute_gather_v{w} launches: the last GATHER_AXES axes in the kernel, the rest on the host."""
    outer, inner = list(axes[:-GATHER_AXES]), list(axes[-GATHER_AXES:])
    # in units of w elements: w > 1 only for runs, where the last axis (src stride 1) is the run
    units = [Axis(a.size // w, 1, 1) if a.src == 1 and w > 1 else Axis(a.size, a.src // w, a.dst // w)
             for a in inner]
    units = units[::-1] + [Axis(1, 0, 0)] * (GATHER_AXES - len(units))  # innermost first, padded
    n = math.prod(a.size for a in units)
    tail: list[int] = []
    for a in units[:-1]:
        tail += [a.size, *magic(a.size), a.src]
    tail.append(units[-1].src)
    grid = max(1, min(-(-n // (THREADS * GATHER_ITEMS)), MAX_BLOCKS))
    return tuple(Launch(f"permute_gather_v{w}", s * w, d * w, (n,), tuple(tail), grid)
                 for s, d in _outer_offsets(outer, w))


def _tiles(axes: Sequence[Axis], lgt: int, lgi: int) -> tuple[Launch, ...]:
    """permute_tiles launches: t = the last axis, i = the axis of src stride 1, up to BATCH_AXES
    others in the kernel (innermost dst first), the rest on the host."""
    t = axes[-1]
    i = next(a for a in axes if a.src == 1)
    batch = [a for a in axes[:-1] if a is not i]
    outer, inner = batch[:-BATCH_AXES] if len(batch) > BATCH_AXES else [], batch[-BATCH_AXES:]
    inner = inner[::-1] + [Axis(1, 0, 0)] * (BATCH_AXES - len(inner))
    tiles_i = -(-i.size >> lgi)
    tiles = tiles_i * -(-t.size >> lgt)
    tail = [t.size, i.size, t.src, i.dst, lgt, lgi, pitch(lgt, lgi), tiles_i, tiles]
    for a in inner[:-1]:
        tail += [a.size, a.src, a.dst]
    tail += [inner[-1].src, inner[-1].dst]
    blocks = tiles * math.prod(a.size for a in inner)
    if blocks > INT32_MAX:
        raise ValueError(f"permutation too large: {blocks} blocks")
    return tuple(Launch("permute_tiles", s, d, (), tuple(tail), blocks) for s, d in _outer_offsets(outer))


def _narrow(axes: Sequence[Axis]) -> tuple[Launch, ...]:
    """permute_narrow_t / _i launch for 2 or 3 axes (batch, i, t) whose (t, i) plane has a side of
    at most NARROW elements (t: dst stride 1; i: src stride 1, the next dst axis out); () if the
    permutation is not of that form."""
    if len(axes) not in (2, 3):
        return ()
    i, t = axes[-2], axes[-1]
    b = axes[0] if len(axes) == 3 else Axis(1, 0, 0)
    if i.src != 1 or t.dst != 1:
        return ()
    if t.size <= NARROW:  # i.dst == t.size: a warp's outputs are one run
        kernel, long, short_stride = "permute_narrow_t", i.size, t.src
    elif i.size <= NARROW and t.src == i.size:  # a warp's inputs are one run
        kernel, long, short_stride = "permute_narrow_i", t.size, i.dst
    else:
        return ()
    wpp = -(-long // 32)
    warps = wpp * b.size
    if warps > INT32_MAX:
        raise ValueError(f"permutation too large: {warps} warps")
    per_block = NARROW_THREADS // 32
    return (Launch(kernel, 0, 0, (warps,), (i.size, t.size, short_stride, wpp, b.src, b.dst),
                   -(-warps // per_block), NARROW_THREADS),)


def _quads(axes: Sequence[Axis]) -> tuple[Launch, ...]:
    """The permute_quads launch of a narrow plan's axes (batch, i, t) when both plane sides are
    multiples of 4 and every stride keeps 4-element units aligned; () otherwise."""
    i, t = axes[-2], axes[-1]
    b = axes[0] if len(axes) == 3 else Axis(1, 0, 0)
    if any(v % 4 for v in (t.size, i.size, t.src, i.dst, b.src, b.dst)):
        return ()
    ntq, niq = t.size // 4, i.size // 4
    t_fast = t.size <= i.size  # the short side's quads fastest
    nfast, nslow = (ntq, niq) if t_fast else (niq, ntq)
    n = b.size * ntq * niq
    grid = max(1, min(-(-n // QUAD_THREADS), MAX_BLOCKS))
    return (Launch("permute_quads", 0, 0, (n,), (nfast, nslow, int(t_fast), t.src, i.dst, b.src, b.dst),
                   grid, QUAD_THREADS),)


@dataclass(frozen=True)
class Plan:
    """How ``dst = src.transpose(order)`` runs for src of ``shape``; call it with device pointers.

    ``kind``: "empty" (no elements), "copy", "runs" (contiguous runs: gather, ``vector`` holds the
    4-wide launches when the run length allows), "gather" (small planes), "narrow" (a side of at
    most NARROW; ``vector``: permute_quads when the sides are multiples of 4) or "tiles". The
    ``vector`` launches run when both pointers are aligned to 4 elements."""

    shape: tuple[int, ...]
    order: tuple[int, ...]
    axes: tuple[Axis, ...]
    kind: str
    launches: tuple[Launch, ...] = ()
    vector: tuple[Launch, ...] = ()
    tile: tuple[int, int] | None = None  # (lgt, lgi) of "tiles"

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def top_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[o] for o in self.order)

    def inverse(self) -> Plan:
        """The plan of the inverse permutation (dst of this shape back to src): the gradient."""
        return plan(self.top_shape, tuple(int(k) for k in np.argsort(self.order)))

    def __call__(self, src: int, dst: int, dtype) -> None:
        """Queue ``dst = src.transpose(order)`` (device pointers, ``dtype`` float32/float64)."""
        if self.kind == "empty":
            return
        size = np.dtype(dtype).itemsize
        if self.kind == "copy":
            if src != dst:
                backend.memcpy_dtod(dst, src, self.count * size)
            return
        launches = self.launches
        if self.vector and int(src) % (4 * size) == 0 and int(dst) % (4 * size) == 0:
            launches = self.vector
        for ln in launches:
            backend.kernel(KERNELS, ln.kernel, dtype)(*ln.head, src + ln.src_off * size, dst + ln.dst_off * size,
                                                      *ln.tail, grid=(ln.grid, 1, 1), block=ln.block)


@functools.lru_cache(maxsize=512)
def _plan(shape: tuple[int, ...], order: tuple[int, ...]) -> Plan:
    axes = collapse(shape, order)
    count = math.prod(shape)
    if count == 0:
        return Plan(shape, order, axes, "empty")
    if count + GATHER_ITEMS * THREADS * MAX_BLOCKS > INT32_MAX:
        raise ValueError(f"permutation of {count} elements exceeds the kernels' int32 indexing")
    if len(axes) <= 1:
        return Plan(shape, order, axes, "copy")
    if axes[-1].src == 1:
        run = axes[-1].size
        return Plan(shape, order, axes, "runs", _gather(axes, 1), _gather(axes, 4) if run % 4 == 0 else ())
    i = next(a for a in axes if a.src == 1)
    lgt, lgi = choose_tile(axes[-1].size, i.size)
    narrow = _narrow(axes)
    if narrow:
        return Plan(shape, order, axes, "narrow", narrow, _quads(axes), tile=(lgt, lgi))
    if (1 << (lgt + lgi)) < MIN_TILE and len(axes) > 2:
        return Plan(shape, order, axes, "gather", _gather(axes, 1), tile=(lgt, lgi))
    return Plan(shape, order, axes, "tiles", _tiles(axes, lgt, lgi), tile=(lgt, lgi))


def plan(shape: Sequence[int], order: Sequence[int]) -> Plan:
    """The (cached) plan of ``dst = src.transpose(order)`` for src of ``shape`` (top axis k is src
    axis ``order[k]``). Raises ValueError when ``order`` is not a permutation of the axes."""
    return _plan(tuple(int(d) for d in shape), tuple(int(o) for o in order))
