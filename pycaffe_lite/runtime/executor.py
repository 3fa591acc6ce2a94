"""The executor: the one object that runs a net's layers.

It owns forward and backward over layer ranges, reading the losses back once per pass, CUDA-graph
capture and replay of fixed-shape GPU work, and the training iteration a solver replays (clear
diffs, forward, backward, update) as one graph. :class:`~pycaffe_lite.net.Net` builds the graph of
layers and blobs; :class:`~pycaffe_lite.solvers.solver.Solver` asks this object to run an iteration.

Graphs. On the GPU, a range whose layers all run device code is run plainly the first time
(allocations, compilation and cuBLAS set-up happen then), captured the second time and replayed
afterwards while its key is unchanged: the range, the pointers (the pool's allocation generation)
and the blob shapes. Leading host-side layers (data readers) run eagerly before the replay. Work
that cannot be captured (a host read, an allocation) falls back to plain execution for that key,
once, with a log line and an entry in :attr:`Executor.fallbacks`. Before a replay every host-newer
memory the graph's work uses is copied to the device (values a user wrote through ``blob.data``
are used; the others wait until the device needs them); after it, the memories the work writes are
marked device-newest. Setting the environment variable ``PYCAFFE_LITE_CUDA_GRAPHS=0`` (or ``executor.use_graphs = False``) runs everything plainly.

Memory plans (:mod:`~pycaffe_lite.runtime.memory_plan`): backward passes (pycaffe's and whole
training iterations) share gradient buffers (:attr:`Executor.shared_diffs`); full forwards of nets
that never run backward share intermediate data (:attr:`Executor.shared_data`); TEST nets that run
backward share data only forwards read (:attr:`Executor.forward_data`), and training iterations keep
such data inside their gradient slots (:attr:`Executor.training_data`). They keep pycaffe's
semantics for the blobs users read: they are told of every access through ``blob.data`` /
``blob.diff`` while they watch (:meth:`Executor._update_access_hooks`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Collection, Hashable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import common
from ..blob import Blob, shape_generation, weighted_sum
from ..config import config
from ..conv import engines as conv_engines
from ..gpu import backend, cuda_graph
from ..layer import Layer
from ..synced_memory import SyncedMemory, forget_host_newer, host_newer_memories, watched_writes
from .forward_data import ForwardOnlyData
from .fusion import (
    ConvBNScale,
    ConvReLU,
    NormChain,
    ReLUMaxPool,
    SumReLU,
    find_backward_fusions,
    find_fusions,
)
from .memory_plan import recomputable_inputs, sharing_enabled, source_blobs
from .shared_data import SharedData
from .shared_diffs import SharedDiffs
from .training_data import TrainingData

if TYPE_CHECKING:
    from ..net_graph import NetGraph

log = logging.getLogger("pycaffe_lite")


HOOK_KINDS = ("before_forward", "after_forward", "before_backward", "after_backward")


def graphs_enabled() -> bool:
    """False when ``PYCAFFE_LITE_CUDA_GRAPHS=0`` asks for plain execution everywhere."""
    return bool(config.cuda_graphs)


def runs_on_device(layer: Layer) -> bool:
    """Declared capturable and really on the GPU (the inherited GPU path runs host code)."""
    cls = type(layer)
    return layer.traits.graph_safe and cls.forward_gpu is not Layer.forward_gpu and (
        cls.backward_gpu is not Layer.backward_gpu or cls.backward_cpu is Layer.backward_cpu)


def _has_backward(layer: Layer) -> bool:
    cls = type(layer)
    return cls.backward_cpu is not Layer.backward_cpu or cls.backward_gpu is not Layer.backward_gpu


class _Graphs:
    """Captured graphs by key, with the warm-up and fallback bookkeeping."""

    def __init__(self, memories: Callable[[], Iterator[SyncedMemory]],
                 host_newer: Callable[[], list[SyncedMemory]] = host_newer_memories) -> None:
        self._memories = memories  # the net's, whose heads an abandoned capture puts back
        self._host_newer = host_newer  # candidates for the upload before a replay
        # key -> (graph, the memories it writes, their ids, the ids of every memory its work used)
        self._graphs: dict[Hashable, tuple[cuda_graph.CudaGraph, list[SyncedMemory], frozenset[int],
                                           frozenset[int]]] = {}
        self._warm: set[Hashable] = set()
        self._failed: set[Hashable] = set()
        self.replays = 0
        self.captures = 0
        self.fallbacks: list[str] = []

    def _upload_host_writes(self, skip: Collection[int] = (), only: Collection[int] | None = None) -> None:
        """Upload every memory with device storage whose host copy is newer (values a user wrote);
        those without device storage belong to no captured graph (CPU nets). ``skip``: ``id``s of
        memories the replay overwrites before anything reads them (it marks them device-newest);
        ``only``: the ``id``s of the memories the replay's work uses (the others stay host-newer
        until something on the device needs them)."""
        for mem in self._host_newer():
            if not mem.host_is_newer():
                forget_host_newer(mem)
            elif mem.has_gpu() and id(mem) not in skip and (only is None or id(mem) in only):
                mem.gpu()
                forget_host_newer(mem)

    def run(self, key: Hashable, work: Callable[[], None], write_first: frozenset[int] = frozenset()) -> None:
        """Run ``work`` plainly, or captured, or as a replay (see the module docstring).
        ``write_first``: ``id``s of memories ``work`` writes whole before reading them; a replay that
        writes them does not upload their host copies first."""
        if key in self._failed:
            work()
            return
        entry = self._graphs.get(key)
        if entry is None:
            if key not in self._warm:  # the warm-up run tunes engines for replay (device time)
                self._warm.add(key)
                with conv_engines.graph_timing():
                    work()
                return
            with conv_engines.graph_timing():
                entry = self._capture(key, work)
            if entry is None:
                work()
                return
        else:
            self._upload_host_writes(write_first & entry[2] if write_first else (), entry[3])
        graph, written, _, _ = entry
        graph.launch()
        for mem in written:
            mem.mark_device_newest()
        self.replays += 1

    def _capture(self, key: Hashable, work: Callable[[], None]):
        self._upload_host_writes()
        heads = [(m, m.head) for m in self._memories()]
        recording = cuda_graph.Recording()
        try:
            with cuda_graph.capture(recording):
                work()
        except Exception as exc:
            # Nothing ran: put back the head states the aborted capture changed, then run plainly.
            for mem, head in heads:
                mem.head = head
            self._failed.add(key)
            self.fallbacks.append(f"{key}: {type(exc).__name__}: {exc}")
            log.info("CUDA graph capture not possible here (%s); running without graphs", exc)
            return None
        assert recording.graph is not None
        written = list(recording.written)
        entry = (recording.graph, written, frozenset(id(m) for m in written),
                 frozenset(id(m) for m in recording.touched))
        self._graphs[key] = entry
        self.captures += 1
        return entry


class Executor:
    """Runs ``net``'s layers on the current device; see the module docstring."""

    def __init__(self, net: NetGraph) -> None:
        self.net = net  # the graph this executor runs
        self.use_graphs = graphs_enabled()
        self._graphs = _Graphs(self._memories)
        self.fusions = {chain.first: chain for chain in find_fusions(net)}
        self._folds = [chain for chain in self.fusions.values() if isinstance(chain, ConvBNScale)]
        self._norm_chains = {chain.last: chain for chain in self.fusions.values() if isinstance(chain, NormChain)}
        # chains whose backward runs as one, by their last layer
        self._backward_chains: dict[int, ConvReLU | NormChain | SumReLU | ReLUMaxPool] = {
            **{chain.last: chain for chain in self.fusions.values() if isinstance(chain, ConvReLU | NormChain | SumReLU)},
            **{chain.last: chain for chain in find_backward_fusions(net)}}
        self._fold_key: tuple | None = None
        self._written_first: dict[tuple[int, int], frozenset[int]] = {}  # blob ids by backward range
        self.loss_log: LossLog | None = None
        self._recompute: list | None = None  # (layer index, *memory_plan.recomputable_inputs entry)
        # -- per-layer hooks (pycaffe's Net.before_forward & co.; multi-GPU gradient reduction) --
        # hook(layer_index) around every layer of a pass. A hook with ``graph_safe = True`` only
        # queues device work and may be captured in whole-iteration graphs; any other hook makes
        # the passes run plainly.
        self.hooks: dict[str, list[Callable[[int], None]]] = {k: [] for k in HOOK_KINDS}
        self._watching = False  # the blobs' on_access hooks are set (_update_access_hooks)
        # nets that never run backward
        self.shared_data = SharedData(net, self.hooks, self._run_forward, self._update_access_hooks,
                                      skippable=[chain.skipped for chain in self._folds if chain.skipped])
        self.shared_diffs = SharedDiffs(net, self.hooks, self._run_backward, self._update_access_hooks)
        regenerated_from = {id(source) for _, _, source in recomputable_inputs(net)}
        self.forward_data = ForwardOnlyData(net, self.hooks, self._update_access_hooks,  # nets that run backward
                                            exclude={b for b, blob in enumerate(net.blobs) if id(blob) in regenerated_from})
        self.training_data = TrainingData(net, self.hooks, self._update_access_hooks)  # training iterations
        self.shared_diffs.guest = self.training_data
        self.shared_diffs.not_read_by_backward(self.forward_data.candidates | self.training_data.candidates)
        self._loss_layers = [i for i, layer in enumerate(net.layers) if layer.has_loss]
        # A loss top that a later layer rewrites in place must be read right after its layer.
        self._read_loss_early = {
            i for i in self._loss_layers
            if any(set(net.top_id_vecs[i]) & set(net.top_id_vecs[j]) for j in range(i + 1, len(net.layers)))
        }

    # -- what graphs may capture ----------------------------------------------------------------
    @property
    def replays(self) -> int:
        """CUDA graph replays so far (0 when graphs are off or unused)."""
        return self._graphs.replays

    @property
    def captures(self) -> int:
        return self._graphs.captures

    @property
    def fallbacks(self) -> list[str]:
        """Why a capture was abandoned, one line per key."""
        return self._graphs.fallbacks

    def _on_gpu(self) -> bool:
        return self.use_graphs and common.mode() is common.Mode.GPU

    def _capturable(self, start: int, end: int, safe_hooks: bool = False) -> bool:
        """GPU mode, graphs on, layers ``start..end`` on the device, and no hooks (``safe_hooks``:
        hooks marked ``graph_safe`` allowed, as inside whole training iterations)."""
        hooks = [fn for fns in self.hooks.values() for fn in fns]
        if hooks and not (safe_hooks and all(getattr(fn, "graph_safe", False) for fn in hooks)):
            return False
        layers = self.net.layers
        return self._on_gpu() and all(runs_on_device(layers[i]) for i in range(start, end + 1))

    def _call_hooks(self, kind: str, layers) -> None:
        for fn in self.hooks[kind]:
            for i in layers:
                fn(i)

    def _first_device_layer(self, start: int, end: int) -> int:
        """The first layer of ``start..end`` after the leading host-side ones (end + 1 if none)."""
        i = start
        while i <= end and not runs_on_device(self.net.layers[i]):
            i += 1
        return i

    def _memories(self) -> Iterator[SyncedMemory]:
        net = self.net
        for blob in (*net.blobs, *net.params_list):
            yield blob.data_memory
            yield blob.diff_memory
        for chain in self.fusions.values():
            for blob in chain.extra_blobs:
                yield blob.data_memory

    def _key(self, tag: tuple) -> tuple:
        # set_random_seed re-keys device generators (Dropout), which graphs recorded: re-capture.
        # Whether Scale layers save their inputs or regenerate them is recorded in graphs too.
        # So is whether each BatchNorm chain's backward runs as one (its last forward was the chain's).
        regenerated = tuple(scale.recompute_input is not None for _, scale, _, _ in self._recomputed())
        chained = tuple(chain.runs_backward() for chain in self._norm_chains.values())
        # Where the training iterations' forward-only data lives (the gradient slots or memory of its own).
        return (tag, common.context().generation(), sharing_enabled(), regenerated, chained,
                self.shared_data.skipping, len(self.shared_data.keep), self.training_data.epoch)

    def _refold(self) -> None:
        """Write the folded parameters of the Convolution -> BatchNorm -> Scale chains when one of the
        blobs they come from may have changed since they were last written (outside graphs)."""
        if not self._folds:
            return
        key = (watched_writes(), shape_generation(), common.mode())
        if key == self._fold_key:
            return
        for chain in self._folds:
            for blob in chain.sources:
                blob.data_memory.watched = True
            chain.fold()
        self._fold_key = (watched_writes(), shape_generation(), common.mode())

    # -- user access to blobs, for the memory plans -------------------------------------------
    def _update_access_hooks(self) -> None:
        """Point every blob's and param's ``on_access`` at :meth:`_on_access` while a plan watches."""
        watching = (self.shared_data.watching or self.shared_diffs.watching or self.forward_data.watching
                    or self.training_data.watching)
        if watching == self._watching:  # every pass asks: walk the blobs only on a change
            return
        self._watching = watching
        hook = self._on_access if watching else None
        for blob in (*self.net.blobs, *self.net.params_list):
            blob.on_access = hook

    def _on_access(self, blob, what: str) -> None:
        if self.training_data.watching:
            self.training_data.access(blob, what)
        if self.forward_data.watching:
            self.forward_data.access(blob, what)
        if self.shared_data.watching:
            self.shared_data.access(blob, what)
        if self.shared_diffs.watching:
            self.shared_diffs.access(blob, what)

    # -- plain execution ------------------------------------------------------------------------
    def _chain_at(self, i: int, end: int) -> ConvReLU | ConvBNScale | NormChain | SumReLU | None:
        chain = self.fusions.get(i)
        if chain is None or chain.last > end:
            return None
        if isinstance(chain, ConvBNScale) and chain.skipped and not self.shared_data.may_skip(chain.skipped):
            return None
        if isinstance(chain, NormChain | SumReLU) and common.mode() is not common.Mode.GPU:
            return None
        return chain

    def _backward_chain_at(self, i: int, end: int) -> ConvReLU | NormChain | SumReLU | ReLUMaxPool | None:
        """The chain whose last layer is ``i`` if backward runs it as one: all of it in the range
        down to ``end``, every layer of it needing backward, on the GPU, and (a BatchNorm chain)
        its forward the chain's."""
        chain = self._backward_chains.get(i)
        if chain is None or chain.first < end or common.mode() is not common.Mode.GPU:
            return None
        need = self.net.layer_need_backward
        if not all(need[k] for k in range(chain.first, chain.last + 1)) or not chain.runs_backward():
            return None
        return chain

    def _run_forward(self, start: int, end: int, fold: bool = False) -> None:
        """Layers ``start..end``; ``fold``: fused chains write their folded parameters first (inside
        a training iteration's graph), else :meth:`_refold` keeps them current."""
        net = self.net
        i = start
        while i <= end:
            chain = self._chain_at(i, end)
            if chain is not None:
                self._call_hooks("before_forward", range(i, chain.last + 1))
                chain.forward(net.bottom_vecs[i], net.top_vecs[i], fold=fold)
                self._call_hooks("after_forward", range(i, chain.last + 1))
                i = chain.last + 1
                continue
            self._call_hooks("before_forward", (i,))
            net.layers[i].compute_forward(net.bottom_vecs[i], net.top_vecs[i])
            self._call_hooks("after_forward", (i,))
            i += 1

    def _run_backward(self, start: int, end: int) -> None:
        net = self.net
        # a user's per-layer hook sees each layer's backward on its own; device-only hooks (gradient
        # reduction across GPUs, marked graph_safe) run around a chain as around its layers
        chains = all(getattr(fn, "graph_safe", False) for fns in self.hooks.values() for fn in fns)
        i = start
        while i >= end:
            chain = self._backward_chain_at(i, end) if chains else None
            if chain is not None:
                span = range(i, chain.first - 1, -1)
                self._call_hooks("before_backward", span)
                chain.backward(net.bottom_need_backward[chain.first])
                self._call_hooks("after_backward", span)
                i = chain.first - 1
                continue
            self._call_hooks("before_backward", (i,))
            if net.layer_need_backward[i]:
                net.layers[i].backward(net.top_vecs[i], net.bottom_need_backward[i], net.bottom_vecs[i])
            self._call_hooks("after_backward", (i,))
            i -= 1

    def losses(self, start: int, end: int) -> float:
        """Σ loss_weight·top over the loss layers of ``start..end``, read from the device once."""
        net = self.net
        layers = [i for i in self._loss_layers if start <= i <= end]
        tops = [blob for i in layers for t, blob in enumerate(net.top_vecs[i]) if net.layers[i].loss(t)]
        loss = weighted_sum(tops)
        if math.isnan(loss):  # a layer may know why (a bad label flagged on the device): let it say
            for i in layers:
                net.layers[i].explain_nonfinite_loss()
        return loss

    # -- ranges ---------------------------------------------------------------------------------
    def forward(self, start: int, end: int, training: bool = False) -> float:
        """Run layers ``start..end`` (inclusive); the summed weighted loss of their loss tops.
        ``training``: the forward of :meth:`forward_backward`'s training iteration."""
        self._refold()
        on = self._recompute_on()
        pairs = self._set_recompute(start, end, on)
        if not training:
            self.training_data.before_forward()
        with self.shared_data.forward(start, end), self.forward_data.forward(start, end):
            loss = self._forward(start, end)
        if not training:
            self.training_data.forwarded(start, end)
        self._note_norm_chains(start, end)
        pairs = [(k, source) for k, source in pairs if self.net.layer_need_backward[k]]
        if pairs:  # what their backward regenerates the input from must not change until then
            self.shared_diffs.regenerating(pairs, on)
        return loss

    def _note_norm_chains(self, start: int, end: int) -> None:
        """After a forward over ``start..end``: which BatchNorm chains it ran as one (host state that
        a replayed graph does not set)."""
        on_gpu = common.mode() is common.Mode.GPU
        for chain in self._norm_chains.values():
            if chain.last >= start and chain.first <= end:
                chain.ran_forward(on_gpu and start <= chain.first and chain.last <= end)

    # -- recomputed Scale inputs (memory_plan.recomputable_inputs) -------------------------------
    def _recomputed(self) -> list[tuple[int, Layer, Layer, Blob]]:
        if self._recompute is None:  # depends on the net's structure only
            index = {id(layer): k for k, layer in enumerate(self.net.layers)}
            self._recompute = [(index[id(scale)], scale, bn, source)
                               for scale, bn, source in recomputable_inputs(self.net)]
        return self._recompute

    def _recompute_on(self) -> bool:
        """pycaffe forwards on the GPU with shared diffs on keep no saved Scale inputs either."""
        return sharing_enabled() and common.mode() is common.Mode.GPU

    def _set_recompute(self, start: int, end: int, on: bool) -> list[tuple[int, Blob]]:
        """Before a forward over ``start..end``: its Scale layers whose input a BatchNorm can
        regenerate keep no copy of it when ``on`` (their backward regenerates it), else they save
        it. Returns those layers' ``(index, source blob)``."""
        pairs = []
        for k, scale, bn, source in self._recomputed():
            if start <= k <= end:
                scale.recompute_input = functools.partial(bn.regenerate_top_into, source) if on else None
                pairs.append((k, source))
        return pairs

    def _forward(self, start: int, end: int) -> float:
        if any(start <= i <= end for i in self._read_loss_early):
            return self._forward_reading_early(start, end)
        first = self._first_device_layer(start, end)
        self._run_forward(start, first - 1)
        if first <= end:
            if self._capturable(first, end):
                self._graphs.run(self._key(("forward", first, end)), lambda: self._run_forward(first, end))
            else:
                self._run_forward(first, end)
        return self.losses(start, end)

    def _forward_reading_early(self, start: int, end: int) -> float:
        loss = 0.0
        for i in range(start, end + 1):
            self._run_forward(i, i)
            if i in self._read_loss_early:
                loss += self.losses(i, i)
        later = [i for i in self._loss_layers if start <= i <= end and i not in self._read_loss_early]
        return loss + sum(self.losses(i, i) for i in later)

    def forward_backward(self, training: bool = False) -> float:
        """Forward through every layer, then backward through every layer; the weighted loss.
        ``training``: a solver's plain training iteration, whose forward-only data lives in the
        backward's gradient slots (:attr:`training_data`)."""
        last = len(self.net.layers) - 1
        if not training:
            loss = self.forward(0, last)
            self.backward(last, 0)
            return loss
        self.shared_diffs.prepare(last, 0, data=True, forward_next=True)  # the slots, before the forward
        with self.training_data.iteration():
            loss = self.forward(0, last, training=True)
            self.backward(last, 0, data=True)
        return loss

    def backward(self, start: int, end: int, data: bool = False) -> None:
        """Backward through layers ``start`` down to ``end`` (inclusive, ``start >= end``);
        ``data``: :meth:`forward_backward`'s training iteration."""
        with self.shared_diffs.backward(start, end, data=data):  # planned before the graph key is taken
            self._backward(start, end)

    def _input_diffs_written_first(self, start: int, end: int) -> frozenset[int]:
        """``id``s of the diff memories of net inputs that backward over ``start..end`` assigns
        whole before any layer reads them: an input (a net input or an Input layer's top, written by
        no other layer) read by one layer of the range whose backward writes all of that bottom's
        diff (pycaffe returns these diffs as host arrays, which need no upload before the next
        backward). The blobs are found once per range (they depend on the net's structure only);
        their memories are asked for each time (a reshape may replace them)."""
        found = self._written_first.get((start, end))
        if found is None:
            found = self._written_first[(start, end)] = self._input_blobs_written_first(start, end)
        return frozenset(id(self.net.blobs[b].diff_memory) for b in found)

    def _input_blobs_written_first(self, start: int, end: int) -> frozenset[int]:
        net, out = self.net, set()
        for b in source_blobs(net):
            if any(b in tops for k, tops in enumerate(net.top_id_vecs) if net.bottom_id_vecs[k]):
                continue
            readers = [(k, i) for k, bottoms in enumerate(net.bottom_id_vecs) for i, bid in enumerate(bottoms) if bid == b]
            if len(readers) != 1:
                continue
            k, i = readers[0]
            if (end <= k <= start and net.layer_need_backward[k] and net.bottom_need_backward[k][i]
                    and net.layers[k].writes_bottom_diff(i)):
                out.add(b)
        return frozenset(out)

    def _backward(self, start: int, end: int) -> None:
        low = self._first_device_layer(end, start)  # data readers at the bottom run plainly, last
        if low <= start and self._capturable(low, start):
            self._graphs.run(self._key(("backward", start, low)), lambda: self._run_backward(start, low),
                             self._input_diffs_written_first(start, low))
        else:
            self._run_backward(start, low)
        self._run_backward(low - 1, end)

    def clear_param_diffs(self) -> None:
        """Zero the gradients of every learnable param."""
        on_gpu = common.mode() is common.Mode.GPU
        for blob in self.net.learnable_params:
            if on_gpu:
                backend.memset_zero(blob.mutable_gpu_diff(), blob.count * blob.dtype.itemsize)
            else:
                blob.mutable_cpu_diff()[...] = 0

    # -- the training iteration -----------------------------------------------------------------
    def can_replay_iteration(self) -> bool:
        """True when a whole training iteration (past the data readers) can be one graph: GPU mode,
        graphs on, and the layers that need backward all run device code."""
        net = self.net
        last = len(net.layers) - 1
        first = self._first_device_layer(0, last)
        if first > last or any(net.layer_need_backward[i] and _has_backward(net.layers[i]) for i in range(first)):
            return False
        return self._capturable(first, last, safe_hooks=True)

    def train_iteration(self, update: Callable[[], None], tag: Hashable = "") -> None:
        """Queue one iteration on the GPU: clear param diffs, forward, backward, ``update()`` (the
        solver's device update), and record the weighted loss in :attr:`loss_log`; everything after
        the data layers is replayed as one CUDA graph. Needs :meth:`can_replay_iteration`. The
        host does not wait: read the losses with ``loss_log.read()``."""
        net = self.net
        last = len(net.layers) - 1
        first = self._first_device_layer(0, last)
        self._run_forward(0, first - 1)
        tops = [blob for i in self._loss_layers for t, blob in enumerate(net.top_vecs[i]) if net.layers[i].loss(t)]
        if self.loss_log is None or self.loss_log.dtype != net.dtype:
            self.loss_log = LossLog(net.dtype)
        log_ = self.loss_log

        def work() -> None:
            # No saved Scale inputs inside this iteration; the layers stay so afterwards, as their
            # last forward left them (a backward without a new forward regenerates the input too).
            self._set_recompute(first, last, sharing_enabled())
            self.clear_param_diffs()
            self._run_forward(first, last, fold=True)
            self._note_norm_chains(first, last)  # the backward below reads it
            log_.record(tops)
            self._run_backward(last, first)
            update()

        # planned before the graph key is taken (forward-only data in the gradient slots too)
        with self.shared_diffs.backward(last, first, train=True, data=True), self.training_data.iteration():
            self._graphs.run(self._key(("train", first, tag)), work)
        self._note_norm_chains(first, last)
        on = sharing_enabled()
        self.shared_diffs.regenerating([(k, source) for k, _, _, source in self._recomputed()
                                        if k >= first and net.layer_need_backward[k]], on)
        log_.pending += 1


LOSS_LOG_KERNELS = Path(__file__).with_name("loss_log.cu")


class LossLog:
    """Weighted losses of queued training iterations, kept on the device until :meth:`read`."""

    CAPACITY = 512

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        self._log = backend.alloc(self.CAPACITY * self.dtype.itemsize)
        self._counter = backend.alloc(4)
        backend.memset_zero(int(self._counter), 4)
        self.pending = 0  # iterations recorded and not read yet
        self._no_tops = False

    @property
    def full(self) -> bool:
        return self.pending >= self.CAPACITY

    def record(self, tops: list) -> None:
        """Queue: log[counter] = Σ vdot(top.data, top.diff); counter += 1 (capturable)."""
        add = backend.kernel(LOSS_LOG_KERNELS, "loss_log_add", self.dtype)
        for k, top in enumerate(tops):
            add(top.count, top.gpu_data(), top.gpu_diff(), int(self._log), int(self._counter), self.CAPACITY,
                int(k == 0), grid=1, block=256)
        self._no_tops = not tops
        backend.kernel(LOSS_LOG_KERNELS, "loss_log_advance", self.dtype)(int(self._counter), grid=1, block=1)

    def read(self) -> list[float]:
        """The pending losses, oldest first (one host sync)."""
        if not self.pending or self._no_tops:
            out, self.pending = [0.0] * self.pending, 0
            return out
        values = np.empty(self.CAPACITY, self.dtype)
        counter = np.empty(1, np.int32)
        backend.memcpy_dtoh(counter, int(self._counter))
        backend.memcpy_dtoh(values, int(self._log))
        end = int(counter[0])
        out = [float(values[i % self.CAPACITY]) for i in range(end - self.pending, end)]
        self.pending = 0
        return out
