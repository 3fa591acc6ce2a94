"""Running the GPU convolution engines, and the per-shape autotune that picks one per pass.

The engines themselves live in their own modules and register themselves (:mod:`.registry`); each
runs the three passes (:data:`PASSES`): ``forward``, ``backward_data`` and ``backward_weight``, on the
whole minibatch, groups in the same calls. Their scratch (column buffers, Winograd transforms,
implicit-GEMM partial sums) comes from the process-wide :func:`backend.workspace`, one call per pass
(:func:`run`), so all convolution layers share one buffer sized to the largest need.

:func:`choose` times every engine that supports a :class:`ConvProblem`, for each pass separately, and
caches the fastest per shape (cuDNN's "find" step); it times on the calling layer's own blobs where
given (``operands``), else on workspace buffers. The layer's
``engine`` field narrows the candidates (:func:`field_candidates`, :data:`ENGINE_CANDIDATES`):
DEFAULT, CAFFE and CUDNN allow every engine; pycaffe-lite's own values force one. The choices can be
kept in a file (:mod:`.autotune_file`): :func:`save_cache` / :func:`load_cache`
(``pycaffe_lite.save_autotune`` / ``load_autotune``), or :func:`use_cache_file` /
``$PYCAFFE_LITE_AUTOTUNE_CACHE``, which load the file at the first choice and save it after each new
tuning.

Engines by ``engine`` value (from the registry):

"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from ..config import config
from ..errors import CaffeError
from ..gpu import backend, blas, cuda_graph
from ..gpu import math_functions as gm
from . import autotune_file, registry
from .problem import ConvProblem
from .registry import ENGINE_CANDIDATES, ENGINES, PASSES

__all__ = ["ENGINES", "ENGINE_CANDIDATES", "PASSES", "Choice", "cache_file", "cached_choices", "choose",
           "clear_cache", "field_candidates", "graph_timing", "load_cache", "run", "save_cache", "use_cache_file"]

TUNE_REPS = 3
TUNE_GRAPH_CALLS = 5  # graph replays per timed batch
# A candidate whose first timed call takes more than LOSER_FACTOR times the pass's best so far, and
# LOSER_MARGIN_MS more, is not timed further: it cannot win, and on large layers the slow engines'
# repeated calls were most of the autotune's time (seconds for ResNet-50's stem at batch 256).
LOSER_FACTOR, LOSER_MARGIN_MS = 2.0, 1.0
log = logging.getLogger("pycaffe_lite")

registry.load_engines()
__doc__ = (__doc__ or "") + registry.describe() + "\n"
_noted_fields: set[str] = set()


def field_candidates(field: str, layer: str = "") -> tuple[str, ...]:
    """The engines a layer whose ``engine`` field is ``field`` (a ConvolutionParameter.Engine name) lets
    the autotune pick (:func:`.registry.candidates`). ``CAFFE`` and ``CUDNN`` are said once per process
    in the log (INFO): they pick among all engines, as DEFAULT does."""
    if field in ("CAFFE", "CUDNN") and field not in _noted_fields:
        _noted_fields.add(field)
        log.info("engine: %s (convolution layer '%s' and any others) lets the autotune pick among all of "
                 "pycaffe-lite's convolution engines, as DEFAULT does (files write it to avoid cuDNN, which "
                 "pycaffe-lite does not use); "
                 "engine: GEMM forces Caffe's im2col + GEMM", field, layer)
    return registry.candidates(field)


@dataclass(frozen=True)
class Choice:
    """The engine picked for each pass ("" for a pass not tuned yet: :func:`choose` tunes only the
    passes a layer runs), and the measured milliseconds per candidate and pass."""

    forward: str
    backward_data: str
    backward_weight: str
    timings: tuple = ()

    def has(self, passes: tuple[str, ...] = PASSES) -> bool:
        """Whether every pass of ``passes`` has its engine."""
        return all(getattr(self, p) for p in passes)


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
                                      for k, c in _choices.items() if c.timings and c.has()})


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


def _time(fn: Callable[[], None], bound: float = float("inf")) -> float:
    """Milliseconds per call of ``fn``: device time of CUDA-graph replays of one call under
    :func:`graph_timing`, else (or when the pass cannot be captured) wall time of plain calls. A
    first timed call above ``bound`` ms is returned at once (a loser, see :data:`LOSER_FACTOR`)."""
    fn()  # compiles kernels, sizes buffers
    backend.synchronize()
    graph = _graph_of(fn) if _timing == "graph" else None
    if graph is not None:
        st = backend.state()
        start, stop = st.cuda.Event(), st.cuda.Event()
        graph.launch()
        start.record(st.stream)
        graph.launch()
        stop.record(st.stream)
        stop.synchronize()
        best = stop.time_since(start)
        if best > bound:
            return best
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
        if best * 1e3 > bound:
            break
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


def choose(prob: ConvProblem, has_bias: bool, candidates: tuple[str, ...], passes: tuple[str, ...] = PASSES,
           *, operands: Mapping[str, int] | None = None) -> Choice:
    """The fastest supporting engine per pass among ``candidates`` (cached per shape; loaded from
    and saved to the autotune file of :func:`cache_file` when one is set). Only ``passes`` are tuned
    if not cached yet (a net that never runs backward tunes its forward alone); the others keep ""
    until a later call asks for them. ``operands``: the caller's device pointers the timing may use
    instead of workspace buffers (:func:`_tune`): inputs the passes read (``x``, ``w``, ``b``,
    ``dy``: never written), and outputs (``y``, ``dx``) only where the caller's pass assigns them
    whole next, before anything reads them."""
    names = tuple(n for n in candidates if ENGINES[n].supports(prob))
    if not names:
        raise ValueError(f"no convolution engine among {candidates} supports {prob}")
    path = cache_file()
    save_to = path if path and _autoload(path) else None
    key = (prob, has_bias, names, blas.tf32_allowed(), _device(backend.state().device_id), _timing)
    choice = _choices.get(key)
    if choice is not None and key not in _unreserved and choice.has(passes):
        return choice
    tuned = False
    if choice is None and len(names) == 1:
        only = names[0]
        fwd, bwd_data, bwd_weight = (only if p in ENGINES[only].passes else "gemm" for p in PASSES)
        choice = Choice(fwd, bwd_data, bwd_weight)
    else:
        missing = tuple(p for p in PASSES if p in passes and (choice is None or not getattr(choice, p)))
        if missing:
            new = _tune(prob, has_bias, names, missing, operands)
            old = choice or Choice("", "", "")
            fwd, bwd_data, bwd_weight = (getattr(new, p) or getattr(old, p) for p in PASSES)
            choice = Choice(fwd, bwd_data, bwd_weight, old.timings + new.timings)
            tuned = True
        assert choice is not None  # every pass was cached
        # Keep room for the largest forward scratch chosen so far, so later forwards do not grow
        # the workspace (and re-key graphs); give back what tuning carved (operands the caller did
        # not give, engine scratch). Backward passes grow it when they first run (a net's first,
        # uncaptured iteration), so nets that never run backward (deploy) hold no backward scratch.
        global _scratch_peak
        if choice.forward:
            sizes = ENGINES[choice.forward].scratch(prob, "forward", has_bias)
            _scratch_peak = max(_scratch_peak, backend.workspace_total(*sizes))
        if tuned:
            backend.release_workspace()
        if _scratch_peak:
            backend.workspace(_scratch_peak)
    _unreserved.discard(key)
    _choices[key] = choice
    if tuned and save_to and choice.has():
        try:
            save_cache(save_to)
        except (CaffeError, OSError) as exc:
            log.warning("cannot save the convolution autotune to %s: %s", save_to, exc)
    return choice


def _call(engine: registry.Engine, prob: ConvProblem, pass_: str, args: tuple, reserved: tuple[int, ...] = (),
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
        registry.relu_inplace(prob.num * prob.num_output * prob.out_plane, y, prob.np_dtype)


def run(prob: ConvProblem, choice: Choice, pass_: str, *args, relu: bool = False) -> None:
    """Run ``pass_`` of ``prob`` with the engine ``choice`` picked for it. ``args``: forward
    ``(x, w, bias, y)``; backward_data ``(w, dy, dx)``; backward_weight ``(x, dy, dw, db)``
    (``bias``/``db`` may be None). ``relu`` (forward only): ReLU after the bias, fused where the
    engine can. ``choice`` must have ``pass_`` (:func:`choose` with it among its passes)."""
    assert getattr(choice, pass_), f"{pass_} was not tuned for {prob} (choose(..., passes) without it)"
    _call(ENGINES[getattr(choice, pass_)], prob, pass_, args, relu=relu)


def run_backward(prob: ConvProblem, choice: Choice, x: int, w: int, dy: int, dw: int, db: int | None,
                 dx: int) -> None:
    """Both gradients of ``prob`` with the engines ``choice`` picked: ``dw`` (and ``db`` unless None)
    accumulated, then ``dx`` assigned; in one go where the two engines share work
    (:meth:`registry.Engine.backward_pair`), else pass by pass as :func:`run` runs them."""
    weight, data = ENGINES[choice.backward_weight], ENGINES[choice.backward_data]
    if not weight.backward_pair(prob, data, x, w, dy, dw, db, dx):
        run(prob, choice, "backward_weight", x, dy, dw, db)
        run(prob, choice, "backward_data", w, dy, dx)


_OPERANDS = ("x", "dx", "y", "dy", "w", "dw", "b", "db")  # the autotune's operands, in workspace order
_PASS_OPERANDS = {"forward": ("x", "w", "b", "y"), "backward_data": ("w", "dy", "dx"),
                 "backward_weight": ("x", "dy", "dw", "db")}
_GIVEN_INPUTS = frozenset({"x", "w", "b", "dy"})  # read by every pass that takes them
_GIVEN_OUTPUTS = frozenset({"y", "dx"})  # assigned whole by their pass


def _operand_bytes(prob: ConvProblem) -> dict[str, int]:
    isz = prob.itemsize
    counts = (prob.num * prob.channels * prob.in_plane, prob.num * prob.num_output * prob.out_plane,
              prob.num_output * prob.kg, prob.num_output)
    return dict(zip(_OPERANDS, (c * isz for c in counts for _ in range(2))))


def _given(operands: Mapping[str, int], nbytes: dict[str, int]) -> dict[str, int]:
    """The caller's ``operands`` the timing may use: every input; an output (written by the
    timing) only when its bytes overlap none of the other operands given (an in-place layer, shared
    storage). The weight pass accumulates into ``dw``/``db``: they are never taken."""
    unknown = set(operands) - _GIVEN_INPUTS - _GIVEN_OUTPUTS
    if unknown:
        raise ValueError(f"autotune operands {sorted(unknown)}: only {sorted(_GIVEN_INPUTS | _GIVEN_OUTPUTS)} "
                         f"may be given (the weight pass accumulates into dw and db)")
    given = {n: int(p) for n, p in operands.items() if p is not None}

    def overlaps(a: str, b: str) -> bool:
        return given[a] < given[b] + nbytes[b] and given[b] < given[a] + nbytes[a]

    return {n: p for n, p in given.items()
            if n in _GIVEN_INPUTS or not any(overlaps(n, m) for m in given if m != n)}


def _tune(prob: ConvProblem, has_bias: bool, names: tuple[str, ...], passes: tuple[str, ...] = PASSES,
          operands: Mapping[str, int] | None = None) -> Choice:
    """Time every engine on each of ``passes``; the other passes are left "" in the result. Without
    ``operands`` all eight operands are carved from the shared workspace; with them, the passes'
    operands that :func:`_given` takes are the caller's (their contents are timed as they are) and
    only the rest are carved (``dw`` and ``db`` always)."""
    nbytes = _operand_bytes(prob)
    if operands is None:
        given: dict[str, int] = {}
        carved: tuple[str, ...] = _OPERANDS
    else:
        given = _given(operands, nbytes)
        needed = {n for p in passes for n in _PASS_OPERANDS[p] if has_bias or n not in ("b", "db")}
        carved = tuple(n for n in _OPERANDS if n in needed and n not in given)
    reserved = tuple(nbytes[n] for n in carved)
    for pass_ in passes:  # grow the workspace to the largest need first, so the operands stay put
        for name in (n for n in names if pass_ in ENGINES[n].passes):
            scratch = ENGINES[name].scratch(prob, pass_, has_bias)
            if reserved or scratch:
                backend.workspace(*reserved, *scratch)
    ptr = dict(zip(carved, backend.workspace(*reserved))) if reserved else {}
    dt = prob.np_dtype
    for n, value in (("x", 0.5), ("dy", 0.5), ("w", 0.5), ("b", 0.5), ("dw", 0.0), ("db", 0.0)):
        if n in ptr:  # the weight pass accumulates into dw, db
            gm.set(nbytes[n] // prob.itemsize, value, ptr[n], dt)
    ptr.update(given)
    bias, dbias = (ptr.get("b"), ptr.get("db")) if has_bias else (None, None)  # those of the passes tuned
    args = {"forward": lambda: (ptr["x"], ptr["w"], bias, ptr["y"]),
            "backward_data": lambda: (ptr["w"], ptr["dy"], ptr["dx"]),
            "backward_weight": lambda: (ptr["x"], ptr["dy"], ptr["dw"], dbias)}
    timings = []
    best: dict[str, tuple[float, str]] = {}
    for pass_ in passes:
        for name in (n for n in names if pass_ in ENGINES[n].passes):
            bound = best[pass_][0] * LOSER_FACTOR + LOSER_MARGIN_MS if pass_ in best else float("inf")
            ms = _time(functools.partial(_call, ENGINES[name], prob, pass_, args[pass_](), reserved), bound)
            timings.append((pass_, name, ms))
            if pass_ not in best or ms < best[pass_][0]:
                best[pass_] = (ms, name)
    fwd, bwd_data, bwd_weight = (best[p][1] if p in best else "" for p in PASSES)
    return Choice(fwd, bwd_data, bwd_weight, tuple(timings))
