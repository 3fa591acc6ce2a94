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
from .blob import Blob, to_math, weighted_sum
from .errors import CaffeError, NetError, ShapeError, UnknownLayerError
from .gpu import cast
from .memcheck import OutOfMemoryError, out_of_memory
from .precision import LayerPrecision, storage_dtype
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
    - ``half``: it may store its tops and params in float16 / bfloat16 (docs/precision.md): its
      code is dtype-generic, so on the host it runs in float32 on converted copies and its
      results are rounded to the storage type. Default False: a half net runs it in float32 with
      a cast (AMP's rule) and the builder says so once.
    - ``half_kernels``: its GPU code is correct with ``dtype`` a half type (float16, or uint16 for
      bfloat16): kernels compiled with that ``Dtype`` compute in ``Mtype`` (float), its scalars and
      partial sums are Mtype, its GEMMs go through cuBLAS's Ex routines. A half net built in GPU
      mode then gives it ``dtype`` = its storage type and no float copies (docs/precision.md,
      "GPU"). Needs ``half``.
    """

    graph_safe: bool = False
    outside_effects: bool = False
    pure_forward: bool = False
    writes_all_bottom_diffs: bool = False
    regenerates_top: bool = False
    saves_input_in_place: bool = False
    backward_reads: tuple[str, ...] | None = None
    fuses: frozenset[str] = frozenset()
    half: bool = False
    half_kernels: bool = False

    def __post_init__(self) -> None:
        if self.half_kernels and not self.half:
            raise ValueError("half_kernels needs half")
        if not self.fuses <= FUSIONS:
            raise ValueError(f"unknown fusion roles {sorted(self.fuses - FUSIONS)} (known: {sorted(FUSIONS)})")
        if self.backward_reads is not None and not set(self.backward_reads) <= BACKWARD_READS:
            raise ValueError(f"backward_reads takes 'bottom' and 'top', got {self.backward_reads}")

    def but(self, **changes) -> Traits:
        """A copy with ``changes`` (for a subclass or an instance that differs)."""
        return dataclasses.replace(self, **changes)



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


def create_layer(param: caffe_pb2.LayerParameter, dtype: np.dtype | type = np.float32,
                 precision: LayerPrecision | None = None) -> Layer:
    """Instantiate the registered layer for ``param.type``; ``precision`` (from
    ``precision.layer_precision``) gives its storage types where it is half (else ``dtype`` is)."""
    cls = layer_class(param.type, where=f"layer '{param.name}'")
    if precision is None or not precision.is_half:
        return cls(param, dtype=dtype)  # (exactly as before precision existed)
    if not cls.traits.half:  # AMP's rule: float32 with a cast (its __init__ need not know precision)
        layer = cls(param, dtype=np.float32)
        layer.precision = precision
        layer.half_note = f"{layer.where} runs in float32: no half path"
        return layer
    return cls(param, dtype=dtype, precision=precision)


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
    # Loss scaling (docs/precision.md): a layer with a loss seeds its gradient times this factor
    # (set by the solver's Update from the net's global_grad_scale; 1 leaves Caffe's behaviour).
    loss_seed_scale: float = 1.0
    # The same on the GPU: the device address of the float32 scale (None: no scaling), so a replayed
    # iteration reads the scale the device's adaptive rule last set.
    loss_seed_slot: int | None = None

    def __init__(self, param: caffe_pb2.LayerParameter, dtype: np.dtype | builtins.type = np.float32,
                 precision: LayerPrecision | None = None) -> None:
        self.layer_param = caffe_pb2.LayerParameter()
        self.layer_param.CopyFrom(param)
        self.dtype = np.dtype(dtype)  # what its code computes in (and stores, unless half below)
        # Storage of the tops it makes (data, diff) and of its params: ``dtype`` unless half.
        self.top_dtype, self.top_diff_dtype = self.dtype, self.dtype
        self.param_dtype, self.param_diff_dtype = self.dtype, self.dtype
        self.precision = precision
        self.half_note: str | None = None  # why a half net runs it in float32 (the builder logs it)
        self._float_view: MathView | None = None
        if precision is not None and precision.is_half:
            self._take_precision(precision)
        self.phase = param.phase
        self.blobs: list[Blob] = []
        for proto in param.blobs:  # weights embedded in the layer definition
            blob = Blob(dtype=self.dtype)
            blob.from_proto(proto, where=f"layer '{param.name}'")
            self.blobs.append(blob)
        self.param_propagate_down: list[bool] = []
        self._loss_weights: list[float] = []

    def _take_precision(self, precision: LayerPrecision) -> None:
        """Storage types from ``precision`` (a half one): a layer declaring ``traits.half`` stores
        tops in its forward/backward types (tops no gradient flows through stay float32: a loss
        layer's, as losses accumulate in float32, and a metric's, whose first bottom takes no gradient) and
        params too (not running statistics: BatchNorm's stay float32); either way its host code
        computes in float32."""
        self.dtype = np.dtype(np.float32)
        self.top_dtype = self.top_diff_dtype = self.param_dtype = self.param_diff_dtype = self.dtype
        if not self.traits.half:
            self.half_note = f"{self.where} runs in float32: no half path"
            return
        ftype, btype = storage_dtype(precision.forward_type), storage_dtype(precision.backward_type)
        if self.traits.half_kernels and ftype == btype and common.mode() is common.Mode.GPU:
            self.dtype = ftype  # its GPU kernels run on the half blobs themselves (docs/precision.md, "GPU")
        if not self.is_loss and self.allow_force_backward(0):
            self.top_dtype, self.top_diff_dtype = ftype, btype
        if precision.statistics_type is None:
            self.param_dtype, self.param_diff_dtype = ftype, btype

    @property
    def stores_half(self) -> bool:
        """Whether it computes in float32 on values stored in a half type (its inputs that can carry
        a gradient are rounded to its forward storage type first, as a conversion would)."""
        return (self.precision is not None and self.precision.is_half and self.traits.half
                and not self.half_native)

    @property
    def half_native(self) -> bool:
        """Whether its kernels compute on half blobs directly (``dtype`` is a half type: a half net
        built in GPU mode, ``Traits.half_kernels``); it then runs in GPU mode only."""
        return self.dtype.itemsize == 2

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
        """Caffe's SetUp: check counts, layer_setup, reshape, then record loss weights. Where a
        blob's storage differs from :attr:`dtype` (half nets) the layer sets up on float copies
        (:class:`MathView`) and its params are then stored in :attr:`param_dtype`."""
        self.check_blob_counts(bottom, top)
        view = self.math_view(bottom, top)
        b, t = (bottom, top) if view is None else view.setup(bottom, top)
        try:
            self.layer_setup(b, t)
            if len(self.param_propagate_down) != len(self.blobs):
                self.param_propagate_down = [True] * len(self.blobs)
            self.reshape(b, t)
        except CaffeError as exc:  # from Blob methods, fillers... which do not know the layer
            raise self.error(str(exc), type(exc)).with_traceback(exc.__traceback__) from None
        except MemoryError as exc:  # (fillers, tables a layer builds in numpy)
            raise self._out_of_memory(exc, "set-up", bottom) from None
        if view is not None:
            self._store_params()
            view.shape_tops(top)
        self.set_loss_weights(top)

    def _store_params(self) -> None:
        """Params made in :attr:`dtype` by ``layer_setup`` -> blobs of :attr:`param_dtype` holding
        their values rounded to nearest even (half params)."""
        for i, p in enumerate(self.blobs):
            if p.dtype != self.param_dtype or p.diff_dtype != self.param_diff_dtype:
                stored = Blob(p.shape, self.param_dtype, self.param_diff_dtype)
                stored.set_math_data(p.cpu_data())
                self.blobs[i] = stored

    def math_view(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> MathView | None:
        """The layer's conversion blobs when it must run on float copies (a blob it touches is
        stored in another type than :attr:`dtype`, or it stores half), else None (every float32 or
        float64 net: the layer runs on its blobs as it always did)."""
        if self._float_view is None:
            m = self.dtype
            # params in their own storage (param_dtype: dtype, but float32 statistics of a half
            # layer whose kernels run on half data, BatchNorm's) need no view either
            if not self.stores_half and all(b.dtype == m and b.diff_dtype == m for b in (*bottom, *top)) and all(
                    p.dtype == self.param_dtype and p.diff_dtype == self.param_diff_dtype for p in self.blobs):
                return None
            self._float_view = MathView(self)
        return self._float_view

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
                blob.set_math_diff(np.asarray(w))

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
        if self.half_native and common.mode() is not common.Mode.GPU:
            raise self.error(f"computes in {np.dtype(self.dtype).name if self.dtype != np.uint16 else 'bfloat16'} "
                             "on the GPU (its net was built in GPU mode); build the net again in CPU mode "
                             "to run it on the CPU")
        view = self.math_view(bottom, top) if self._float_view is not None or self.precision is not None else None
        if view is not None:
            view.forward(bottom, top)
            return
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
        if self._float_view is None and self.has_loss and (
                self.loss_seed_slot is not None if common.mode() is common.Mode.GPU else self.loss_seed_scale != 1.0):
            self._float_view = MathView(self)  # (the scaled seed goes into copies of the tops' diffs)
        if self._float_view is not None:
            self._float_view.backward(top, propagate_down, bottom)
            return
        self._run_backward(top, propagate_down, bottom)

    def _run_backward(self, top: Sequence[Blob], propagate_down: Sequence[bool], bottom: Sequence[Blob]) -> None:
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


def _round_through(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` (float32) as they come back from storage ``dtype`` (rounded to nearest even)."""
    if dtype == np.uint16:
        from .precision import bfloat16_to_float32, float32_to_bfloat16
        return bfloat16_to_float32(float32_to_bfloat16(values))
    if dtype == np.float16:
        return values.astype(np.float16).astype(np.float32)
    return values


def _store(copy: Blob, real: Blob, diff: bool, through: np.dtype | None = None) -> None:
    """``real``'s data (or diff) takes ``copy``'s values rounded to nearest even (through ``through``
    first): kernels on the device in GPU mode, numpy on the host otherwise."""
    if common.mode() is common.Mode.GPU:
        if copy.count:
            if diff:
                cast.convert(copy.count, copy.gpu_diff(), copy.diff_dtype, real.mutable_gpu_diff(), real.diff_dtype,
                             through)
            else:
                cast.convert(copy.count, copy.gpu_data(), copy.dtype, real.mutable_gpu_data(), real.dtype, through)
        return
    if diff:
        values = copy.cpu_diff()
        real.set_math_diff(values if through is None else _round_through(values, through))
    else:
        values = copy.cpu_data()
        real.set_math_data(values if through is None else _round_through(values, through))


class MathView:
    """A layer's conversion blobs: float copies (in the layer's :attr:`Layer.dtype`) of the blobs it
    touches that are stored in another type (half tops and params, half inputs of a float32
    layer), so that its dtype-generic code runs unchanged. Per pass: inputs converted in (those
    that can carry a gradient rounded to the layer's half storage first, as a conversion to its
    storage type would), the layer's own methods on the copies, outputs stored back rounded to
    nearest even (tops through the layer's storage type, then the blob's). A blob already stored
    in the layer's dtype is used as it is unless it must be rounded. The copies are the layer's
    own, outside the net's blob list (memory plans never see them)."""

    def __init__(self, layer: Layer) -> None:
        self.layer = layer
        self.copies: dict[int, tuple[Blob, Blob]] = {}  # id(blob) -> (the blob, its float copy)

    def _copy(self, real: Blob, rounded: bool) -> Blob:
        m = self.layer.dtype
        if not rounded and real.dtype == m and real.diff_dtype == m:
            return real
        have = self.copies.get(id(real))
        if have is None or have[0] is not real:
            have = self.copies[id(real)] = (real, Blob((), m))
        return have[1]

    def _rounds(self, i: int) -> bool:
        """Whether bottom ``i``'s values are rounded to the layer's storage type (labels are not)."""
        return self.layer.stores_half and self.layer.allow_force_backward(i)

    def _bottoms(self, bottom: Sequence[Blob]) -> list[Blob]:
        return [self._copy(b, self._rounds(i)) for i, b in enumerate(bottom)]

    def _tops(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> list[Blob]:
        out = []
        for t in top:  # an in-place top is its bottom's copy
            i = next((i for i, b in enumerate(bottom) if b is t), None)
            out.append(self._copy(t, i is not None and self._rounds(i)) if i is not None else
                       self._copy(t, self.layer.stores_half))
        return out

    def _params(self) -> list[Blob]:
        return [self._copy(p, False) for p in self.layer.blobs]

    def _load(self, real: Blob, copy: Blob, data: bool, diff: bool, through: np.dtype | None = None) -> None:
        if copy is real:
            return
        if copy.shape != real.shape:
            copy.reshape(real.shape)
        if common.mode() is common.Mode.GPU:  # (kernels on the device: graph-safe, no host copies)
            if real.count and data:
                cast.convert(real.count, real.gpu_data(), real.dtype, copy.mutable_gpu_data(), copy.dtype,
                             through if through is not None and through != real.dtype else None)
            if real.count and diff:
                cast.convert(real.count, real.gpu_diff(), real.diff_dtype, copy.mutable_gpu_diff(), copy.diff_dtype)
            return
        if data:
            values = to_math(real.cpu_data())
            if through is not None and through != real.dtype:  # (values stored in it need no rounding)
                values = _round_through(values, through)
            copy.mutable_cpu_data()[...] = values
        if diff:
            copy.mutable_cpu_diff()[...] = to_math(real.cpu_diff())

    def setup(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> tuple[list[Blob], list[Blob]]:
        """Float copies of ``bottom`` (values converted in) and ``top`` for ``layer_setup``."""
        b = self._bottoms(bottom)
        for i, (real, copy) in enumerate(zip(bottom, b)):
            self._load(real, copy, True, False, self.layer.top_dtype if self._rounds(i) else None)
        return b, self._tops(bottom, top)

    def shape_tops(self, top: Sequence[Blob]) -> None:
        """Each top shaped like its float copy (after the layer's reshape of the copies)."""
        for real, copy in zip(top, self._known(top)):
            if real is not copy and real.shape != copy.shape:
                real.reshape(copy.shape)

    def _known(self, blobs: Sequence[Blob]) -> list[Blob]:
        return [self.copies[id(b)][1] if id(b) in self.copies and self.copies[id(b)][0] is b else b for b in blobs]

    def forward(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        layer = self.layer
        b, t, p = self._bottoms(bottom), self._tops(bottom, top), self._params()
        for i, (real, copy) in enumerate(zip(bottom, b)):
            self._load(real, copy, True, False, layer.top_dtype if self._rounds(i) else None)
        versions = []
        for real, copy in zip(layer.blobs, p):
            self._load(real, copy, True, False)
            versions.append(copy.data_memory.version)
        layer.checked_reshape(b, t)
        self.shape_tops(top)
        held, layer.blobs = layer.blobs, p
        try:
            if common.mode() is common.Mode.GPU:
                layer.forward_gpu(b, t)
            else:
                layer.forward_cpu(b, t)
        except MemoryError as exc:
            raise layer._out_of_memory(exc, "forward", bottom) from None
        finally:
            layer.blobs = held
        for real, copy in zip(top, t):
            if copy is not real:
                _store(copy, real, False, layer.top_dtype)
        for real, copy, v in zip(held, p, versions):  # (BatchNorm-like state a forward updates)
            if copy is not real and copy.data_memory.version != v:
                _store(copy, real, False)

    def backward(self, top: Sequence[Blob], propagate_down: Sequence[bool], bottom: Sequence[Blob]) -> None:
        layer = self.layer
        on_gpu = common.mode() is common.Mode.GPU
        slot = layer.loss_seed_slot if on_gpu and layer.has_loss else None
        scale = layer.loss_seed_scale if layer.has_loss and not on_gpu else 1.0
        b, p = self._bottoms(bottom), self._params()
        scaled = scale != 1.0 or slot is not None
        t = [self._copy(x, True) for x in top] if scaled else self._tops(bottom, top)
        for i, (real, copy) in enumerate(zip(bottom, b)):
            self._load(real, copy, True, True, layer.top_dtype if self._rounds(i) else None)
        for k, (real, copy) in enumerate(zip(top, t)):
            if real not in bottom:
                self._load(real, copy, True, True)
            if slot is not None and layer.loss(k):  # the seed times the device's loss scale
                cast.scale_by_slot(copy.count, copy.mutable_gpu_diff(), copy.diff_dtype, slot)
            elif scale != 1.0 and layer.loss(k):
                copy.mutable_cpu_diff()[...] *= copy.dtype.type(scale)  # the seed, scaled
        for real, copy in zip(layer.blobs, p):
            self._load(real, copy, True, True)
        held, layer.blobs = layer.blobs, p
        try:
            layer._run_backward(t, propagate_down, b)
        finally:
            layer.blobs = held
        for real, copy, down in zip(bottom, b, propagate_down):
            if down and copy is not real:
                _store(copy, real, True, layer.top_diff_dtype)
        for j, (real, copy) in enumerate(zip(held, p)):
            if copy is not real and (j >= len(layer.param_propagate_down) or layer.param_propagate_down[j]):
                _store(copy, real, True)

    def nbytes(self) -> int:
        """Bytes the float copies hold (data and diff), for the net's memory check."""
        return sum(c.count * (c.dtype.itemsize + c.diff_dtype.itemsize) for _, c in self.copies.values())
