"""Shared gradient buffers in every backward pass: :class:`SharedDiffs` applies
:func:`~.memory_plan.shared_diff_slots` and keeps pycaffe's semantics."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from .. import common
from ..blob import Blob, shape_generation
from ..errors import NetError
from ..gpu import backend
from ..synced_memory import SyncedMemory
from .memory_plan import (
    BackwardRange,
    BlobLayout,
    new_slot,
    point_into,
    shared_diff_slots,
    sharing_enabled,
    source_blobs,
    training_slots,
)

if TYPE_CHECKING:
    from ..net_graph import NetGraph
    from .training_data import TrainingData

log = logging.getLogger("pycaffe_lite")


class SharedDiffs:
    """Applies :func:`shared_diff_slots` to backward passes, keeping pycaffe's semantics.

    Before a backward over layers ``start..end`` of a net whose layers act only inside it (no
    layer with outside effects such as Python layers, no per-layer hooks), the diffs the range writes before reading
    them are pointed into one buffer per slot (numpy arrays on the CPU, device allocations on the
    GPU; planned again when the range, the shapes, the mode or :attr:`keep` change). Private
    always: the range's seeds (diffs it reads before writing: output and loss diffs, a gradient a
    user set), inputs and sources, outputs, loss tops, params, and :attr:`keep` (blobs named by
    ``backward(diffs=[...])``). After the pass, every planned diff but the last user of its slot
    is *stale*. User access (``data``/``diff`` properties, :meth:`access`) then keeps pycaffe's
    semantics:

    - reading a stale diff un-shares the net for good (every blob gets diff memory of its own; one
      INFO line names the blob) and re-runs the last backward plainly: the seeds get the values
      they had before it (copied before each pass, a dtod copy on the GPU), the params' diffs and
      every diff that was not stale are saved and put back afterwards (param gradients neither
      accumulate twice nor change, whatever a layer's backward does to them). Valid only while
      everything the pass read is unchanged: the data of every blob and param. A memory written
      since (``SyncedMemory.version``: a forward, a solver update, a load) makes a NetError say
      what changed and how to keep the diffs (``backward(diffs=[...])``,
      ``PYCAFFE_LITE_SHARE_DIFFS=0``); a blob whose ``data`` the user accessed is compared by value
      with a copy taken at that first access (on the GPU from the device copy, which a host array
      written without asking does not reach), and on the CPU the sources are copied after each
      pass (their kept arrays are the storage a re-run would read);
    - reading a planned diff that is not stale (its slot's last value) gives that blob diff memory
      of its own holding it, and keeps it private from the next plan on; setting a diff whole
      (``blob.diff = g``, ``backward(**{name: g})``) does the same and needs no recomputation,
      whereas ``blob.diff[...] = g`` reads first (the getter cannot tell);
    - a later backward supersedes the stale diffs it writes; stale diffs it reads (seeds) or leaves
      alone are recomputed first when possible (the net is un-shared then); otherwise a seed is a
      NetError and the others are *lost* (reading one is a NetError).

    Whole training iterations (``train=True``) share the same way but are never re-run: their
    update changed the weights, so reading a stale diff after one is a NetError.

    Training iterations (``data=True``, the solver's step) also hold the forward-only data of
    :attr:`guest` (:class:`~.training_data.TrainingData`) in these slots during their forward
    (:func:`~.memory_plan.training_slots`; :meth:`prepare` plans both before the forward).
    """

    def __init__(self, net: NetGraph, hooks: Mapping[str, list], run_backward: Callable[[int, int], None],
                 watch_changed: Callable[[], None]) -> None:
        self.net = net
        self.layout = BlobLayout(net)  # the part of the plan key reshapes change
        self.hooks = hooks  # the executor's per-layer hooks: none may be set while pycaffe passes share
        self.run_backward = run_backward  # the executor's plain backward over a layer range
        self.watch_changed = watch_changed  # the executor (re)sets the blobs' on_access hooks
        self.watching = False
        self.keep: set[int] = set()
        self.disabled = False  # un-shared for good (pycaffe passes)
        self.stale: set[int] = set()
        self.lost: dict[int, str] = {}  # blob id -> why its diff cannot be recomputed
        self.slots: list = []  # the slot buffers (numpy arrays or device allocations)
        self._slot_bytes: list[int] = []
        self._key: tuple | None = None
        self._groups: list[list[int]] = []  # planned groups of blob ids (one diff memory each)
        self._memories: list[SyncedMemory] = []  # their memories, pointed into slots
        self._slot_of: list[int] = []  # per planned group
        self._group_of: dict[int, int] = {}  # id(memory) -> planned group
        self._planned: dict[int, int] = {}  # blob id -> planned group (released ones removed)
        self._seed_buffers: list[tuple[SyncedMemory, object]] = []  # the range's seeds and their copies
        self._ranges: dict[tuple[int, int], BackwardRange] = {}
        self._ranges_shapes = -1
        self._can_share = any(net.layer_need_backward) and not any(layer.traits.outside_effects for layer in net.layers)
        # What re-running the last backward needs
        self._last: tuple[int, int] | None = None
        self._last_mode = common.Mode.CPU  # the mode that backward ran in (a re-run uses its state)
        self._why_not = "no backward ran"
        self._shapes: list[tuple[int, ...]] = []  # the blobs' shapes then
        self._versions: dict[int, tuple[SyncedMemory, int, str]] = {}  # id(data memory) -> (it, version, name)
        self._snapshots: dict[int, np.ndarray] = {}  # id(data memory) -> values at the first access
        self._inputs = [(blob, f"the data of blob '{name}'") for name, blob in zip(net.blob_names, net.blobs)]
        self._inputs += [(blob, f"the weights of layer '{net.layer_names[k]}' (param {i})")
                         for blob, (k, i) in zip(net.params_list, net.param_layer_indices)]
        self._sources = source_blobs(net)
        self._running = False
        self._ids = {id(blob): bid for bid, blob in enumerate(net.blobs)}
        # Scale layers whose last forward kept no copy of their input (recomputable_inputs):
        # layer index -> (the data memory their backward regenerates it from, its version then)
        self._regenerated: dict[int, tuple[SyncedMemory, int]] = {}
        self._regen_snapshots: dict[int, np.ndarray] = {}  # id(memory) -> values at the first access
        self.guest: TrainingData | None = None  # forward-only data training iterations keep in the slots
        self._guest_slots: list[tuple[object, list[list[int]], bool]] = []  # (slot, data groups, with diffs)

    def planned_bytes(self) -> tuple[int, int]:
        """(bytes of the slot buffers, bytes the memories pointed into them would take alone)."""
        return sum(self._slot_bytes), sum(m.nbytes for m in self._memories)

    def not_read_by_backward(self, bids: Collection[int]) -> None:
        """Blobs whose data no backward reads (:class:`ForwardOnlyData`): a change to them does not
        stop a re-run of the last backward."""
        mems = {id(self.net.blobs[b].data_memory) for b in bids}
        self._inputs = [(blob, name) for blob, name in self._inputs if id(blob.data_memory) not in mems]

    def regenerating(self, layers: Collection[tuple[int, Blob]], on: bool) -> None:
        """After a forward: the Scale layers ``[(index, source blob)]`` kept no copy of their input
        (``on``; their backward regenerates it from the source's data, which must not change until
        then: checked before a backward) or saved one (not ``on``)."""
        for k, source in layers:
            mem = source.data_memory
            self._regen_snapshots.pop(id(mem), None)
            if on:
                self._regenerated[k] = (mem, mem.version)
            else:
                self._regenerated.pop(k, None)
        self._set_watch()

    def _check_regenerated(self, start: int, end: int) -> None:
        for k, (mem, version) in self._regenerated.items():
            if not end <= k <= start or mem.version == version:
                continue
            snapshot = self._regen_snapshots.get(id(mem))
            if snapshot is not None and np.array_equal(mem.newest_copy(), snapshot, equal_nan=True):
                continue
            net = self.net
            source = next(name for name, blob in zip(net.blob_names, net.blobs) if blob.data_memory is mem)
            raise NetError(
                f"net '{net.name}': the backward of layer '{net.layer_names[k]}' needs its input as the last "
                f"forward saw it, which it regenerates from the data of blob '{source}' (on the GPU it keeps "
                f"no copy, as the solver's iterations do not), but that data changed since. Run the forward "
                f"again, or set PYCAFFE_LITE_SHARE_DIFFS=0 (or caffe.using_config(share_diffs=False)) "
                f"before the forward to keep the copies")

    def keep_blobs(self, bids: Collection[int]) -> None:
        """Keep these blobs' diffs private from the next backward on (``backward(diffs=...)``)."""
        self.keep.update(bids)

    def _range(self, start: int, end: int) -> BackwardRange:
        if self._ranges_shapes != shape_generation():  # reshapes may give blobs new memories
            self._ranges, self._ranges_shapes = {}, shape_generation()
        rng = self._ranges.get((start, end))
        if rng is None:
            rng = self._ranges[start, end] = BackwardRange(self.net, start, end)
        return rng

    def _eligible(self, train: bool) -> bool:
        if not sharing_enabled():
            return False
        if train:  # the solver's replayed iteration: graph-safe hooks only, by construction
            return True
        # No hooks: a re-run would call them again (an NCCL reduction on one rank only would hang).
        return self._can_share and not self.disabled and not any(self.hooks.values())

    def _set_watch(self) -> None:
        self.watching = bool(self._planned or self.stale or self.lost or self._regenerated)
        self.watch_changed()

    # -- the plan ---------------------------------------------------------------------------------
    def _forget_plan(self) -> None:
        self.slots, self._slot_bytes, self._groups, self._memories, self._slot_of = [], [], [], [], []
        self._group_of, self._planned, self._seed_buffers, self._key = {}, {}, [], None
        self._guest_slots = []

    def _drop_plan(self) -> None:
        """Every planned memory back in memory of its own, holding its values (the guest's data, stale
        or about to be written, in memory of its own from its next use)."""
        for mem in self._memories:
            mem.own_storage()
        if self.guest is not None and self.guest.placed:
            self.guest.release()
        self._forget_plan()

    def _plan(self, start: int, end: int, train: bool, data: bool = False) -> None:
        on_gpu = common.mode() is common.Mode.GPU
        guest = self.guest if data else None
        key = (self.layout.key(), on_gpu, start, end, frozenset(self.keep), None if guest is None else guest.key())
        if key == self._key:
            if guest is not None and not guest.placed and self._guest_slots:
                guest.place(self._guest_slots, on_gpu)  # a pycaffe forward took them out: back in
            self._seeds(start, end, train, on_gpu)
            return
        net = self.net
        if self.guest is not None and self.guest.placed:
            self.guest.release()
        diffs = shared_diff_slots(net, start, end, self.keep)
        plan = training_slots(diffs, guest.plan() if guest is not None else [])
        new = {id(net.blobs[bids[0]].diff_memory) for slot in plan for bids in slot.diffs}
        for mem in self._memories:  # the range writes the others before reading them: values not needed
            if id(mem) not in new:
                mem.own_storage()
        self._forget_plan()
        for entry in plan:
            nbytes, groups = entry.nbytes, entry.diffs
            slot = new_slot(nbytes, on_gpu)
            self.slots.append(slot)
            self._slot_bytes.append(nbytes)
            if entry.data:
                self._guest_slots.append((slot, entry.data, bool(groups)))
            for bids in groups:
                mem = net.blobs[bids[0]].diff_memory
                point_into(mem, slot, on_gpu)
                self._group_of[id(mem)] = len(self._groups)
                self._planned.update((b, len(self._groups)) for b in bids)
                self._groups.append(bids)
                self._memories.append(mem)
                self._slot_of.append(len(self.slots) - 1)
        self._seeds(start, end, train, on_gpu)
        if guest is not None and self._guest_slots:
            guest.place(self._guest_slots, on_gpu)
        self._key = key

    def _seeds(self, start: int, end: int, train: bool, on_gpu: bool) -> None:
        """Room for the seeds' values before each pass that may be re-run (not ``train``); a training
        iteration, never re-run, needs none (the same plan serves both: the slots stay)."""
        want = bool(self._memories) and not train
        if not want:
            self._seed_buffers = []
            return
        if self._seed_buffers:
            return
        rng = self._range(start, end)
        seeds = {id(blob.diff_memory): blob.diff_memory for blob in self.net.blobs if id(blob.diff_memory) in rng.seeds}
        self._seed_buffers = [(mem, backend.alloc(max(mem.nbytes, 8)) if on_gpu else np.empty(mem.count, mem.dtype))
                              for mem in seeds.values()]

    def _release(self, bid: int) -> None:
        """Blob ``bid``'s diff (its slot's current value) into memory of its own, private from now on."""
        g = self._planned[bid]
        self._memories[g].own_storage()
        for b in self._groups[g]:
            self._planned.pop(b, None)
        self.keep.update(self._groups[g])  # the next backward plans again without it

    # -- the executor's side ----------------------------------------------------------------------
    def prepare(self, start: int, end: int, train: bool = False, data: bool = False,
                forward_next: bool = False) -> BackwardRange:
        """Plan a backward over layers ``start`` down to ``end`` (``train``: a whole training
        iteration, never re-run; ``data``: a training iteration, whose forward keeps :attr:`guest`'s
        data in the slots; ``forward_next``: called before that forward, which writes afresh what
        regenerated Scale inputs come from)."""
        if not train and not forward_next:
            self._check_regenerated(start, end)
        rng = self._range(start, end)
        self._settle_stale(rng)
        if self._eligible(train):
            self._plan(start, end, train, data)
        elif self._memories or self._guest_slots:
            self._drop_plan()
        return rng

    @contextmanager
    def backward(self, start: int, end: int, train: bool = False, data: bool = False) -> Iterator[None]:
        """Around the executor's backward over layers ``start`` down to ``end`` (:meth:`prepare`'s
        arguments; a plan :meth:`prepare` made for the same arguments is kept)."""
        rng = self.prepare(start, end, train, data)
        on_gpu = common.mode() is common.Mode.GPU
        for mem, copy in self._seed_buffers:
            if on_gpu:
                backend.memcpy_dtod(int(copy), mem.gpu(), mem.nbytes)  # type: ignore[call-overload]
            else:
                copy[...] = mem.cpu()  # type: ignore[index]
        self._running = ok = True
        try:
            yield
        except BaseException:
            ok = False
            raise
        finally:
            self._running = False
            self._after(rng, ok, train)

    def _settle_stale(self, rng: BackwardRange) -> None:
        """Stale diffs the coming pass reads or leaves alone: recomputed now, or lost."""
        blobs = self.net.blobs
        need = {b for b in self.stale
                if id(blobs[b].diff_memory) in rng.seeds or id(blobs[b].diff_memory) not in rng.written}
        if not need:
            return
        what = f"the backward from layer '{self.net.layer_names[rng.start]}'"
        problem = self._problem()
        if problem is None:
            self._rematerialise(what)
            return
        seeds = [self.net.blob_names[b] for b in sorted(need) if id(blobs[b].diff_memory) in rng.seeds]
        if seeds:
            raise NetError(self._gone(f"{what} (it reads the diff of {', '.join(map(repr, seeds))})", problem))
        for b in need:
            self.lost[b] = problem
        self.stale -= need

    def _after(self, rng: BackwardRange, ok: bool, train: bool) -> None:
        blobs = self.net.blobs
        for b in [b for b in self.lost if id(blobs[b].diff_memory) in rng.written]:
            del self.lost[b]  # written again
        self.stale = set()  # (stale diffs the pass did not write were settled before it)
        self._last, self._snapshots = None, {}
        if self._memories:
            owner: dict[int, int] = {}
            for _, key in rng.writes:
                g = self._group_of.get(key)
                if g is not None:
                    owner[self._slot_of[g]] = g
            self.stale = {b for g, bids in enumerate(self._groups) if owner.get(self._slot_of[g]) != g or not ok
                          for b in bids}
            if not ok:
                self._why_not = "that backward failed"
            elif train:
                self._why_not = "a solver iteration ran (its update changes the weights the backward read)"
            elif self.stale:
                self._remember_inputs(rng)
        self._set_watch()

    def _remember_inputs(self, rng: BackwardRange) -> None:
        self._last, self._shapes = (rng.start, rng.end), [blob.shape for blob in self.net.blobs]
        self._last_mode = common.mode()
        versions: dict[int, tuple[SyncedMemory, int, str]] = {}
        for blob, name in self._inputs:
            mem = blob.data_memory
            versions.setdefault(id(mem), (mem, mem.version, name))
        self._versions = versions
        if common.mode() is not common.Mode.GPU:  # a kept array of a source is what a re-run reads
            for b in self._sources:
                mem = self.net.blobs[b].data_memory
                self._snapshots[id(mem)] = mem.cpu().copy()

    # -- user access ------------------------------------------------------------------------------
    def access(self, blob: Blob, what: str) -> None:
        """A user accessed ``blob.data`` or ``blob.diff`` (the executor calls this while watching)."""
        if self._running:  # a hook inside the pass
            return
        bid = self._ids.get(id(blob))
        if what == "set_diff" and bid is not None:  # overwritten whole: nothing to recompute
            self._overwritten(blob)
            return
        what = "data" if what == "set_data" else what
        if what == "data" and self._regenerated:  # a source of regenerated Scale inputs: remember it
            key = id(blob.data_memory)
            for mem, version in self._regenerated.values():
                if mem is blob.data_memory and key not in self._regen_snapshots and mem.version == version:
                    self._regen_snapshots[key] = mem.newest_copy()
                    break
        if what == "data" or bid is None:
            if self.stale and what == "data":  # what a re-run reads: remember it before the user writes
                key = id(blob.data_memory)
                entry = self._versions.get(key)
                if entry is not None and key not in self._snapshots and entry[0].version == entry[1]:
                    self._snapshots[key] = entry[0].newest_copy()
            return
        if bid in self.lost:
            raise NetError(self._gone(f"blob '{self.net.blob_names[bid]}'", self.lost[bid]))
        if bid in self.stale:
            self._rematerialise(f"blob '{self.net.blob_names[bid]}'")
        elif bid in self._planned:
            self._release(bid)
        self._set_watch()

    def _overwritten(self, blob: Blob) -> None:
        """``blob.diff = value``: the blobs of its diff memory are neither stale nor lost now."""
        mem = blob.diff_memory
        bids = [b for b, other in enumerate(self.net.blobs) if other.diff_memory is mem]
        for b in bids:
            self.stale.discard(b)
            self.lost.pop(b, None)
        if bids[0] in self._planned:
            self._release(bids[0])
        self._set_watch()

    def _problem(self) -> str | None:
        """Why re-running the last backward would not give its values again (None: it would)."""
        if self._last is None:
            return self._why_not
        if [blob.shape for blob in self.net.blobs] != self._shapes:
            return "the net was reshaped since"
        changed = []
        for key, (mem, version, name) in self._versions.items():
            snapshot = self._snapshots.get(key)
            if snapshot is not None:
                if not np.array_equal(mem.newest_copy(), snapshot, equal_nan=True):
                    changed.append(name)
            elif mem.version != version:
                changed.append(name)
        if changed:
            names = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
            return f"{names} changed since (a forward, a solver update or a write)"
        return None

    def _gone(self, what: str, problem: str) -> str:
        return (f"net '{self.net.name}': {what} needs a diff the last backward computed, which is gone: the "
                f"net shares gradient buffers between intermediate blobs whose diffs are not needed at the "
                f"same time, and recomputing it re-runs that backward, but {problem}. Ask for the diffs you "
                f"read with net.backward(diffs=[...]) (they are then kept), or set PYCAFFE_LITE_SHARE_DIFFS=0 "
                f"(or caffe.using_config(share_diffs=False)) to keep every diff")

    def _unshare(self, what: str) -> None:
        self._drop_plan()
        self.disabled = True
        log.info("net '%s': %s read a diff after a backward, so its intermediate blobs get diff memory of their "
                 "own from now on (they shared gradient buffers; PYCAFFE_LITE_SHARE_DIFFS=0 or "
                 "backward(diffs=[...]) avoid this)", self.net.name, what)

    def _rematerialise(self, what: str) -> None:
        """Re-run the last backward plainly, un-shared, to recompute the stale diffs ``what`` needs."""
        problem = self._problem()
        if problem is not None:
            raise NetError(self._gone(what, problem))
        assert self._last is not None
        net = self.net
        start, end = self._last
        rng = self._range(start, end)
        stale = {id(net.blobs[b].diff_memory) for b in self.stale}
        saved: dict[int, tuple[SyncedMemory, np.ndarray]] = {}  # values a user sees that the re-run rewrites
        for blob in net.params_list:
            saved.setdefault(id(blob.diff_memory), (blob.diff_memory, blob.diff_memory.newest_copy()))
        for blob in net.blobs:
            key = id(blob.diff_memory)
            if key not in stale and key not in saved and (key in rng.written or key in rng.seeds):
                saved[key] = (blob.diff_memory, blob.diff_memory.newest_copy())
        seeds = self._seed_buffers
        self._unshare(what)
        for mem, copy in seeds:  # the seeds as that backward found them (kept where the plan was made:
            if isinstance(copy, np.ndarray):  # a net planned in CPU mode may be read in GPU mode)
                mem.mutable_cpu()[...] = copy
            else:
                backend.memcpy_dtod(mem.mutable_gpu(), int(copy), mem.nbytes)  # type: ignore[call-overload]
        self._running = True
        context, mode = common.context(), common.mode()
        context.mode = self._last_mode  # the forward state it reads (pooling masks, ...) is that mode's
        try:
            self.run_backward(start, end)
        finally:
            self._running = False
            context.mode = mode
        for mem, values in saved.values():
            mem.mutable_cpu()[...] = values
        self.stale, self._last, self._snapshots, self._versions = set(), None, {}, {}
        self._why_not = "no backward ran since"
        self._set_watch()
