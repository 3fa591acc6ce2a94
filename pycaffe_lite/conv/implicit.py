"""The ``implicit-BMxBN`` convolution engines (kernels in ``implicit.cu``): im2col fused into a tiled GEMM.

Three passes, each one launch per call (the weight gradient adds a deterministic reduction): forward
(bias and ReLU in the epilogue), data gradient (assigns ``dx``) and weight gradient (accumulates ``dw``
and, in the same GEMM through a column of ones, ``db``). Tile shapes are named ``"BMxBN"``;
:data:`TILES` (forward and data gradient) and :data:`WEIGHT_TILES` list the compiled ones; one engine
is registered per forward tile. The planning shared with the tensor-core engines (offset tables,
split contraction, launch plans) is :mod:`.tiling`.
"""

from __future__ import annotations

from pathlib import Path

from ..gpu import backend
from . import tiling
from .problem import ConvProblem, epilogue_flags
from .registry import Engine, register_engine
from .tiling import BLOCK, Launch, WeightLaunch, nonnull, tile_shape

KERNELS = Path(__file__).with_name("implicit.cu")
THREADS = tiling.THREADS
TILES = ("128x128", "64x128", "32x64", "16x128", "32x32")  # forward and data gradient
WEIGHT_TILES = ("64x64", "32x32")  # weight gradient
_BK = {"128x128": 8, "64x128": 16, "32x64": 16, "16x128": 16, "64x64": 16, "32x32": 16}


def weight_splits(prob: ConvProblem, tile: str, has_bias: bool) -> tuple[int, int]:
    """(splits, chunk) of the contraction over ``num * Ho * Wo`` so the grid fills the device."""
    k = backend.kernel(KERNELS, f"ig_backward_weight_{tile}", prob.np_dtype)
    return tiling.split_contraction(prob, *tile_shape(tile), _BK[tile], has_bias, k.resident_blocks(THREADS))


def workspace_count(prob: ConvProblem, tile: str, has_bias: bool) -> int:
    """Elements of the partial-sum scratch the weight pass of ``tile`` needs."""
    key = ("ig_workspace", tile, has_bias)
    count = prob.cache.get(key)
    if count is None:
        splits, _ = weight_splits(prob, tile, has_bias)
        count = prob.cache[key] = prob.group * splits * prob.mg * (prob.kg + int(has_bias))
    return count


@register_engine("IMPLICIT_GEMM", order=10, summary="im2col fused into a tiled GEMM, one launch per pass "
                 "(the weight gradient split over the contraction, then summed in a fixed order)")
class ImplicitEngine(Engine):
    """The implicit GEMM with ``forward_tile`` / ``data_tile`` / ``weight_tile`` tiles."""

    requirement = tiling.REQUIREMENT

    def __init__(self, forward_tile: str = "64x128", data_tile: str = "64x128", weight_tile: str = "64x64") -> None:
        self.tiles = (forward_tile, data_tile, weight_tile)
        self.name = f"implicit-{forward_tile}" if len(set(self.tiles[:2])) == 1 else "implicit"

    @classmethod
    def variants(cls) -> tuple[Engine, ...]:
        """One per tile of :data:`TILES`; the larger weight tile goes with the larger forward tiles."""
        return tuple(cls(t, t, WEIGHT_TILES[0] if t in TILES[:2] else WEIGHT_TILES[1]) for t in TILES)

    def supports(self, prob):
        return tiling.fits_int32(prob)

    def scratch(self, prob, pass_, has_bias):
        if pass_ != "backward_weight":
            return ()
        return (workspace_count(prob, self.tiles[2], has_bias) * prob.itemsize,)

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        """``y = conv(x, w) (+ bias)``, then ReLU when ``relu``, over the whole batch in one launch."""
        tile = self.tiles[0]
        epilogue = epilogue_flags(bias, relu)
        plan = prob.cache.get(("ig_forward", tile))
        if plan is None:
            bm, bn = tile_shape(tile)
            k = backend.kernel(KERNELS, f"ig_forward_{tile}", prob.np_dtype)
            grid = ((prob.num * prob.out_plane + bn - 1) // bn, (prob.mg + bm - 1) // bm, prob.group)
            plan = prob.cache[("ig_forward", tile)] = Launch(k, grid, tiling.forward_table(prob))
            k.check_args(x, w, bias or w, epilogue, plan.table, y, *prob.geometry_args)
        nonnull(x, w, y)
        plan.kernel.launch(plan.grid, BLOCK, x, w, bias or w, epilogue, plan.table, y, *prob.geometry_args)

    def backward_data(self, prob, w, dy, dx, ws):
        """``dx = conv_transpose(dy, w)`` (assigned), in one launch."""
        tile = self.tiles[1]
        plan = prob.cache.get(("ig_backward_data", tile))
        if plan is None:
            bm, bn = tile_shape(tile)
            k = backend.kernel(KERNELS, f"ig_backward_data_{tile}", prob.np_dtype)
            grid = ((prob.num * prob.in_plane + bn - 1) // bn, (prob.cg + bm - 1) // bm, prob.group)
            plan = prob.cache[("ig_backward_data", tile)] = Launch(k, grid, tiling.backward_data_table(prob))
            k.check_args(w, dy, plan.table, dx, *prob.geometry_args)
        nonnull(w, dy, dx)
        plan.kernel.launch(plan.grid, BLOCK, w, dy, plan.table, dx, *prob.geometry_args)

    def backward_weight(self, prob, x, dy, dw, db, ws):
        """``dw += dL/dw`` and, when ``db`` is given, ``db += dL/db``; ``ws[0]`` holds at least
        :func:`workspace_count` elements. Sums in a fixed order (deterministic)."""
        tile, workspace = self.tiles[2], ws[0]
        has_bias = int(db is not None)
        key = ("ig_backward_weight", tile, has_bias)
        plan = prob.cache.get(key)
        if plan is None:
            bm, bn = tile_shape(tile)
            splits, chunk = weight_splits(prob, tile, bool(has_bias))
            cols = prob.kg + has_bias
            k = backend.kernel(KERNELS, f"ig_backward_weight_{tile}", prob.np_dtype)
            grid = ((cols + bn - 1) // bn, (prob.mg + bm - 1) // bm, prob.group * splits)
            plan = prob.cache[key] = WeightLaunch(k, grid, splits, chunk, tiling.reduce_plan(prob, splits, has_bias),
                                                  table=(tiling.forward_table(prob),), flags=(has_bias,))
            k.check_args(x, dy, *plan.table, workspace, splits, chunk, *plan.flags, *prob.geometry_args)
            plan.reduce.kernel.check_args(*plan.reduce.args(prob, workspace, dw, db))
        nonnull(x, dy, dw, workspace)
        plan.kernel.launch(plan.grid, BLOCK, x, dy, *plan.table, workspace, plan.splits, plan.chunk, *plan.flags,
                           *prob.geometry_args)
        plan.reduce.launch(prob, workspace, dw, db)
