"""Data only forward passes read, in TRAIN nets driven by whole training iterations:
:class:`TrainingData` places the memory of :func:`~.memory_plan.forward_only_blobs` (``training``)
inside the gradient slots :class:`~.shared_diffs.SharedDiffs` plans for the same iteration
(:func:`~.memory_plan.training_slots`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..blob import Blob
from ..errors import NetError
from ..synced_memory import SyncedMemory
from .memory_plan import data_sharing_enabled, point_into, shared_data_slots, training_data_blobs

if TYPE_CHECKING:
    from ..net_graph import NetGraph

log = logging.getLogger("pycaffe_lite")


class TrainingData:
    """The forward-only data of a TRAIN net's training iterations (the solver's step: forward,
    backward, update; :meth:`Executor.train_iteration` and the plain iteration's
    ``forward_backward(training=True)``), kept in the iteration's gradient slots.

    :func:`forward_only_blobs` with ``training``: blobs whose data no backward reads (ResNet's
    Convolution -> BatchNorm -> Scale blobs that feed only an Eltwise SUM). They share memory by
    forward lifetime [producer, last consumer] (:func:`shared_data_slots`), and those buffers live
    inside the backward's gradient slots, idle during the forward: :class:`SharedDiffs` plans both
    before the iteration (before a graph key is taken; a re-plan allocates, so graphs are captured
    again) and calls :meth:`place`. Never shared: sources, outputs, loss tops, params and memory a
    layer holds, data some backward reads, a BatchNorm's input a regenerated Scale input comes from
    (:func:`training_data_blobs`).

    After an iteration every planned blob is *stale* (its memory held gradients since), but the
    last of a slot that held data only, which is current. Reading a stale blob's ``data`` is a
    NetError naming it, and the net stops sharing training data for good from the next iteration
    on (which keeps every blob); reading a current one gives it memory of its own holding its
    values and stops sharing too. Writing one whole (``blob.data = x``) gives it memory of its own
    until the next iteration. A forward that is not a training iteration (pycaffe's
    ``net.forward()``) runs on memory of their own, as without this plan, and the blobs it writes
    are current again. ``config.share_data`` off (``PYCAFFE_LITE_SHARE_DATA=0``), a layer with
    outside effects or a per-layer hook that is not ``graph_safe``: nothing is shared; with
    ``config.share_diffs`` off there are no gradient slots, so nothing is placed either."""

    def __init__(self, net: NetGraph, hooks: Mapping[str, list], watch_changed: Callable[[], None]) -> None:
        self.net = net
        self.hooks = hooks
        self.watch_changed = watch_changed
        self.watching = False
        self.disabled = False  # a user read a planned blob: nothing shared from the next iteration on
        self.candidates = training_data_blobs(net)
        self.stale: set[int] = set()
        self.placed = False  # the planned memories point into the slots now
        # Bumped whenever memories move into or out of the slots: part of the executor's graph keys,
        # as a graph captured with one placement must not replay with another (memory of their own
        # is allocated on first use, after the key of the pass that allocates it was taken).
        self.epoch = 0
        self._planned: dict[int, SyncedMemory] = {}  # blob id -> its data memory, pointed into a slot
        self._current: set[int] = set()  # planned blobs the iteration leaves holding their values
        self._ids = {id(blob): bid for bid, blob in enumerate(net.blobs)}

    def eligible(self) -> bool:
        """Whether the next training iteration shares the candidates' data."""
        hooks = [fn for fns in self.hooks.values() for fn in fns]
        return (bool(self.candidates) and data_sharing_enabled() and not self.disabled
                and all(getattr(fn, "graph_safe", False) for fn in hooks))

    def plan(self) -> list[tuple[int, list[list[int]]]]:
        """The forward-lifetime slots of the candidates (empty when not :meth:`eligible`)."""
        return shared_data_slots(self.net, only=self.candidates) if self.eligible() else []

    def key(self) -> tuple:
        """What the plan depends on besides shapes and the mode (part of SharedDiffs' plan key)."""
        return (self.eligible(),)

    def place(self, slots: Sequence[tuple[object, list[list[int]], bool]], on_gpu: bool) -> None:
        """Point each group's data memory into its slot: ``(buffer, groups in forward order, whether
        gradients use the buffer after the forward)``."""
        self.release()
        for buffer, groups, with_diffs in slots:
            for bids in groups:
                mem = self.net.blobs[bids[0]].data_memory
                point_into(mem, buffer, on_gpu)
                self._planned.update((b, mem) for b in bids)
            if not with_diffs:
                self._current.update(groups[-1])
        self.placed = bool(self._planned)
        self.epoch += 1

    def release(self) -> None:
        """The planned memories back in memory of their own, allocated on first use (their values
        are stale or about to be written by a forward)."""
        for mem in {id(m): m for m in self._planned.values()}.values():
            mem.use_storage()
        self._planned, self._current, self.placed = {}, set(), False
        self.epoch += 1

    def planned_bytes(self) -> int:
        """Bytes the planned memories would take alone."""
        return sum({id(m): m.nbytes for m in self._planned.values()}.values())

    # -- the executor's side ----------------------------------------------------------------------
    @contextmanager
    def iteration(self) -> Iterator[None]:
        """Around a training iteration that :class:`SharedDiffs` planned with this data."""
        ok = False
        try:
            yield
            ok = True
        finally:
            self.stale = set(self._planned) - (self._current if ok else set())
            self._set_watch()

    def before_forward(self) -> None:
        """Before a forward that is not a training iteration: the planned blobs get memory of their
        own (as without this plan)."""
        if self.placed:
            self.release()

    def forwarded(self, start: int, end: int) -> None:
        """After such a forward over layers ``start..end``."""
        self.stale -= {b for k in range(start, end + 1) for b in self.net.top_id_vecs[k]}
        self._set_watch()

    def _set_watch(self) -> None:
        self.watching = bool(self.stale or self.placed)
        self.watch_changed()

    # -- user access ------------------------------------------------------------------------------
    def access(self, blob: Blob, what: str) -> None:
        """A user accessed ``blob.data`` / ``.diff`` (``what``; the executor calls this while watching)."""
        bid = self._ids.get(id(blob))
        if bid is None or what in ("diff", "set_diff") or (bid not in self.stale and bid not in self._planned):
            return
        net = self.net
        name = net.blob_names[bid]
        if what == "set_data":  # written whole: memory of its own until the next iteration places it
            mem = self._planned.get(bid)
            if mem is not None:
                mem.use_storage()
                self._unplan(mem)
                self.placed = False
                self.epoch += 1
            self.stale -= {b for b, other in enumerate(net.blobs) if other.data_memory is blob.data_memory}
            self._set_watch()
            return
        if not self.disabled:
            self.disabled = True
            log.info("net '%s': blob '%s' was read after a training iteration that shared its memory, so the "
                     "net keeps every blob's data from the next iteration on (PYCAFFE_LITE_SHARE_DATA=0 avoids "
                     "this)", net.name, name)
        if bid in self.stale:
            raise NetError(
                f"net '{net.name}': the data of blob '{name}' is gone: its memory was reused during the "
                f"training iteration (only that iteration's forward reads it, and its gradient buffers held it). "
                f"From the next iteration on the net keeps it (it stops sharing training data for good now); "
                f"set PYCAFFE_LITE_SHARE_DATA=0 (config.share_data) to keep every blob from the start")
        mem = self._planned[bid]  # the current last value of a data-only slot: keep it
        mem.own_storage()
        self._unplan(mem)
        self._set_watch()

    def _unplan(self, mem: SyncedMemory) -> None:
        """Forget the planned blobs whose data is ``mem`` (it has memory of its own now)."""
        self._planned = {b: m for b, m in self._planned.items() if m is not mem}
