"""The convolution engines' base class and registry.

An engine is one way to run the three passes (:data:`PASSES`) of a :class:`.ConvProblem` on the GPU.
Each engine module of this package defines its :class:`Engine` subclass beside its kernels and
registers it with :func:`register_engine`; :func:`load_engines` imports every module of the package
once, so an engine exists as soon as its module does. The registry is the single source of:

- :data:`ENGINES`: name -> engine, in registration ``order`` (the autotune times them in this order);
- :func:`candidates` / :data:`ENGINE_CANDIDATES`: the engines each ``ConvolutionParameter.Engine`` value
  lets the autotune pick. ``DEFAULT``, ``CAFFE`` and ``CUDNN`` (BVLC's values) allow every engine:
  all engines here are pycaffe-lite's own, and files that say ``CAFFE`` mean "not cuDNN". Every
  other value forces the engines registered under it;
- :func:`describe`: the one-line-per-engine summary that docstrings and docs show.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from ..gpu import backend
from ..gpu import math_functions as gm
from .problem import ConvProblem

PASSES = ("forward", "backward_data", "backward_weight")
AUTOTUNE_ALL = ("DEFAULT", "CAFFE", "CUDNN")  # Engine values that let the autotune pick any engine


class Engine:
    """One way to run the three passes of a :class:`.ConvProblem`; all engines share this call style.

    ``forward`` assigns ``y`` (adding ``bias`` when given, then applying ReLU when ``relu``: the fused
    Convolution -> ReLU epilogue); ``backward_data`` assigns ``dx``; ``backward_weight`` accumulates
    ``dw`` and, when given, ``db``. ``ws`` holds device pointers to scratch regions of the byte sizes
    :meth:`scratch` gives for the pass (carved from the shared device workspace by the caller).

    Class attributes set by :func:`register_engine`: ``enum`` (the ConvolutionParameter.Engine value
    that forces it) and ``order`` (its position among the candidates)."""

    name = ""  # unique; set per instance by engines with variants (tile shapes)
    enum = ""
    order = 0
    summary = ""  # one line for :func:`describe`
    requirement = ""  # what a problem needs for :meth:`supports`, for error messages
    passes: tuple[str, ...] = PASSES  # the passes it implements (others fall back to gemm)
    relu_epilogue = True  # forward applies ``relu`` itself (else the caller adds a ReLU pass)

    @classmethod
    def variants(cls) -> tuple[Engine, ...]:
        """The instances to register (one per tile shape for tiled engines); default one."""
        return (cls(),)

    def supports(self, prob: ConvProblem) -> bool:
        return True

    def scratch(self, prob: ConvProblem, pass_: str, has_bias: bool) -> tuple[int, ...]:
        return ()

    def forward(self, prob: ConvProblem, x: int, w: int, bias: int | None, y: int, ws: list[int],
                relu: bool = False) -> None:
        raise NotImplementedError

    def backward_data(self, prob: ConvProblem, w: int, dy: int, dx: int, ws: list[int]) -> None:
        raise NotImplementedError

    def backward_weight(self, prob: ConvProblem, x: int, dy: int, dw: int, db: int | None,
                        ws: list[int]) -> None:
        raise NotImplementedError

    def backward_pair(self, prob: ConvProblem, data_engine: Engine, x: int, w: int, dy: int, dw: int,
                      db: int | None, dx: int) -> bool:
        """Both gradients at once, this engine's weight gradient then ``data_engine``'s data
        gradient, sharing what they both prepare (dy re-laid once); False, running nothing, where
        this engine shares nothing with ``data_engine`` (the caller then runs the passes in turn)."""
        return False


class TiledEngine(Engine):
    """An engine registered once per tile shape of :attr:`tiles` (``"BMxBN"``), named
    ``<prefix>-<tile>`` and running that tile in every pass (the tensor-core engines)."""

    prefix = ""
    tiles: tuple[str, ...] = ()

    def __init__(self, tile: str) -> None:
        self.tile = tile
        self.name = f"{self.prefix}-{tile}"

    @classmethod
    def variants(cls) -> tuple[Engine, ...]:
        return tuple(cls(t) for t in cls.tiles)


_registry: dict[str, Engine] = {}
ENGINES: dict[str, Engine] = {}  # name -> engine, sorted by order (then registration)
E = TypeVar("E", bound=type[Engine])


def _sort() -> None:
    items = sorted(_registry.items(), key=lambda kv: kv[1].order)  # stable: registration order breaks ties
    ENGINES.clear()
    ENGINES.update(items)


def register_engine(enum: str, *, order: int, summary: str = "") -> Callable[[E], E]:
    """Class decorator: register every :meth:`Engine.variants` instance of the class under its name,
    forced by the ConvolutionParameter.Engine value ``enum`` (which must exist in caffe.proto for
    prototxt files to name it), at position ``order`` among the autotune's candidates."""
    if enum in AUTOTUNE_ALL:
        raise ValueError(f"{enum} lets the autotune pick any engine; register under an engine's own value")

    def deco(cls: E) -> E:
        cls.enum, cls.order = enum, order
        cls.summary = summary or cls.summary
        for engine in cls.variants():
            if not engine.name:
                raise ValueError(f"{cls.__name__}: an engine needs a name")
            if engine.name in _registry and type(_registry[engine.name]) is not cls:
                raise ValueError(f"convolution engine {engine.name!r} is registered twice "
                                 f"({type(_registry[engine.name]).__name__}, {cls.__name__})")
            _registry[engine.name] = engine
        _sort()
        return cls
    return deco


def unregister_engine(cls: type[Engine]) -> None:
    """Remove every engine of the class ``cls`` (tests that register their own)."""
    for name in [n for n, e in _registry.items() if type(e) is cls]:
        del _registry[name]
    _sort()


def candidates(engine_field: str) -> tuple[str, ...]:
    """The engine names the ConvolutionParameter.Engine value ``engine_field`` lets the autotune pick:
    all of them for DEFAULT, CAFFE and CUDNN, else those registered under it (empty: no such engine)."""
    load_engines()
    if engine_field in AUTOTUNE_ALL:
        return tuple(ENGINES)
    return tuple(n for n, e in ENGINES.items() if e.enum == engine_field)


class _Candidates(Mapping[str, tuple[str, ...]]):
    """Read-only view: Engine value -> :func:`candidates` (the values in use, live from the registry)."""

    def __getitem__(self, key: str) -> tuple[str, ...]:
        names = candidates(key)
        if not names:
            raise KeyError(key)
        return names

    def __iter__(self) -> Iterator[str]:
        seen = dict.fromkeys(AUTOTUNE_ALL)
        seen.update(dict.fromkeys(e.enum for e in ENGINES.values()))
        return iter(seen)

    def __len__(self) -> int:
        return sum(1 for _ in self)


ENGINE_CANDIDATES: Mapping[str, tuple[str, ...]] = _Candidates()


def describe() -> str:
    """One line per engine value: ``- ENUM: engine names: summary`` (for docstrings and docs)."""
    lines = []
    for enum in ENGINE_CANDIDATES:
        if enum in AUTOTUNE_ALL:
            continue
        names = candidates(enum)
        first = ENGINES[names[0]]
        lines.append(f"- ``{enum}``: {', '.join(names)}: {type(first).summary}")
    return "\n".join(lines)


_loaded = False


def load_engines() -> None:
    """Import every module of this package once, so that each engine module's decorator runs."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    package = __name__.rpartition(".")[0]
    path = importlib.import_module(package).__path__
    for info in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{info.name}")


# -- helpers the engines share ------------------------------------------------------------------
def relu_inplace(n: int, y: int, dtype) -> None:
    """``y = ReLU(y)`` in place over ``n`` elements (negative_slope 0, ReLULayer's formula, in Mtype:
    the identity conversions for float and double, fp32 for the half types)."""
    backend.elementwise("conv_relu", "Dtype* y", "const Mtype v = to_m(y[i]); y[i] = from_m(v > 0 ? v : v * Mtype(0))",
                        dtype)(n, y)


def bias_backward(prob: ConvProblem, dy: int, db: int) -> None:
    """``db += sum of dy over images and pixels`` (for engines whose weight pass leaves the bias)."""
    gm.channel_sum(prob.num, prob.num_output, prob.out_plane, dy, db, prob.np_dtype, beta=1.0)
