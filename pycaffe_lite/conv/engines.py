"""GPU convolution engines and the per-shape autotune that picks one per pass.

Engines (each does the whole minibatch; groups in the same calls):

- ``gemm``: im2col into a column buffer (C*kh*kw, N, Ho*Wo), one cuBLAS strided-batched GEMM over
  the groups, an axis swap into (N, M, Ho*Wo). 1x1/stride-1/pad-0 convolutions skip im2col: one
  strided-batched GEMM over the images reads the input in place (not the weight gradient at output
  planes below :data:`COLUMNS_1X1_WEIGHT_PLANE`). Batches whose columns exceed
  :data:`COL_BUFFER_BYTES` run in chunks of images.
- ``implicit-BMxBN``: im2col fused into a tiled GEMM (``conv_implicit``), one launch per pass.
- ``winograd``: F(2x2, 3x3) for 3x3/stride-1 convolutions (``winograd``).
- ``tensorcore-BMxBN``: the implicit GEMM on TF32 tensor cores (``conv_tensorcore``), offered only
  for float32 with TF32 allowed.

Each engine runs three passes (:data:`PASSES`): ``forward``, ``backward_data`` and
``backward_weight``. Their scratch (column buffers, Winograd transforms, implicit-GEMM partial sums)
comes from the process-wide :func:`backend.workspace`, one call per pass (:func:`run`), so all
convolution layers share one buffer sized to the largest need.

:func:`choose` times every engine that supports a :class:`ConvProblem` on workspace buffers, for
each pass separately, and caches the fastest per shape (cuDNN's "find" step). The layer's
``engine`` field narrows the candidates (:data:`ENGINE_CANDIDATES`). The choices can be kept in a
file (:mod:`.autotune_file`): :func:`save_cache` / :func:`load_cache` (``pycaffe_lite.save_autotune``
/ ``load_autotune``), or :func:`use_cache_file` / ``$PYCAFFE_LITE_AUTOTUNE_CACHE``, which load the
file at the first choice and save it after each new tuning.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..config import config
from ..errors import CaffeError
from ..gpu import backend, blas, cuda_graph
from ..gpu import math_functions as gm
from . import autotune_file, depthwise, direct, winograd
from . import im2col as gpu_im2col
from . import implicit as ig
from . import tensorcore as tc
from .problem import ConvProblem

COL_BUFFER_BYTES = 256 << 20  # gemm engine column buffer budget; larger batches run in chunks
COLUMNS_1X1_WEIGHT_PLANE = 100  # gemm engine: 1x1 weight gradients at smaller output planes use columns
TUNE_REPS = 3
TUNE_GRAPH_CALLS = 5  # graph replays per timed batch
log = logging.getLogger("pycaffe_lite")
PASSES = ("forward", "backward_data", "backward_weight")


def bias_backward(prob: ConvProblem, dy: int, db: int) -> None:
    """``db += sum of dy over images and pixels``."""
    gm.channel_sum(prob.num, prob.num_output, prob.out_plane, dy, db, prob.np_dtype, beta=1.0)


class Engine:
    """One way to run the three passes of a :class:`ConvProblem`. ``forward`` assigns ``y`` (adding
    ``bias`` when given, then applying ReLU when ``relu``: the fused Convolution -> ReLU epilogue);
    ``backward_data`` assigns ``dx``; ``backward_weight`` accumulates ``dw`` and, when given, ``db``.
    ``ws`` holds device pointers to scratch regions of the byte sizes :meth:`scratch` gives for the
    pass."""

    name = ""
    requirement = ""  # what a problem needs for :meth:`supports`, for error messages
    passes: tuple[str, ...] = PASSES  # the passes it implements (others fall back to gemm)
    relu_epilogue = True  # forward applies ``relu`` itself (else :func:`run` adds a ReLU pass)

    def supports(self, prob: ConvProblem) -> bool:
        return True

    def scratch(self, prob: ConvProblem, pass_: str, has_bias: bool) -> tuple[int, ...]:
        return ()

    def forward(self, prob: ConvProblem, x: int, w: int, bias: int | None, y: int, ws: list[int],
                relu: bool = False) -> None:
        raise NotImplementedError

    def backward_data(self, prob: ConvProblem, w: int, dy: int, dx: int, ws: list[int]) -> None:
        raise NotImplementedError

    def backward_weight(self, prob: ConvProblem, x: int, dy: int, dw: int, db: int | None, ws: list[int]) -> None:
        raise NotImplementedError


class GemmEngine(Engine):
    name = "gemm"

    @staticmethod
    def _chunk(prob: ConvProblem) -> int:
        per_image = prob.channels * prob.khkw * prob.out_plane * prob.itemsize
        return max(1, min(prob.num, COL_BUFFER_BYTES // max(1, per_image)))

    @staticmethod
    def _per_image(prob: ConvProblem, pass_: str) -> bool:
        """Whether ``pass_`` runs one GEMM per image straight on the blobs, without columns: for
        1x1/stride-1/pad-0 convolutions, except the weight gradient at output planes below
        :data:`COLUMNS_1X1_WEIGHT_PLANE` (its per-image partial products, N x M x C, then cost more
        than columns and one GEMM over the batch)."""
        return prob.is_1x1 and (pass_ != "backward_weight" or prob.out_plane >= COLUMNS_1X1_WEIGHT_PLANE)

    def scratch(self, prob, pass_, has_bias):
        isz = prob.itemsize
        if self._per_image(prob, pass_):  # the weight pass's per-image partial products; no columns
            return (prob.num * prob.mg * prob.cg * isz,) if pass_ == "backward_weight" else ()
        nmax = self._chunk(prob)
        return prob.group * prob.kg * nmax * prob.out_plane * isz, prob.num_output * nmax * prob.out_plane * isz

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        dt, isz = prob.np_dtype, prob.itemsize
        mg, kg, p, m = prob.mg, prob.kg, prob.out_plane, prob.num_output
        chw = prob.channels * prob.in_plane
        if self._per_image(prob, "forward"):  # y[n, g] (mg, P) = W[g] (mg, cg) . x[n, g] (cg, P), per image
            for g in range(prob.group):
                blas.gemm_strided_batched(False, False, mg, p, kg, 1.0, w + g * mg * kg * isz, 0,
                                          x + g * kg * p * isz, chw, 0.0, y + g * mg * p * isz, m * p, prob.num, dt)
        else:
            col, yt = ws
            for n0, nb in self._chunks(prob):
                self._im2col(prob, x + n0 * chw * isz, nb, col)
                # yt[g] (mg, nb*P) = W[g] (mg, kg) . col[g] (kg, nb*P), for every group g
                blas.gemm_strided_batched(False, False, mg, nb * p, kg, 1.0, w, mg * kg, col, kg * nb * p,
                                          0.0, yt, mg * nb * p, prob.group, dt)
                gpu_im2col.swap_leading_axes(yt, m, nb, p, y + n0 * m * p * isz, dt)  # -> (nb, M, P)
        if bias is not None:
            gm.add_channel_bias(prob.num, m, p, bias, y, dt, relu)
        elif relu:
            _relu(prob.num * m * p, y, dt)

    def _chunks(self, prob: ConvProblem) -> list[tuple[int, int]]:
        """(first image, images) of each chunk whose columns fit in COL_BUFFER_BYTES."""
        nmax = self._chunk(prob)
        return [(n0, min(nmax, prob.num - n0)) for n0 in range(0, prob.num, nmax)]

    @staticmethod
    def _im2col(prob: ConvProblem, x: int, nb: int, col: int) -> None:
        gpu_im2col.im2col(x, nb, prob.channels, (prob.height, prob.width), prob.kernel, prob.pad, prob.stride,
                          prob.dilation, col, prob.np_dtype)

    def backward_data(self, prob, w, dy, dx, ws):
        dt, isz = prob.np_dtype, prob.itemsize
        mg, kg, p, m = prob.mg, prob.kg, prob.out_plane, prob.num_output
        chw = prob.channels * prob.in_plane
        if self._per_image(prob, "backward_data"):
            # dx[n, g] (cg, P) = W[g]^T (cg, mg) . dy[n, g] (mg, P), batched over images
            for g in range(prob.group):
                blas.gemm_strided_batched(True, False, kg, p, mg, 1.0, w + g * mg * kg * isz, 0,
                                          dy + g * mg * p * isz, m * p, 0.0, dx + g * kg * p * isz, chw,
                                          prob.num, dt)
            return
        col, dyt = ws
        for n0, nb in self._chunks(prob):
            gpu_im2col.swap_leading_axes(dy + n0 * m * p * isz, nb, m, p, dyt, dt)  # -> (M, nb, P)
            # col[g] (kg, nb*P) = W[g]^T (kg, mg) . dyt[g] (mg, nb*P), then back to images
            blas.gemm_strided_batched(True, False, kg, nb * p, mg, 1.0, w, mg * kg, dyt, mg * nb * p,
                                      0.0, col, kg * nb * p, prob.group, dt)
            gpu_im2col.col2im(col, nb, prob.channels, (prob.height, prob.width), prob.kernel, prob.pad,
                              prob.stride, prob.dilation, dx + n0 * chw * isz, dt)

    def backward_weight(self, prob, x, dy, dw, db, ws):
        dt, isz = prob.np_dtype, prob.itemsize
        mg, kg, p, m, n = prob.mg, prob.kg, prob.out_plane, prob.num_output, prob.num
        chw = prob.channels * prob.in_plane
        if self._per_image(prob, "backward_weight"):
            part, = ws
            for g in range(prob.group):  # part[n] = dy[n, g] . x[n, g]^T, then dW[g] += sum over n
                blas.gemm_strided_batched(False, True, mg, kg, p, 1.0, dy + g * mg * p * isz, m * p,
                                          x + g * kg * p * isz, chw, 0.0, part, mg * kg, n, dt)
                blas.gemv(True, n, mg * kg, 1.0, part, gm.ones_vector(n, dt), 1.0, dw + g * mg * kg * isz, dt)
        else:
            col, dyt = ws
            for n0, nb in self._chunks(prob):
                gpu_im2col.swap_leading_axes(dy + n0 * m * p * isz, nb, m, p, dyt, dt)  # -> (M, nb, P)
                self._im2col(prob, x + n0 * chw * isz, nb, col)
                # dW[g] (mg, kg) += dyt[g] (mg, nb*P) . col[g]^T (nb*P, kg)
                blas.gemm_strided_batched(False, True, mg, kg, nb * p, 1.0, dyt, mg * nb * p, col, kg * nb * p,
                                          1.0, dw, mg * kg, prob.group, dt)
        if db is not None:  # after the scratch is used: a helper may take the workspace itself
            bias_backward(prob, dy, db)


class ImplicitEngine(Engine):
    requirement = ig.REQUIREMENT

    def __init__(self, forward_tile: str = "64x128", data_tile: str = "64x128", weight_tile: str = "64x64") -> None:
        self.tiles = (forward_tile, data_tile, weight_tile)
        self.name = f"implicit-{forward_tile}" if len(set(self.tiles[:2])) == 1 else "implicit"

    def supports(self, prob):
        return ig.supports(prob)

    def scratch(self, prob, pass_, has_bias):
        if pass_ != "backward_weight":
            return ()
        return (ig.workspace_count(prob, self.tiles[2], has_bias) * prob.itemsize,)

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        ig.forward(prob, self.tiles[0], x, w, bias, y, relu)

    def backward_data(self, prob, w, dy, dx, ws):
        ig.backward_data(prob, self.tiles[1], w, dy, dx)

    def backward_weight(self, prob, x, dy, dw, db, ws):
        ig.backward_weight(prob, self.tiles[2], x, dy, dw, db, ws[0])


class WinogradEngine(Engine):
    name = "winograd"
    requirement = winograd.REQUIREMENT

    def supports(self, prob):
        return winograd.supports(prob)

    def scratch(self, prob, pass_, has_bias):
        return winograd.scratch(prob, pass_)

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        winograd.forward(prob, x, w, bias, y, ws, relu)

    def backward_data(self, prob, w, dy, dx, ws):
        winograd.backward_data(prob, w, dy, dx, ws)

    def backward_weight(self, prob, x, dy, dw, db, ws):
        winograd.backward_weight(prob, x, dy, dw, ws)
        if db is not None:
            bias_backward(prob, dy, db)


def _implicit_engines() -> dict[str, Engine]:
    out: dict[str, Engine] = {}
    for t in ig.TILES:  # the larger weight tile goes with the larger forward tiles
        e = ImplicitEngine(t, t, ig.WEIGHT_TILES[0] if t in ig.TILES[:2] else ig.WEIGHT_TILES[1])
        out[e.name] = e
    return out


class TensorCoreEngine(Engine):
    """The implicit GEMM on TF32 tensor cores (``conv_tensorcore``): float32 when TF32 is allowed."""

    requirement = tc.REQUIREMENT

    def __init__(self, tile: str) -> None:
        self.tile = tile
        self.name = f"tensorcore-{tile}"

    def supports(self, prob):
        return tc.supports(prob)

    def scratch(self, prob, pass_, has_bias):
        if pass_ == "backward_weight":
            return (tc.workspace_count(prob, self.tile, has_bias) * prob.itemsize,)
        n = tc.weight_scratch_count(prob, self.tile, pass_)
        return (n * prob.itemsize,) if n else ()

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        tc.forward(prob, self.tile, x, w, bias, y, relu, ws[0] if ws else None)

    def backward_data(self, prob, w, dy, dx, ws):
        tc.backward_data(prob, self.tile, w, dy, dx, ws[0] if ws else None)

    def backward_weight(self, prob, x, dy, dw, db, ws):
        tc.backward_weight(prob, self.tile, x, dy, dw, db, ws[0])


# -- engines-branch hook: an engine whose module has NAME, supports(prob), forward(prob, x, w, bias, y)
# and, unless forward-only, backward(prob, x, w, dy, dx, dw, db); forward-only ones back-propagate with gemm.
class DepthwiseEngine(Engine):
    """Direct kernels for group == channels (``conv_depthwise``)."""

    name = "depthwise"
    requirement = "group == channels == num_output / k (a depthwise convolution)"

    def supports(self, prob):
        return depthwise.supports(prob)

    def scratch(self, prob, pass_, has_bias):
        size = depthwise.weight_scratch(prob) if pass_ == "backward_weight" else 0
        return (size,) if size else ()

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        depthwise.forward(prob, x, w, bias, y, relu)

    def backward_data(self, prob, w, dy, dx, ws):
        depthwise.backward_data(prob, w, dy, dx)

    def backward_weight(self, prob, x, dy, dw, db, ws):
        depthwise.backward_weight(prob, x, dy, dw, db, ws[0] if ws else None)


class DirectEngine(Engine):
    """Small-batch direct convolution, forward only (``conv_direct``)."""

    name = "direct"
    requirement = "batch <= 4, group 1, square 1/3/5/7 kernel, stride 1 or 2, no dilation"
    passes = ("forward",)

    def supports(self, prob):
        return direct.supports(prob)

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        direct.forward(prob, x, w, bias, y, relu)


ENGINES: dict[str, Engine] = {"gemm": GemmEngine(), **_implicit_engines(), "winograd": WinogradEngine(),
                              "depthwise": DepthwiseEngine(), "direct": DirectEngine(),
                              **{e.name: e for e in map(TensorCoreEngine, tc.TILES)}}
IMPLICIT = tuple(n for n in ENGINES if n.startswith("implicit"))
TENSOR_CORE = tuple(n for n in ENGINES if n.startswith("tensorcore"))
ENGINE_CANDIDATES = {  # ConvolutionParameter.Engine name -> engines the autotune may pick
    "DEFAULT": tuple(ENGINES),
    "CUDNN": tuple(ENGINES),
    "CAFFE": ("gemm",),
    "IMPLICIT_GEMM": IMPLICIT,
    "WINOGRAD": ("winograd",),
    "DEPTHWISE": ("depthwise",),
    "DIRECT": ("direct",),
    "TENSOR_CORE": TENSOR_CORE,
}


@dataclass(frozen=True)
class Choice:
    """The engine picked for each pass, and the measured milliseconds per candidate and pass."""

    forward: str
    backward_data: str
    backward_weight: str
    timings: tuple = ()


_choices: dict[tuple, Choice] = {}
_scratch_peak = 0  # bytes: the largest scratch of any chosen engine pass (see choose)
_unreserved: set[tuple] = set()  # keys loaded from a file whose scratch choose() has not reserved yet
_cache_file: str | None = None  # set by use_cache_file (the CLI's --autotune-cache)
_cache_files: dict[str, bool] = {}  # autotune file -> loaded (so saved to) or not an autotune file


def cached_choices() -> dict[tuple, Choice]:
    """The autotune cache (key: problem, bias, candidates, TF32 mode, device (name, compute
    capability)); see :mod:`.autotune_file`."""
    return _choices


def clear_cache() -> None:
    _choices.clear()
    _unreserved.clear()


def use_cache_file(path: str | os.PathLike | None) -> None:
    """Load the autotune file ``path`` at the first choice and save to it after every new tuning
    (as ``$PYCAFFE_LITE_AUTOTUNE_CACHE``, which applies when no path is set here)."""
    global _cache_file
    _cache_file = os.fspath(path) if path else None


def cache_file() -> str | None:
    """The autotune file :func:`choose` loads and saves (:func:`use_cache_file`, else the environment)."""
    return _cache_file or config.autotune_cache


def save_cache(path: str | os.PathLike) -> int:
    """Write the tuned choices to the autotune file ``path``, merged with the entries already there
    (:func:`.autotune_file.write`); returns the number of entries the file holds."""
    return autotune_file.write(path, {k: ((c.forward, c.backward_data, c.backward_weight), c.timings)
                                      for k, c in _choices.items() if c.timings})


def _usable(key: autotune_file.Key, picks: autotune_file.Picks) -> bool:
    """An entry still names existing engines, its candidates are exactly those that support its
    problem, and each pass's engine runs that pass (gemm, the fallback, being a candidate or not)."""
    prob, names = key[0], key[2]
    if not all(n in ENGINES and ENGINES[n].supports(prob) for n in names):
        return False
    return all(e in ENGINES and (e in names or e == "gemm") and ENGINES[e].supports(prob) and p in ENGINES[e].passes
               for p, e in zip(PASSES, picks))


def load_cache(path: str | os.PathLike) -> int:
    """Add the choices of the autotune file ``path`` to the cache; :func:`choose` then uses them
    without tuning. Stale files and entries naming engines that no longer exist or no longer
    support the problem are ignored with a warning. Returns the number of entries loaded."""
    entries = autotune_file.read(path)
    usable = [(k, p, t) for k, p, t in entries if _usable(k, p)]
    if len(usable) < len(entries):
        log.warning("%s: ignoring %d autotune entries for engines that no longer exist or fit their problem",
                    path, len(entries) - len(usable))
    for key, picks, timings in usable:
        _choices[key] = Choice(*picks, timings)
        _unreserved.add(key)
    return len(usable)


def _autoload(path: str) -> bool:
    """Load the autotune file ``path`` once per process; whether choose() may save to it (not when
    it holds something else)."""
    usable = _cache_files.get(path)
    if usable is None:
        try:
            log.info("%s: %d convolution autotune entries loaded", path, load_cache(path))
            usable = True
        except CaffeError as exc:
            log.warning("%s (it is neither used nor written)", exc)
            usable = False
        _cache_files[path] = usable
    return usable


@functools.cache
def _device(device_id: int) -> autotune_file.Device:
    """Name and compute capability of the current device (``device_id``)."""
    dev = backend.state().device
    major, minor = dev.compute_capability()
    return dev.name(), (int(major), int(minor))


_timing = "wall"  # how _time measures: "graph" inside graph_timing(), else "wall"


@contextlib.contextmanager
def graph_timing() -> Iterator[None]:
    """Tune for work that CUDA graphs will replay (the executor's warm-up and capture runs): engines
    are timed as graph replays, i.e. device time without Python launch overhead. Elsewhere (plain
    layer calls, graphs off) they are timed by wall clock, launch overhead included. Choices are
    cached per method."""
    global _timing
    before, _timing = _timing, "graph"
    try:
        yield
    finally:
        _timing = before


def _time(fn: Callable[[], None]) -> float:
    """Milliseconds per call of ``fn``: device time of CUDA-graph replays of one call under
    :func:`graph_timing`, else (or when the pass cannot be captured) wall time of plain calls."""
    fn()  # compiles kernels, sizes buffers
    backend.synchronize()
    graph = _graph_of(fn) if _timing == "graph" else None
    if graph is not None:
        st = backend.state()
        start, stop = st.cuda.Event(), st.cuda.Event()
        graph.launch()
        best = float("inf")
        for _ in range(TUNE_REPS):
            start.record(st.stream)
            for _ in range(TUNE_GRAPH_CALLS):
                graph.launch()
            stop.record(st.stream)
            stop.synchronize()
            best = min(best, stop.time_since(start) / TUNE_GRAPH_CALLS)
        return best
    best = float("inf")
    for _ in range(TUNE_REPS):
        start_s = time.perf_counter()
        fn()
        backend.synchronize()
        best = min(best, time.perf_counter() - start_s)
    return best * 1e3


def _graph_of(fn: Callable[[], None]) -> cuda_graph.CudaGraph | None:
    if backend.recording() is not None:
        return None
    recording = cuda_graph.Recording()
    try:
        with cuda_graph.capture(recording):
            fn()
    except Exception:  # not capturable here: time plain calls
        return None
    return recording.graph


def choose(prob: ConvProblem, has_bias: bool, candidates: tuple[str, ...]) -> Choice:
    """The fastest supporting engine per pass among ``candidates`` (cached per shape; loaded from
    and saved to the autotune file of :func:`cache_file` when one is set)."""
    names = tuple(n for n in candidates if ENGINES[n].supports(prob))
    if not names:
        raise ValueError(f"no convolution engine among {candidates} supports {prob}")
    path = cache_file()
    save_to = path if path and _autoload(path) else None
    key = (prob, has_bias, names, blas.tf32_allowed(), _device(backend.state().device_id), _timing)
    choice = _choices.get(key)
    if choice is not None and key not in _unreserved:
        return choice
    tuned = False
    if choice is None and len(names) == 1:
        only = names[0]
        fwd, bwd_data, bwd_weight = (only if p in ENGINES[only].passes else "gemm" for p in PASSES)
        choice = Choice(fwd, bwd_data, bwd_weight)
    else:
        if choice is None:
            choice, tuned = _tune(prob, has_bias, names), True
        # Keep room for the largest forward scratch chosen so far, so later forwards do not grow
        # the workspace (and re-key graphs); the tuning operands were full-size tensors: give them
        # back. Backward passes grow it when they first run (a net's first, uncaptured iteration),
        # so nets that never run backward (deploy) hold no backward scratch.
        global _scratch_peak
        sizes = ENGINES[choice.forward].scratch(prob, "forward", has_bias)
        _scratch_peak = max(_scratch_peak, backend.workspace_total(*sizes))
        if tuned:
            backend.release_workspace()
        if _scratch_peak:
            backend.workspace(_scratch_peak)
    _unreserved.discard(key)
    _choices[key] = choice
    if tuned and save_to:
        try:
            save_cache(save_to)
        except (CaffeError, OSError) as exc:
            log.warning("cannot save the convolution autotune to %s: %s", save_to, exc)
    return choice


def _relu(n: int, y: int, dtype) -> None:
    """``y = ReLU(y)`` in place (negative_slope 0, ReLULayer's formula)."""
    backend.elementwise("conv_relu", "Dtype* y", "y[i] = y[i] > 0 ? y[i] : y[i] * Dtype(0)", dtype)(n, y)


def _call(engine: Engine, prob: ConvProblem, pass_: str, args: tuple, reserved: tuple[int, ...] = (),
          relu: bool = False) -> None:
    """Run ``pass_`` with its scratch from one :func:`backend.workspace` call, after ``reserved``
    leading regions (the autotune's operands) that the call keeps in place."""
    key = ("scratch", engine.name, pass_, pass_ == "backward_weight" and args[-1] is not None)
    sizes = prob.cache.get(key)
    if sizes is None:
        sizes = prob.cache[key] = engine.scratch(prob, pass_, key[-1])
    ws = backend.workspace(*reserved, *sizes)[len(reserved):] if reserved or sizes else []
    if not relu:
        getattr(engine, pass_)(prob, *args, ws)
        return
    x, w, bias, y = args
    engine.forward(prob, x, w, bias, y, ws, relu=engine.relu_epilogue)
    if not engine.relu_epilogue:
        _relu(prob.num * prob.num_output * prob.out_plane, y, prob.np_dtype)


def run(prob: ConvProblem, choice: Choice, pass_: str, *args, relu: bool = False) -> None:
    """Run ``pass_`` of ``prob`` with the engine ``choice`` picked for it. ``args``: forward
    ``(x, w, bias, y)``; backward_data ``(w, dy, dx)``; backward_weight ``(x, dy, dw, db)``
    (``bias``/``db`` may be None). ``relu`` (forward only): ReLU after the bias, fused where the
    engine can."""
    _call(ENGINES[getattr(choice, pass_)], prob, pass_, args, relu=relu)


def _tune(prob: ConvProblem, has_bias: bool, names: tuple[str, ...]) -> Choice:
    """Time every engine on every pass, on operands carved from the shared workspace."""
    isz, dt = prob.itemsize, prob.np_dtype
    counts = (prob.num * prob.channels * prob.in_plane, prob.num * prob.num_output * prob.out_plane,
              prob.num_output * prob.kg, prob.num_output)
    operands = tuple(c * isz for c in counts for _ in range(2))  # x, dx, y, dy, w, dw, b, db
    for pass_ in PASSES:  # grow the workspace to the largest need first, so the operands stay put
        for name in (n for n in names if pass_ in ENGINES[n].passes):
            backend.workspace(*operands, *ENGINES[name].scratch(prob, pass_, has_bias))
    x, dx, y, dy, w, dw, b, db = backend.workspace(*operands)
    for ptr, count, value in ((x, counts[0], 0.5), (dy, counts[1], 0.5), (w, counts[2], 0.5), (b, counts[3], 0.5),
                              (dw, counts[2], 0.0), (db, counts[3], 0.0)):  # the weight pass accumulates
        gm.set(count, value, ptr, dt)
    bias, dbias = (b, db) if has_bias else (None, None)
    args = {"forward": (x, w, bias, y), "backward_data": (w, dy, dx), "backward_weight": (x, dy, dw, dbias)}
    timings = []
    best: dict[str, tuple[float, str]] = {}
    for pass_ in PASSES:
        for name in (n for n in names if pass_ in ENGINES[n].passes):
            ms = _time(functools.partial(_call, ENGINES[name], prob, pass_, args[pass_], operands))
            timings.append((pass_, name, ms))
            if pass_ not in best or ms < best[pass_][0]:
                best[pass_] = (ms, name)
    return Choice(best["forward"][1], best["backward_data"][1], best["backward_weight"][1], tuple(timings))
