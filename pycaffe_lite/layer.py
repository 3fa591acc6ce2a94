"""Layer base class and the registry that maps prototxt type strings to layer classes.

A layer implements ``layer_setup`` (read its parameters, create param blobs), ``reshape`` (top
shapes from bottom shapes), ``forward_cpu`` / ``backward_cpu`` and optionally ``forward_gpu`` /
``backward_gpu`` (the default GPU path runs the CPU code on host copies). Conventions, as in Caffe:
backward *writes* bottom diffs and *accumulates* into param diffs; a loss layer writes its loss
into ``top[0]`` and reads its loss weight from ``top[0]``'s diff.
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from . import common, memcheck, python_layer
from .blob import Blob, weighted_sum
from .errors import CaffeError, NetError, ShapeError, UnknownLayerError
from .memcheck import OutOfMemoryError, out_of_memory
from .schema import caffe_pb2

_REGISTRY: dict[str, type[Layer]] = {}

# The fused passes a layer may take part in (``Traits.fuses``; runtime/fusion.py builds the chains).
CONVOLUTION = "convolution"  # applies an in-place ReLU in its forward epilogue, takes folded affines (folded_copy)
RELU = "relu"  # a ReLU (negative_slope 0) a convolution, sum or normalization before it may apply
NORM_FOLD = "norm_fold"  # a fixed per-channel affine a convolution before it absorbs (fold_convolution)
AFFINE = "affine"  # a per-channel scale (and shift) of its bottom that joins a fold or a norm chain
NORM_CHAIN = "norm_chain"  # heads normalization -> affine -> ReLU as one pass each way (chain_*_gpu)
RELU_MASK = "relu_mask"  # its backward applies the ReLU just before it from its own top (backward_relu_gpu)
SUM_RELU = "sum_relu"  # a sum that runs with its in-place ReLU and the Split after (chain_*_relu_gpu)
SPLIT_SUM = "split_sum"  # writes nothing forward; backward sums its tops' diffs into its bottom's
FUSIONS = frozenset({CONVOLUTION, RELU, NORM_FOLD, AFFINE, NORM_CHAIN, RELU_MASK, SUM_RELU, SPLIT_SUM})
BACKWARD_READS = frozenset({"bottom", "top"})


@dataclass(frozen=True)
class Traits:
    """What a layer type declares to the runtime (executor, fusions, memory plans) and the tools, in
    one value: ``Layer.traits``, set by each class (an instance may replace it, e.g. a Data layer
    that caches on the GPU becomes capturable). The defaults are the safe answers.

    - ``graph_safe``: its GPU work may be captured into a CUDA graph and replayed: device code only,
      no host reads, no allocations per call, per-call scalars in device memory. Default False: a
      layer is replayed only when it says so (data readers, Python layers, layers whose output
      size depends on the data stay False; the executor runs them plainly around the replay).
    - ``outside_effects``: it acts outside the net (user code, files, state carried to the next
      forward): the runtime never repeats its forward behind the user's back.
    - ``pure_forward``: its forward writes its tops from its bottoms and params alone, so a memory
      plan may run it again to recompute a top.
    - ``writes_all_bottom_diffs``: its backward overwrites the whole diff of every bottom it
      propagates to, not only bottom 0's (gradient plans share only diffs known to be written).
    - ``regenerates_top`` / ``saves_input_in_place``: it can write its last top again from its
      unchanged bottom (``regenerate_top_into``) / in place, it keeps a copy of its input for
      backward that such a producer may replace (``recompute_input``); memory plans pair them.
    - ``backward_reads``: the data its backward reads at least ("bottom", "top": the blob or a
      buffer of its size such as a mask), for ``time``'s byte counts; None: not declared (no rate).
      :meth:`Layer.backward_reads` refines it by the layer's parameters.
    - ``fuses``: the fused passes it may take part in (:data:`FUSIONS`); :meth:`Layer.fuses_as`
      checks its parameters.
    """

    graph_safe: bool = False
    outside_effects: bool = False
    pure_forward: bool = False
    writes_all_bottom_diffs: bool = False
    regenerates_top: bool = False
    saves_input_in_place: bool = False
    backward_reads: tuple[str, ...] | None = None
    fuses: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.fuses <= FUSIONS:
            raise ValueError(f"unknown fusion roles {sorted(self.fuses - FUSIONS)} (known: {sorted(FUSIONS)})")
        if self.backward_reads is not None and not set(self.backward_reads) <= BACKWARD_READS:
            raise ValueError(f"backward_reads takes 'bottom' and 'top', got {self.backward_reads}")

    def but(self, **changes) -> Traits:
        """A copy with ``changes`` (for a subclass or an instance that differs)."""
        return dataclasses.replace(self, **changes)


GPU_TRAITS = Traits(graph_safe=True)  # device code only, nothing else to declare


def register_layer(type_name: str):
    """Class decorator registering a layer under its prototxt ``type`` string."""

    def deco(cls: type[Layer]) -> type[Layer]:
        if type_name in _REGISTRY and _REGISTRY[type_name] is not cls:
            raise NetError(f"layer type '{type_name}' registered twice ({_REGISTRY[type_name]} and {cls})")
        cls.type = type_name
        _REGISTRY[type_name] = cls
        return cls

    return deco


def _load_layers() -> None:
    importlib.import_module(f"{__package__}.layers")


def layer_type_list() -> list[str]:
    """Sorted names of every registered layer type."""
    _load_layers()
    return sorted(_REGISTRY)


def layer_class(type_name: str, where: str = "") -> type[Layer]:
    _load_layers()
    try:
        return _REGISTRY[type_name]
    except KeyError:
        prefix = f"{where}: " if where else ""
        raise UnknownLayerError(
            f"{prefix}unknown layer type '{type_name}' (known types: {', '.join(sorted(_REGISTRY))})"
        ) from None


def create_layer(param: caffe_pb2.LayerParameter, dtype: np.dtype | type = np.float32) -> Layer:
    """Instantiate the registered layer for ``param.type``."""
    cls = layer_class(param.type, where=f"layer '{param.name}'")
    return cls(param, dtype=dtype)


class Layer:
    """Base of every layer. Subclasses set the blob-count class attributes they need."""

    type: ClassVar[str] = ""
    exact_num_bottom_blobs: ClassVar[int | None] = None
    min_bottom_blobs: ClassVar[int | None] = None
    max_bottom_blobs: ClassVar[int | None] = None
    exact_num_top_blobs: ClassVar[int | None] = None
    min_top_blobs: ClassVar[int | None] = None
    max_top_blobs: ClassVar[int | None] = None
    equal_num_bottom_top_blobs: ClassVar[bool] = False
    # Create the missing tops up to the minimum/exact count (Caffe's AutoTopBlobs).
    auto_top_blobs: ClassVar[bool] = False
    # A loss layer gets loss_weight 1 on its first top unless the prototxt says otherwise.
    is_loss: ClassVar[bool] = False
    traits: Traits = Traits()  # what the runtime may assume (a class's declaration; see Traits)
    recompute_input: Callable[[int], None] | None = None  # set by the executor on such a layer
    # Set on such a layer by a fused chain that ran its forward (runtime/fusion.py's NormChain): the
    # blob holding its input (a BatchNorm's normalized values); the layer's own forward clears it.
    input_from: Blob | None = None

    def __init__(self, param: caffe_pb2.LayerParameter, dtype: np.dtype | builtins.type = np.float32) -> None:
        self.layer_param = caffe_pb2.LayerParameter()
        self.layer_param.CopyFrom(param)
        self.dtype = np.dtype(dtype)
        self.phase = param.phase
        self.blobs: list[Blob] = []
        for proto in param.blobs:  # weights embedded in the layer definition
            blob = Blob(dtype=self.dtype)
            blob.from_proto(proto, where=f"layer '{param.name}'")
            self.blobs.append(blob)
        self.param_propagate_down: list[bool] = []
        self._loss_weights: list[float] = []

    # -- identity ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.layer_param.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} '{self.name}' ({self.type})>"

    @property
    def where(self) -> str:
        """``layer 'name' (Type)``: how errors and messages name this layer."""
        return f"layer '{self.name}' ({self.type})"

    def error(self, message: str, cls: builtins.type[CaffeError] = NetError) -> CaffeError:
        """A ``cls`` error (NetError, ShapeError...) whose message starts ``layer 'name' (Type): `` once."""
        prefix = f"{self.where}: "
        return cls(message if message.startswith(prefix) else prefix + message)

    # -- set-up -----------------------------------------------------------------------------
    def setup(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        """Caffe's SetUp: check counts, layer_setup, reshape, then record loss weights."""
        self.check_blob_counts(bottom, top)
        try:
            self.layer_setup(bottom, top)
            if len(self.param_propagate_down) != len(self.blobs):
                self.param_propagate_down = [True] * len(self.blobs)
            self.reshape(bottom, top)
        except CaffeError as exc:  # from Blob methods, fillers... which do not know the layer
            raise self.error(str(exc), type(exc)).with_traceback(exc.__traceback__) from None
        except MemoryError as exc:  # (fillers, tables a layer builds in numpy)
            raise self._out_of_memory(exc, "set-up", bottom) from None
        self.set_loss_weights(top)

    def layer_setup(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        """Read parameters and create param blobs (called once)."""

    def reshape(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        """Shape the tops (and internal buffers) from the bottoms."""
        raise NotImplementedError(f"{type(self).__name__}.reshape")

    def check_blob_counts(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        nb, nt = len(bottom), len(top)

        def fail(what: str, expected: str, got: int) -> CaffeError:
            return self.error(f"takes {expected} {what} blob(s), got {got}")

        if self.exact_num_bottom_blobs is not None and nb != self.exact_num_bottom_blobs:
            raise fail("bottom", f"exactly {self.exact_num_bottom_blobs}", nb)
        if self.min_bottom_blobs is not None and nb < self.min_bottom_blobs:
            raise fail("bottom", f"at least {self.min_bottom_blobs}", nb)
        if self.max_bottom_blobs is not None and nb > self.max_bottom_blobs:
            raise fail("bottom", f"at most {self.max_bottom_blobs}", nb)
        if self.exact_num_top_blobs is not None and nt != self.exact_num_top_blobs:
            raise fail("top", f"exactly {self.exact_num_top_blobs}", nt)
        if self.min_top_blobs is not None and nt < self.min_top_blobs:
            raise fail("top", f"at least {self.min_top_blobs}", nt)
        if self.max_top_blobs is not None and nt > self.max_top_blobs:
            raise fail("top", f"at most {self.max_top_blobs}", nt)
        if self.equal_num_bottom_top_blobs and nb != nt:
            raise self.error(f"needs as many top blobs as bottom blobs, got {nb} bottom and {nt} top")

    def auto_top_count(self) -> int:
        """How many tops to create when ``auto_top_blobs`` is on."""
        return max(self.exact_num_top_blobs or 0, self.min_top_blobs or 0)

    def allow_force_backward(self, bottom_index: int) -> bool:
        """False for bottoms that can never take a gradient (labels)."""
        return True

    # -- loss weights -----------------------------------------------------------------------
    def set_loss_weights(self, top: Sequence[Blob]) -> None:
        weights = list(self.layer_param.loss_weight)
        if not weights and self.is_loss:
            weights = [1.0]
        if len(weights) > len(top):
            raise self.error(f"has {len(weights)} loss_weight values but only {len(top)} top blobs")
        self._loss_weights = weights + [0.0] * (len(top) - len(weights))
        for blob, w in zip(top, self._loss_weights):
            if w != 0:
                blob.mutable_cpu_diff()[...] = w

    @property
    def has_loss(self) -> bool:
        return any(self._loss_weights)

    def loss(self, top_index: int) -> float:
        return self._loss_weights[top_index] if top_index < len(self._loss_weights) else 0.0

    # -- compute ----------------------------------------------------------------------------
    def forward(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> float:
        """Reshape, run the forward pass for the current mode, and return the weighted loss."""
        self.compute_forward(bottom, top)
        return self.weighted_loss(top)

    def compute_forward(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        """Reshape and run the forward pass for the current mode, without reading the loss back."""
        self.checked_reshape(bottom, top)
        try:
            if common.mode() is common.Mode.GPU:
                self.forward_gpu(bottom, top)
            else:
                self.forward_cpu(bottom, top)
        except MemoryError as exc:  # numpy temporaries, or a blob's first host allocation
            raise self._out_of_memory(exc, "forward", bottom) from None

    def checked_reshape(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        """:meth:`reshape`, its shape and memory errors naming this layer."""
        try:
            self.reshape(bottom, top)
        except (ShapeError, OutOfMemoryError) as exc:  # a new input shape too large, say
            raise self.error(str(exc), type(exc)) from None

    def _out_of_memory(self, exc: MemoryError, where: str, bottom: Sequence[Blob]) -> CaffeError:
        """The project error naming this layer for a MemoryError in its ``where`` pass."""

        msg = str(exc) if isinstance(exc, OutOfMemoryError) else str(
            out_of_memory(f"temporaries of its {where} (bottom shapes {[tuple(b.shape) for b in bottom]})"))
        return self.error(f"{where}: {msg}", OutOfMemoryError)

    def weighted_loss(self, top: Sequence[Blob]) -> float:
        """Σ loss_weight·top over the tops with a loss weight (the weight lives in the top's diff),
        read from the device with one sync; a NaN lets :meth:`explain_nonfinite_loss` raise."""
        loss = weighted_sum([blob for i, blob in enumerate(top) if self.loss(i)])
        if math.isnan(loss):
            self.explain_nonfinite_loss()
        return loss

    def explain_nonfinite_loss(self) -> None:
        """Called when this layer's loss was read back NaN: raise an error saying why, if the layer
        knows (a loss layer that flagged a bad label on the device does); else nothing."""

    def backward(self, top: Sequence[Blob], propagate_down: Sequence[bool], bottom: Sequence[Blob]) -> None:
        """Gradients for the bottoms flagged in ``propagate_down`` and for the params."""
        try:
            if common.mode() is common.Mode.GPU:
                self.backward_gpu(top, propagate_down, bottom)
            else:
                self.backward_cpu(top, propagate_down, bottom)
        except MemoryError as exc:
            raise self._out_of_memory(exc, "backward", bottom) from None

    def forward_cpu(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        raise NotImplementedError(f"{type(self).__name__}.forward_cpu")

    def backward_cpu(self, top: Sequence[Blob], propagate_down: Sequence[bool], bottom: Sequence[Blob]) -> None:
        """Default: no gradient (layers without inputs that need one)."""

    def forward_gpu(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        """Default GPU path: the CPU code on host copies (blobs sync themselves)."""
        self.forward_cpu(bottom, top)

    def backward_gpu(self, top: Sequence[Blob], propagate_down: Sequence[bool], bottom: Sequence[Blob]) -> None:
        self.backward_cpu(top, propagate_down, bottom)

    # -- what the runtime asks of a layer beyond its traits (fusions, memory plans) ----------------
    def held_blobs(self) -> list[Blob]:
        """Blobs whose memory this layer holds itself (params, internal state): never shared with
        other blobs by a memory plan. The default finds every Blob reachable from its attributes."""
        held: list[Blob] = []
        seen: set[int] = set()
        todo: list[object] = [self]
        while todo:
            obj = todo.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, Blob):
                held.append(obj)
            elif isinstance(obj, list | tuple):
                todo.extend(obj)
            elif isinstance(obj, dict):
                todo.extend(obj.values())
            elif isinstance(obj, Layer | python_layer.Layer):  # a Python layer's user object too
                todo.extend(vars(obj).values())
        return held

    def regenerate_top_into(self, bottom: Blob, out: int) -> None:
        """Write the last forward's top into device pointer ``out`` again (``regenerates_top``)."""
        raise NotImplementedError(f"{self.type} cannot regenerate its top")

    def backward_reads_data(self, top: bool, i: int) -> bool:
        """Whether backward reads the data of top (``top``) or bottom ``i``, as far as memory plans
        may rely on it (blobs that no backward reads may share memory in nets that run backward);
        default True, overridden where a layer knows (a convolution's top)."""
        return True

    def backward_reads(self) -> tuple[str, ...] | None:
        """``traits.backward_reads`` for this layer's parameters (Eltwise's and Pooling's operations)."""
        return self.traits.backward_reads

    def writes_bottom_diff(self, i: int) -> bool:
        """Whether backward, asked to propagate to bottom ``i``, writes all of that bottom's diff."""
        return i == 0 or self.traits.writes_all_bottom_diffs

    def fuses_as(self, role: str, bottom: Blob | None = None) -> bool:
        """Whether this layer, with its parameters (and ``bottom``, for :data:`AFFINE`), takes part in
        fused passes as ``role`` (one of :data:`FUSIONS`, declared in ``traits.fuses``)."""
        return role in self.traits.fuses

    def folded_copy(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> Layer:
        """A copy of this convolution with a bias term, set up on ``bottom``/``top``, whose blobs
        ``fold_convolution`` fills (layers that fuse as :data:`CONVOLUTION`)."""
        raise NotImplementedError(f"{self.type} cannot be folded")

    def fold_convolution(self, conv: Layer, scale: Layer | None, fused: Layer) -> None:
        """Write ``conv`` followed by this layer (and ``scale``) into ``fused`` (``folds_into_convolution``)."""
        raise NotImplementedError(f"{self.type} does not fold into a convolution")

    # -- helpers for subclasses -------------------------------------------------------------
    def make_param_blob(self, shape: Sequence[int]) -> Blob:
        with memcheck.param_of(self.layer_param.name):  # (named so if the net's blobs cannot fit)
            return Blob(shape, dtype=self.dtype)

    def check_param_shapes(self, expected: Sequence[Sequence[int]]) -> None:
        """For layers created with embedded or copied blobs: check their shapes."""
        for i, (blob, shape) in enumerate(zip(self.blobs, expected)):
            if tuple(blob.shape) != tuple(shape):
                raise self.error(
                    f"param blob {i} has shape {blob.shape}, expected {tuple(shape)}"
                )
