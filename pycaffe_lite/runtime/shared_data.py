"""Shared intermediate data in nets that never run backward: :class:`SharedData` applies
:func:`~.memory_plan.shared_data_slots` and keeps pycaffe's semantics."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from .. import common
from ..blob import Blob
from ..errors import NetError
from ..synced_memory import SyncedMemory
from .memory_plan import (
    BlobLayout,
    data_sharing_enabled,
    point_data_into_slots,
    shared_data_slots,
    source_blobs,
)

if TYPE_CHECKING:
    from ..net_graph import NetGraph

log = logging.getLogger("pycaffe_lite")


class SharedData:
    """Applies :func:`shared_data_slots` to a net's forwards, keeping pycaffe's semantics.

    Before a full forward of a net that runs no backward (no layer needs it, no per-layer hooks, no
    layer with outside effects: Python, HDF5Output, no layer rewriting a source in place), the data of the planned blobs is pointed into
    one buffer per slot: a numpy array on the CPU, a device allocation on the GPU (planned again
    when shapes or the mode change). After the forward, every member of a slot but the last is
    *stale*: a later blob overwrote it. Every net blob and param blob then reports user access
    through its ``data``/``diff`` properties (layers never use those; :meth:`access`):

    - a source (input, data reader top) is copied (at the end of the forward when its host copy is
      current, else on its first access), and so is a param blob of the net on its first access,
      so that a re-run can check they still hold what the forward consumed (an array kept from an
      earlier ``data`` access may have been written). Weights changed otherwise (loaded, trained
      through another net sharing them) are not noticed: a re-run uses the current ones;
    - a shared blob un-shares the net for good: every blob gets memory of its own holding its
      current values (one INFO line says so);
    - a stale blob is recomputed: the last forward is re-run (every layer but the sources, whose
      tops still hold what it read) and the values of blobs that were not stale (which the user
      may have changed) are put back. If a source changed since, a NetError says why instead.

    ``keep`` (``Net.forward(blobs=...)`` adds to it before running) is never shared. Ranges: a
    forward over part of the net turns sharing off for that net for good; it first un-shares and,
    when the range starts after layer 0 and stale values exist, re-runs the last full forward so
    the range reads what pycaffe would give it. A range from layer 0 recomputes what it produces;
    values after it stay stale (recomputed when read, if the sources are unchanged).
    """

    def __init__(self, net: NetGraph, hooks: Mapping[str, list], run_forward: Callable[[int, int], None],
                 watch_changed: Callable[[], None], skippable: Sequence[frozenset[int]] = ()) -> None:
        self.net = net
        self.layout = BlobLayout(net)  # the part of the plan key reshapes change
        self.watch_changed = watch_changed  # the executor (re)sets the blobs' on_access hooks
        self.watching = False
        self.hooks = hooks  # the executor's per-layer hooks: none may be set while data is shared
        self.run_forward = run_forward  # the executor's plain forward over a layer range
        self.keep: set[int] = set()
        self.disabled = False  # un-shared for good
        self.stale: set[int] = set()
        self.slots: list = []  # the slot buffers (numpy arrays or device allocations)
        self._slot_bytes: list[int] = []
        self._overwritten: set[int] = set()  # blob ids a later member of their slot overwrites
        self._key: tuple | None = None
        self._memories: list[SyncedMemory] = []  # memories pointed into slots
        self._planned: set[int] = set()  # blob ids of those memories
        self._sources = source_blobs(net)
        # What a re-run reads besides the net's own values: sources and weights, by id(Blob)
        self._consumed: dict[int, tuple[Blob, np.ndarray]] = {}  # -> (blob, values the forward read)
        self._names = {id(blob): f"'{name}'" for name, blob in zip(net.blob_names, net.blobs)}
        self._names.update({id(blob): f"the weights of layer '{net.layer_names[k]}' (param {i})"
                            for blob, (k, i) in zip(net.params_list, net.param_layer_indices)})
        # A re-run repeats every layer but the sources: none may rewrite a source in place or act
        # outside the net.
        rewritten = {b for k, bottoms in enumerate(net.bottom_id_vecs) if bottoms for b in net.top_id_vecs[k]}
        self._can_share = not any(net.layer_need_backward) and not rewritten & self._sources and not any(
            layer.traits.outside_effects for layer in net.layers)
        self._sources_replaced = False
        self._running = False
        self._ids = {id(blob): bid for bid, blob in enumerate(net.blobs)}
        # Intermediate blobs of folded out-of-place chains (fusion.ConvBNScale.skipped): a forward
        # that shares data may leave them unwritten (stale) until a user reads one.
        self._skippable = [s for s in skippable if s]
        self._skips_allowed = True  # until a user reads a skipped blob
        self.skipping = False  # the forward in progress (or last) skips them

    def planned_bytes(self) -> tuple[int, int]:
        """(bytes of the slot buffers, bytes the memories pointed into them would take alone)."""
        return sum(self._slot_bytes), sum(m.nbytes for m in self._memories)

    def _eligible(self) -> bool:
        return self._can_share and data_sharing_enabled() and not self.disabled and not any(self.hooks.values())

    def _set_hooks(self, on: bool) -> None:
        self.watching = on
        self.watch_changed()

    def _forget_plan(self) -> None:
        self._memories, self._planned, self._overwritten, self.slots, self._slot_bytes = [], set(), set(), [], []
        self._key = None

    def _drop_plan(self) -> None:
        for mem in self._memories:
            mem.use_storage()
        self._forget_plan()

    def _plan(self) -> None:
        on_gpu = common.mode() is common.Mode.GPU
        key = (self.layout.key(), on_gpu, frozenset(self.keep))
        if key == self._key:
            return
        self._drop_plan()  # the forward about to run recomputes every planned value
        applied = point_data_into_slots(self.net, shared_data_slots(self.net, self.keep), on_gpu)
        self.slots, self._slot_bytes, self._memories = applied.buffers, applied.nbytes, applied.memories
        self._planned, self._overwritten = applied.planned, applied.overwritten
        self._key = key

    # -- the executor's side ----------------------------------------------------------------------
    @contextmanager
    def forward(self, start: int, end: int) -> Iterator[None]:
        """Around the executor's forward over layers ``start..end``."""
        full = start == 0 and end == len(self.net.layers) - 1
        if not full:
            self.disabled = True
            self.skipping = False
            if self._memories:
                self._unshare(f"a forward over layers {start}..{end}")
            if start > 0 and self.stale:
                self._rematerialise(f"the forward from layer '{self.net.layer_names[start]}'")
        elif self._eligible():
            self._plan()
        elif self._memories:
            self._drop_plan()
        self.skipping = full and self._skips_allowed and self._eligible() and bool(self._skippable)
        blobs = self.net.blobs
        self._running = ok = True
        try:
            yield
        except BaseException:
            ok = False
            raise
        finally:
            self._running = False
            if full:  # what a failed forward left in shared memory is undefined: stale
                self.stale = set(self._overwritten if ok else self._planned) | self._skipped()
                self._sources_replaced = False
                # The sources' values a re-run must find again: host copies now when they are
                # current (no device traffic), the others on their first access (access).
                self._consumed = {id(blobs[b]): (blobs[b], blobs[b].cpu_data().copy()) for b in self._sources
                                  if self.stale and not blobs[b].data_memory.device_is_newer()}
            elif ok:  # blobs sharing memory with what the range produced hold fresh values
                fresh = {id(blobs[b].data_memory) for k in range(start, end + 1) for b in self.net.top_id_vecs[k]}
                self.stale = {b for b in self.stale if id(blobs[b].data_memory) not in fresh}
            self._set_hooks(bool(self._memories or self.stale))

    def may_skip(self, bids: frozenset[int]) -> bool:
        """Whether the forward in progress may leave these intermediate blobs unwritten."""
        return self.skipping and not bids & self.keep

    def _skipped(self) -> set[int]:
        return {b for bids in self._skippable if self.may_skip(bids) for b in bids}

    def keep_blobs(self, bids: Collection[int]) -> None:
        """Give these blobs memory of their own from the next forward on (``forward(blobs=...)``)."""
        self.keep.update(bids)

    def sources_replaced(self) -> None:
        """The net is about to write new input values (``Net.forward(**inputs)``)."""
        self._sources_replaced = True

    # -- user access ------------------------------------------------------------------------------
    def access(self, blob: Blob, what: str = "data") -> None:
        """A user accessed ``blob.data`` or ``blob.diff`` (the executor calls this while watching)."""
        if self._running:  # a Python layer or hook inside the forward
            return
        bid = self._ids.get(id(blob))
        if bid is None or bid in self._sources:  # a weight or a source: what a re-run reads
            if self.stale and id(blob) not in self._consumed:
                self._consumed[id(blob)] = (blob, blob.cpu_data().copy())
            return
        if bid in self._planned:
            self._unshare(f"blob '{self.net.blob_names[bid]}' was accessed")
        if bid in self.stale and bid in self._skipped():
            self._stop_skipping(f"blob '{self.net.blob_names[bid]}'")
        if bid in self.stale:
            self._rematerialise(f"blob '{self.net.blob_names[bid]}'")
        if not self.stale and not self._memories:
            self._set_hooks(False)

    def _stop_skipping(self, what: str) -> None:
        self._skips_allowed = self.skipping = False
        log.info("net '%s': %s is the intermediate result of a folded Convolution -> BatchNorm -> Scale "
                 "chain; from now on the net runs such chains written out of place layer by layer "
                 "(forward(blobs=[...]) keeps a chain's blobs and its folding)", self.net.name, what)

    def _unshare(self, why: str) -> None:
        for mem in self._memories:
            mem.own_storage()
        self._forget_plan()
        self.disabled = True
        log.info("net '%s': %s, so its intermediate blobs get memory of their own from now on "
                 "(they shared memory; PYCAFFE_LITE_SHARE_DATA=0 or forward(blobs=[...]) avoid this)",
                 self.net.name, why)

    def _rematerialise(self, what: str) -> None:
        """Re-run the last forward (sources excluded) to recompute the stale values ``what`` needs."""
        net = self.net
        changed = [self._names[key] for key, (blob, values) in self._consumed.items()
                   if not np.array_equal(blob.cpu_data(), values, equal_nan=True)]
        if changed or self._sources_replaced:
            names = ", ".join(changed) or "its inputs"
            raise NetError(
                f"net '{net.name}': {what} needs values of the last forward that are gone: the net shares "
                f"memory between intermediate blobs whose values are not needed at the same time, and "
                f"recomputing them needs that forward's inputs, but {names} changed since. Ask for the blobs "
                f"you read with net.forward(blobs=[...]) (they are then kept), or set "
                f"PYCAFFE_LITE_SHARE_DATA=0 to keep every blob")
        valid = {id(blob.data_memory): (blob, blob.cpu_data().copy()) for b, blob in enumerate(net.blobs)
                 if b not in self.stale and b not in self._sources}
        layers = {k for k in range(len(net.layers)) if net.bottom_id_vecs[k]}
        self._running = True
        try:
            for k in sorted(layers - {k + 1 for k in layers}):  # runs of consecutive layers (whole fusions)
                end = k
                while end + 1 in layers:
                    end += 1
                self.run_forward(k, end)
        finally:
            self._running = False
        for blob, values in valid.values():
            blob.mutable_cpu_data()[...] = values
        self.stale = self._skipped()  # a re-run that skips leaves them unwritten again
