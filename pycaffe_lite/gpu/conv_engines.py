"""GPU convolution engines and the per-shape autotune that picks one per pass.

Engines (each does the whole minibatch; groups in the same calls):

- ``gemm``: im2col into a column buffer (C*kh*kw, N, Ho*Wo), one cuBLAS strided-batched GEMM over
  the groups, an axis swap into (N, M, Ho*Wo). 1x1/stride-1/pad-0 convolutions skip im2col: one
  strided-batched GEMM over the images reads the input in place. Batches whose columns exceed
  :data:`COL_BUFFER_BYTES` run in chunks of images.
- ``implicit-BMxBN``: im2col fused into a tiled GEMM (``conv_implicit``), one launch per pass.
- ``winograd``: F(2x2, 3x3) for 3x3/stride-1 convolutions (``winograd``).

:func:`choose` times every engine that supports a :class:`ConvProblem` on scratch buffers, for
the forward, data-gradient and weight-gradient passes separately, and caches the fastest per
shape (cuDNN's "find" step). The layer's ``engine`` field narrows the candidates
(:data:`ENGINE_CANDIDATES`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from . import backend, blas, winograd
from . import conv_depthwise as depthwise  # engines-branch hook
from . import conv_direct as direct  # engines-branch hook
from . import conv_implicit as ig
from . import im2col as gpu_im2col
from . import math_functions as gm
from .conv_problem import ConvProblem

COL_BUFFER_BYTES = 256 << 20  # gemm engine column buffer budget; larger batches run in chunks
TUNE_REPS = 3

Buffer = Callable[[str, int], int]


class Engine:
    """One way to run the three passes. ``backward`` assigns ``dx`` and accumulates ``dw``/``db``;
    any of the three may be None (not computed)."""

    name = ""

    def supports(self, prob: ConvProblem) -> bool:
        return True

    def forward(self, prob: ConvProblem, x: int, w: int, bias: int | None, y: int, buffer: Buffer) -> None:
        raise NotImplementedError

    def backward(self, prob: ConvProblem, x: int, w: int, dy: int, dx: int | None, dw: int | None,
                 db: int | None, buffer: Buffer) -> None:
        raise NotImplementedError

    @staticmethod
    def bias_backward(prob: ConvProblem, dy: int, db: int) -> None:
        """``db += sum of dy over images and pixels`` (for engines whose weight pass does not fold it in)."""
        gm.channel_sum(prob.num, prob.num_output, prob.out_plane, dy, db, prob.np_dtype, beta=1.0)


class GemmEngine(Engine):
    name = "gemm"

    @staticmethod
    def _chunk(prob: ConvProblem) -> int:
        per_image = prob.channels * prob.khkw * prob.out_plane * prob.itemsize
        return max(1, min(prob.num, COL_BUFFER_BYTES // max(1, per_image)))

    def forward(self, prob, x, w, bias, y, buffer):
        dt, isz = prob.np_dtype, prob.itemsize
        mg, kg, p, m = prob.mg, prob.kg, prob.out_plane, prob.num_output
        chw = prob.channels * prob.in_plane
        if prob.is_1x1:  # y[n, g] (mg, P) = W[g] (mg, cg) . x[n, g] (cg, P), batched over images
            for g in range(prob.group):
                blas.gemm_strided_batched(False, False, mg, p, kg, 1.0, w + g * mg * kg * isz, 0,
                                          x + g * kg * p * isz, chw, 0.0, y + g * mg * p * isz, m * p, prob.num, dt)
        else:
            nmax = self._chunk(prob)
            col = buffer("col", prob.group * kg * nmax * p)
            yt = buffer("yt", m * nmax * p)
            for n0 in range(0, prob.num, nmax):
                nb = min(nmax, prob.num - n0)
                self._im2col(prob, x + n0 * chw * isz, nb, col)
                # yt[g] (mg, nb*P) = W[g] (mg, kg) . col[g] (kg, nb*P), for every group g
                blas.gemm_strided_batched(False, False, mg, nb * p, kg, 1.0, w, mg * kg, col, kg * nb * p,
                                          0.0, yt, mg * nb * p, prob.group, dt)
                gpu_im2col.swap_leading_axes(yt, m, nb, p, y + n0 * m * p * isz, dt)  # -> (nb, M, P)
        if bias is not None:
            gm.add_channel_bias(prob.num, m, p, bias, y, dt)

    @staticmethod
    def _im2col(prob: ConvProblem, x: int, nb: int, col: int) -> None:
        gpu_im2col.im2col(x, nb, prob.channels, (prob.height, prob.width), prob.kernel, prob.pad, prob.stride,
                          prob.dilation, col, prob.np_dtype)

    def backward(self, prob, x, w, dy, dx, dw, db, buffer):
        dt, isz = prob.np_dtype, prob.itemsize
        mg, kg, p, m = prob.mg, prob.kg, prob.out_plane, prob.num_output
        chw = prob.channels * prob.in_plane
        if db is not None:
            self.bias_backward(prob, dy, db)
        if dw is None and dx is None:
            return
        if prob.is_1x1:
            self._backward_1x1(prob, x, w, dy, dx, dw, buffer)
            return
        nmax = self._chunk(prob)
        col = buffer("col", prob.group * kg * nmax * p)
        dyt = buffer("yt", m * nmax * p)
        for n0 in range(0, prob.num, nmax):
            nb = min(nmax, prob.num - n0)
            gpu_im2col.swap_leading_axes(dy + n0 * m * p * isz, nb, m, p, dyt, dt)  # -> (M, nb, P)
            if dw is not None:
                self._im2col(prob, x + n0 * chw * isz, nb, col)
                # dW[g] (mg, kg) += dyt[g] (mg, nb*P) . col[g]^T (nb*P, kg)
                blas.gemm_strided_batched(False, True, mg, kg, nb * p, 1.0, dyt, mg * nb * p, col, kg * nb * p,
                                          1.0, dw, mg * kg, prob.group, dt)
            if dx is not None:
                # col[g] (kg, nb*P) = W[g]^T (kg, mg) . dyt[g] (mg, nb*P), then back to images
                blas.gemm_strided_batched(True, False, kg, nb * p, mg, 1.0, w, mg * kg, dyt, mg * nb * p,
                                          0.0, col, kg * nb * p, prob.group, dt)
                gpu_im2col.col2im(col, nb, prob.channels, (prob.height, prob.width), prob.kernel, prob.pad,
                                  prob.stride, prob.dilation, dx + n0 * chw * isz, dt)

    @staticmethod
    def _backward_1x1(prob, x, w, dy, dx, dw, buffer):
        dt, isz = prob.np_dtype, prob.itemsize
        mg, cg, p, m, n = prob.mg, prob.cg, prob.out_plane, prob.num_output, prob.num
        chw = prob.channels * p
        part = buffer("part", n * mg * cg) if dw is not None else 0
        for g in range(prob.group):
            wg, dyg, xg = w + g * mg * cg * isz, dy + g * mg * p * isz, x + g * cg * p * isz
            if dw is not None:  # part[n] = dy[n, g] . x[n, g]^T, then dW[g] += sum over n
                blas.gemm_strided_batched(False, True, mg, cg, p, 1.0, dyg, m * p, xg, chw, 0.0, part, mg * cg, n, dt)
                blas.gemv(True, n, mg * cg, 1.0, part, gm.ones_vector(n, dt), 1.0, dw + g * mg * cg * isz, dt)
            if dx is not None:  # dx[n, g] (cg, P) = W[g]^T (cg, mg) . dy[n, g] (mg, P)
                blas.gemm_strided_batched(True, False, cg, p, mg, 1.0, wg, 0, dyg, m * p, 0.0,
                                          dx + g * cg * p * isz, chw, n, dt)


class ImplicitEngine(Engine):
    def __init__(self, forward_tile: str = "64x128", data_tile: str = "64x128", weight_tile: str = "64x64") -> None:
        self.tiles = (forward_tile, data_tile, weight_tile)
        self.name = f"implicit-{forward_tile}" if len(set(self.tiles[:2])) == 1 else "implicit"

    def forward(self, prob, x, w, bias, y, buffer):
        ig.forward(prob, self.tiles[0], x, w, bias, y)

    def backward(self, prob, x, w, dy, dx, dw, db, buffer):
        if dw is not None:
            ws = buffer("ig_ws", ig.workspace_count(prob, self.tiles[2], db is not None))
            ig.backward_weight(prob, self.tiles[2], x, dy, dw, db, ws)
        elif db is not None:
            self.bias_backward(prob, dy, db)
        if dx is not None:
            ig.backward_data(prob, self.tiles[1], w, dy, dx)


class WinogradEngine(Engine):
    name = "winograd"

    def supports(self, prob):
        return winograd.supports(prob)

    def forward(self, prob, x, w, bias, y, buffer):
        winograd.forward(prob, x, w, bias, y, buffer)

    def backward(self, prob, x, w, dy, dx, dw, db, buffer):
        if dw is not None:
            winograd.backward_weight(prob, x, dy, dw, buffer)
        if db is not None:
            self.bias_backward(prob, dy, db)
        if dx is not None:
            winograd.backward_data(prob, w, dy, dx, buffer)


def _implicit_engines() -> dict[str, Engine]:
    out: dict[str, Engine] = {}
    for t in ig.TILES:  # the larger weight tile goes with the larger forward tiles
        e = ImplicitEngine(t, t, ig.WEIGHT_TILES[0] if t in ig.TILES[:2] else ig.WEIGHT_TILES[1])
        out[e.name] = e
    return out


# -- engines-branch hook: an engine whose module has NAME, supports(prob), forward(prob, x, w, bias, y)
# and, unless forward-only, backward(prob, x, w, dy, dx, dw, db); forward-only ones back-propagate with gemm.
class ModuleEngine(Engine):
    def __init__(self, module) -> None:
        self.module, self.name = module, module.NAME

    def supports(self, prob):
        return self.module.supports(prob)

    def forward(self, prob, x, w, bias, y, buffer):
        self.module.forward(prob, x, w, bias, y)

    def backward(self, prob, x, w, dy, dx, dw, db, buffer):
        if hasattr(self.module, "backward"):
            self.module.backward(prob, x, w, dy, dx, dw, db)
        else:
            ENGINES["gemm"].backward(prob, x, w, dy, dx, dw, db, buffer)


ENGINES: dict[str, Engine] = {"gemm": GemmEngine(), **_implicit_engines(), "winograd": WinogradEngine(),
                              **{m.NAME: ModuleEngine(m) for m in (depthwise, direct)}}  # hook
IMPLICIT = tuple(n for n in ENGINES if n.startswith("implicit"))
ENGINE_CANDIDATES = {  # ConvolutionParameter.Engine name -> engines the autotune may pick
    "DEFAULT": tuple(ENGINES),
    "CUDNN": tuple(ENGINES),
    "CAFFE": ("gemm",),
    "IMPLICIT_GEMM": IMPLICIT,
    "WINOGRAD": ("winograd",),
}


@dataclass(frozen=True)
class Choice:
    """The engine picked for each pass, and the measured milliseconds per candidate and pass."""

    forward: str
    backward_data: str
    backward_weight: str
    timings: tuple = ()


_choices: dict[tuple, Choice] = {}


def cached_choices() -> dict[tuple, Choice]:
    """The autotune cache (key: problem, bias, candidates, TF32 mode, device)."""
    return _choices


def clear_cache() -> None:
    _choices.clear()


class _Scratch:
    """Named device buffers for autotuning, grown on demand and freed when dropped."""

    def __init__(self, itemsize: int) -> None:
        self.itemsize = itemsize
        self.buffers: dict[str, tuple[int, object]] = {}

    def __call__(self, name: str, count: int) -> int:
        nbytes = max(1, count) * self.itemsize
        have = self.buffers.get(name)
        if have is None or have[0] < nbytes:
            self.buffers[name] = have = (nbytes, backend.alloc(nbytes))
        return int(have[1])


def _time(fn: Callable[[], None]) -> float:
    fn()  # compiles kernels, sizes buffers
    backend.synchronize()
    best = float("inf")
    for _ in range(TUNE_REPS):
        start = time.perf_counter()
        fn()
        backend.synchronize()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def choose(prob: ConvProblem, has_bias: bool, candidates: tuple[str, ...]) -> Choice:
    """The fastest supporting engine per pass among ``candidates`` (cached per shape)."""
    names = tuple(n for n in candidates if ENGINES[n].supports(prob))
    if not names:
        raise ValueError(f"no convolution engine among {candidates} supports {prob}")
    h = blas.handle()
    key = (prob, has_bias, names, getattr(h, "tf32", False), backend.state().device_id)
    have = _choices.get(key)
    if have is not None:
        return have
    if len(names) == 1:
        choice = Choice(names[0], names[0], names[0])
    else:
        choice = _tune(prob, has_bias, names)
    _choices[key] = choice
    return choice


def _tune(prob: ConvProblem, has_bias: bool, names: tuple[str, ...]) -> Choice:
    isz = prob.itemsize
    scratch = _Scratch(isz)
    ho, wo = prob.out_hw
    x = scratch("x", prob.num * prob.channels * prob.in_plane)
    dx = scratch("dx", prob.num * prob.channels * prob.in_plane)
    y = scratch("y", prob.num * prob.num_output * ho * wo)
    dy = scratch("dy", prob.num * prob.num_output * ho * wo)
    w = scratch("w", prob.num_output * prob.kg)
    dw = scratch("dw", prob.num_output * prob.kg)
    b = scratch("b", prob.num_output)
    db = scratch("db", prob.num_output)
    for ptr, count in ((x, prob.num * prob.channels * prob.in_plane), (dy, prob.num * prob.num_output * ho * wo),
                       (w, prob.num_output * prob.kg), (b, prob.num_output)):
        gm.set(count, 0.5, ptr, prob.np_dtype)
    bias, dbias = (b, db) if has_bias else (None, None)
    timings = []
    best: dict[str, tuple[float, str]] = {}
    passes = {
        "forward": lambda e: e.forward(prob, x, w, bias, y, scratch),
        "backward_data": lambda e: e.backward(prob, x, w, dy, dx, None, None, scratch),
        "backward_weight": lambda e: e.backward(prob, x, w, dy, None, dw, dbias, scratch),
    }
    for pass_name, run in passes.items():
        for name in names:
            ms = _time(lambda run=run, name=name: run(ENGINES[name]))
            timings.append((pass_name, name, ms))
            if pass_name not in best or ms < best[pass_name][0]:
                best[pass_name] = (ms, name)
    return Choice(best["forward"][1], best["backward_data"][1], best["backward_weight"][1], tuple(timings))
