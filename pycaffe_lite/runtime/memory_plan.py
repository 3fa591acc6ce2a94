"""Memory plans: blobs whose values are never live at the same time share memory.

:func:`shared_diff_slots` plans the gradients of a backward pass over a layer range. In Caffe
every blob keeps a diff as large as its data; but the backward pass writes a blob's diff when it
reaches the blob's last consumer and reads it for the last time at the blob's producer, so diffs
of blobs whose [consumer, producer] ranges of the backward pass do not overlap can use one buffer.
:class:`SharedDiffs` applies the plan to every backward (pycaffe's ``net.backward()`` over any
range, ``forward_backward_all``, the solver's iterations; CPU and GPU) and keeps pycaffe's
semantics: see its docstring (``PYCAFFE_LITE_SHARE_DIFFS=0`` turns it off). After a pass the diffs
of intermediate blobs hold whatever the last blob using their buffer wrote until a user reads
them (then the pass is re-run). The range's seeds (diffs it reads before writing), net inputs and
sources, outputs, loss tops, parameters and the blobs ``backward(diffs=[...])`` names keep their
own diffs.

:func:`shared_data_slots` plans the data of a net that never runs backward (a deploy net): a
blob's data is live from its producer to its last consumer. :class:`SharedData` applies that plan
on the host or the device and keeps pycaffe's semantics: see its docstring
(``PYCAFFE_LITE_SHARE_DATA=0`` turns it off). Both plans share one allocator, :func:`assign_slots`.

:func:`recomputable_inputs` finds the in-place Scale layers (after a BatchNorm that is not in
place, as MobileNet writes them) whose saved input copy training iterations and pycaffe forwards
on the GPU replace by re-normalizing the BatchNorm's intact input in the Scale's backward: one
full-size buffer per such layer less, for one extra elementwise pass (also under
``PYCAFFE_LITE_SHARE_DIFFS``; :meth:`SharedDiffs.regenerating` checks the input is unchanged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from .. import common
from ..blob import Blob, shape_generation
from ..config import config
from ..errors import NetError
from ..gpu import backend
from ..layer import Layer
from ..synced_memory import SyncedMemory

if TYPE_CHECKING:
    from ..net_graph import NetGraph

log = logging.getLogger("pycaffe_lite")
T = TypeVar("T")


def sharing_enabled() -> bool:
    return bool(config.share_diffs)


def data_sharing_enabled() -> bool:
    return bool(config.share_data)


def assign_slots(intervals: Sequence[tuple[int, int, int, T]]) -> list[tuple[int, list[T]]]:
    """Buffers for values each live over a range of steps.

    ``intervals``: ``(first step, last step, bytes, item)``; items whose ranges do not overlap may
    share a buffer (one ending at step k and one starting at k may not). Returns ``[(bytes, [items
    in the order they use it])]``. Greedy over the steps: a value starting (larger ones first) takes
    the smallest free buffer that fits, else grows the largest free one, else gets a new one."""
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for n, (first, last, _, _) in enumerate(intervals):
        starts.setdefault(first, []).append(n)
        ends.setdefault(last, []).append(n)
    slots: list[tuple[int, list[T]]] = []
    free: list[int] = []  # slot indices whose current value's range has ended
    holder: dict[int, int] = {}  # interval index -> slot index
    for k in sorted(starts.keys() | ends.keys()):
        for n in sorted(starts.get(k, ()), key=lambda n: -intervals[n][2]):
            need = intervals[n][2]
            fitting = [i for i in free if slots[i][0] >= need]
            if fitting:
                i = min(fitting, key=lambda j: slots[j][0])
            elif free:
                i = max(free, key=lambda j: slots[j][0])
            else:
                slots.append((0, []))
                i = len(slots) - 1
            if i in free:
                free.remove(i)
            size, members = slots[i]
            slots[i] = (max(size, need), members + [intervals[n][3]])
            holder[n] = i
        for n in ends.get(k, ()):  # used for the last time at step k: free after it
            free.append(holder[n])
    return slots


def diff_groups(net: NetGraph) -> dict[int, list[int]]:
    """``id(diff memory) -> blob ids`` using it (a Flatten/Reshape top shares its bottom's diff)."""
    groups: dict[int, list[int]] = {}
    for bid, blob in enumerate(net.blobs):
        groups.setdefault(id(blob.diff_memory), []).append(bid)
    return groups


class BackwardRange:
    """What a backward over layers ``start`` down to ``end`` does to blob diffs, by diff memory.

    ``writes``: the diff memories it writes (a layer's bottoms that need backward), in order, with
    the step (0 at ``start``); ``seeds``: those it reads before writing them (the tops of layers in
    the range whose diffs come from outside it: output or loss diffs, a user's gradient, an earlier
    backward); ``touched``: memory id -> (first step, last step) over reads and writes."""

    def __init__(self, net: NetGraph, start: int, end: int) -> None:
        self.start, self.end = start, end
        self.writes: list[tuple[int, int]] = []  # (step, memory id)
        self.seeds: set[int] = set()
        self.touched: dict[int, tuple[int, int]] = {}
        written: set[int] = set()
        for step, k in enumerate(range(start, end - 1, -1)):
            if not net.layer_need_backward[k]:
                continue
            for blob in net.top_vecs[k]:
                key = id(blob.diff_memory)
                if key not in written:
                    self.seeds.add(key)
                self._touch(key, step)
            layer = net.layers[k]
            for i, (blob, need) in enumerate(zip(net.bottom_vecs[k], net.bottom_need_backward[k])):
                if need and layer.writes_bottom_diff(i):
                    key = id(blob.diff_memory)
                    written.add(key)
                    self.writes.append((step, key))
                    self._touch(key, step)
        self.written = written

    def _touch(self, key: int, step: int) -> None:
        first, _ = self.touched.get(key, (step, step))
        self.touched[key] = (first, step)


def never_shared_diffs(net: NetGraph) -> set[int]:
    """Blob ids whose diffs a user sets or always reads: inputs and sources, outputs, loss tops."""
    keep = source_blobs(net) | set(net.output_blob_indices)
    return keep | {bid for bid, w in enumerate(net.blob_loss_weights) if w}


def shared_diff_slots(net: NetGraph, start: int | None = None, end: int = 0,
                      keep: Collection[int] = ()) -> list[tuple[int, list[list[int]]]]:
    """``[(bytes, [groups])]`` for a backward over layers ``start`` (default: the last) down to
    ``end``: each slot's size and the groups of blob ids (those of one diff memory) whose diffs it
    holds in turn. A group is planned when the range writes its diff before reading it; its value
    is live from that write to the range's last read of it (its producer's backward), so groups
    whose live steps do not overlap share a buffer. Never shared: ``keep``,
    :func:`never_shared_diffs`, and memory a layer holds in a blob of its own."""
    start = len(net.layers) - 1 if start is None else start
    rng = BackwardRange(net, start, end)
    never = set(keep) | never_shared_diffs(net)
    held = {id(blob.diff_memory) for layer in net.layers for blob in layer.held_blobs()}
    intervals = []
    for key, bids in diff_groups(net).items():
        if key not in rng.written or key in rng.seeds or key in held or never.intersection(bids):
            continue
        first, last = rng.touched[key]
        intervals.append((first, last, net.blobs[bids[0]].diff_memory.nbytes, bids))
    return assign_slots(intervals)


def recomputable_inputs(net: NetGraph) -> list[tuple[Layer, Layer, Blob]]:
    """``[(layer, producer, producer_bottom)]``: layers that save their input in place
    (``saves_input_in_place``: Scale) on the top of a producer that can regenerate it
    (``regenerates_top``: BatchNorm, not in place) at layer j < k, with one bottom, where no layer
    between them rewrites that top and no layer after j rewrites the producer's input, so
    ``producer.regenerate_top_into(producer_bottom, ptr)`` gives the layer's input again during its
    backward."""
    out = []
    tops = net.top_id_vecs
    for k, scale in enumerate(net.layers):
        if not scale.saves_input_in_place or len(net.bottom_id_vecs[k]) != 1 or tops[k] != net.bottom_id_vecs[k]:
            continue
        bid = tops[k][0]
        j = max((i for i in range(k) if bid in tops[i]), default=-1)
        if j < 0 or not net.layers[j].regenerates_top or net.bottom_id_vecs[j][0] == bid:
            continue
        source = net.bottom_id_vecs[j][0]
        if any(source in tops[i] for i in range(j + 1, len(net.layers))):
            continue
        out.append((scale, net.layers[j], net.blobs[source]))
    return out


def source_blobs(net: NetGraph) -> set[int]:
    """Net inputs and the tops of other layers without bottoms (data readers)."""
    return set(net.input_blob_indices) | {
        bid for k, bottoms in enumerate(net.bottom_id_vecs) if not bottoms for bid in net.top_id_vecs[k]}


def _held_by_layers(net: NetGraph) -> set[int]:
    """``id``s of the data memories of blobs that layers hold themselves (params, internal blobs)."""
    return {id(blob.data_memory) for layer in net.layers for blob in layer.held_blobs()}


def shared_data_slots(net: NetGraph, keep: Collection[int] = ()) -> list[tuple[int, list[list[int]]]]:
    """``[(bytes, [groups])]`` for a net that runs no backward: each slot's size and the groups of
    blob ids whose data it holds in turn, in forward order. A group is the blobs of one data memory
    (a Split's bottom and tops, a Flatten/Reshape view and its bottom); it is live from the first
    layer touching one of them to the last. Never shared: ``keep``, sources (:func:`source_blobs`),
    outputs, loss tops, and memory a layer holds in a blob of its own (params, internal blobs)."""
    groups: dict[int, list[int]] = {}
    for bid, blob in enumerate(net.blobs):
        groups.setdefault(id(blob.data_memory), []).append(bid)
    span: dict[int, tuple[int, int]] = {}  # blob id -> (first, last) layer touching it
    for k in range(len(net.layers)):
        for bid in net.bottom_id_vecs[k] + net.top_id_vecs[k]:
            span[bid] = (span.get(bid, (k, k))[0], k)
    never = set(keep) | set(net.output_blob_indices) | source_blobs(net)
    never |= {bid for bid, w in enumerate(net.blob_loss_weights) if w}
    held = _held_by_layers(net)
    intervals = [(min(span[b][0] for b in bids), max(span[b][1] for b in bids),
                  net.blobs[bids[0]].data_memory.nbytes, bids)
                 for key, bids in groups.items() if key not in held and not never.intersection(bids)]
    return assign_slots(intervals)


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
            layer.outside_effects for layer in net.layers)
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
        key = (shape_generation(), on_gpu, frozenset(self.keep))
        if key == self._key:
            return
        self._drop_plan()  # the forward about to run recomputes every planned value
        net = self.net
        for nbytes, groups in shared_data_slots(net, self.keep):
            if len(groups) < 2:
                continue
            slot = backend.alloc(max(nbytes, 8)) if on_gpu else np.empty(nbytes, np.uint8)
            self.slots.append(slot)
            self._slot_bytes.append(nbytes)
            self._overwritten.update(b for bids in groups[:-1] for b in bids)
            for bids in groups:
                mem = net.blobs[bids[0]].data_memory
                if on_gpu:
                    mem.use_storage(device=slot)
                else:
                    mem.use_storage(host=slot[:mem.nbytes].view(mem.dtype))
                self._memories.append(mem)
                self._planned.update(bids)
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
    """

    def __init__(self, net: NetGraph, hooks: Mapping[str, list], run_backward: Callable[[int, int], None],
                 watch_changed: Callable[[], None]) -> None:
        self.net = net
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
        self._can_share = any(net.layer_need_backward) and not any(layer.outside_effects for layer in net.layers)
        # What re-running the last backward needs
        self._last: tuple[int, int] | None = None
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

    def _drop_plan(self) -> None:
        """Every planned memory back in memory of its own, holding its values."""
        for mem in self._memories:
            mem.own_storage()
        self._forget_plan()

    def _plan(self, start: int, end: int, train: bool) -> None:
        on_gpu = common.mode() is common.Mode.GPU
        key = (shape_generation(), on_gpu, start, end, frozenset(self.keep), train)
        if key == self._key:
            return
        net = self.net
        plan = [(nbytes, groups) for nbytes, groups in shared_diff_slots(net, start, end, self.keep)
                if len(groups) > 1]
        new = {id(net.blobs[bids[0]].diff_memory) for _, groups in plan for bids in groups}
        for mem in self._memories:  # the range writes the others before reading them: values not needed
            if id(mem) not in new:
                mem.own_storage()
        self._forget_plan()
        for nbytes, groups in plan:
            slot = backend.alloc(max(nbytes, 8)) if on_gpu else np.empty(nbytes, np.uint8)
            self.slots.append(slot)
            self._slot_bytes.append(nbytes)
            for bids in groups:
                mem = net.blobs[bids[0]].diff_memory
                if on_gpu:
                    mem.use_storage(device=slot)
                else:
                    mem.use_storage(host=slot[:mem.nbytes].view(mem.dtype))
                self._group_of[id(mem)] = len(self._groups)
                self._planned.update((b, len(self._groups)) for b in bids)
                self._groups.append(bids)
                self._memories.append(mem)
                self._slot_of.append(len(self.slots) - 1)
        if self._memories and not train:  # room for the seeds' values before each pass (a re-run's)
            rng = self._range(start, end)
            seeds = {id(blob.diff_memory): blob.diff_memory for blob in net.blobs if id(blob.diff_memory) in rng.seeds}
            self._seed_buffers = [(mem, backend.alloc(max(mem.nbytes, 8)) if on_gpu else np.empty(mem.count, mem.dtype))
                                  for mem in seeds.values()]
        self._key = key

    def _release(self, bid: int) -> None:
        """Blob ``bid``'s diff (its slot's current value) into memory of its own, private from now on."""
        g = self._planned[bid]
        self._memories[g].own_storage()
        for b in self._groups[g]:
            self._planned.pop(b, None)
        self.keep.update(self._groups[g])  # the next backward plans again without it

    # -- the executor's side ----------------------------------------------------------------------
    @contextmanager
    def backward(self, start: int, end: int, train: bool = False) -> Iterator[None]:
        """Around the executor's backward over layers ``start`` down to ``end`` (``train``: a whole
        training iteration, never re-run)."""
        if not train:
            self._check_regenerated(start, end)
        rng = self._range(start, end)
        self._settle_stale(rng)
        if self._eligible(train):
            self._plan(start, end, train)
        elif self._memories:
            self._drop_plan()
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
        on_gpu = common.mode() is common.Mode.GPU
        for mem, copy in seeds:  # the seeds as that backward found them
            if on_gpu:
                backend.memcpy_dtod(mem.mutable_gpu(), int(copy), mem.nbytes)  # type: ignore[call-overload]
            else:
                mem.mutable_cpu()[...] = copy
        self._running = True
        try:
            self.run_backward(start, end)
        finally:
            self._running = False
        for mem, values in saved.values():
            mem.mutable_cpu()[...] = values
        self.stale, self._last, self._snapshots, self._versions = set(), None, {}, {}
        self._why_not = "no backward ran since"
        self._set_watch()


def forward_only_blobs(net: NetGraph) -> set[int]:
    """Blob ids whose data only forward passes read, in a TEST-phase net that runs backward: one
    layer with a ``pure_forward`` writes the blob, it has a memory of its own, every layer touching
    it says its backward does not read it (``backward_reads_data``: a convolution's top, a BatchNorm
    on global statistics), and it is no source, output or loss top. Published MobileNet and ResNet
    files write Convolution -> BatchNorm -> Scale with a top per layer: the convolutions' tops."""
    if net.phase != common.TEST or not any(net.layer_need_backward):
        return set()
    memories: dict[int, int] = {}
    for blob in net.blobs:
        memories[id(blob.data_memory)] = memories.get(id(blob.data_memory), 0) + 1
    readers: dict[int, list[tuple[int, bool, int]]] = {}  # blob id -> (layer, as top, index)
    for k in range(len(net.layers)):
        for i, b in enumerate(net.bottom_id_vecs[k]):
            readers.setdefault(b, []).append((k, False, i))
        for i, b in enumerate(net.top_id_vecs[k]):
            readers.setdefault(b, []).append((k, True, i))
    never = source_blobs(net) | set(net.output_blob_indices) | {b for b, w in enumerate(net.blob_loss_weights) if w}
    out = set()
    for b, uses in readers.items():
        producers = [k for k, as_top, _ in uses if as_top]
        if (b in never or len(producers) != 1 or memories[id(net.blobs[b].data_memory)] != 1
                or not net.layers[producers[0]].pure_forward or len(net.top_id_vecs[producers[0]]) != 1
                or producers[0] in {k for k, as_top, _ in uses if not as_top}):
            continue
        if not any(net.layers[k].backward_reads_data(as_top, i) for k, as_top, i in uses):
            out.add(b)
    return out


class ForwardOnlyData:
    """In a TEST-phase net that runs backward (``force_backward``: fine-tuning on frozen statistics,
    visualisation, adversarial inputs), the data of :func:`forward_only_blobs` shares buffers by
    forward lifetime [producer, last consumer], like :class:`SharedData` in nets without backward.

    After a full forward, every member of a slot but the last is *stale*. Reading one (its ``data``)
    gives every planned blob memory of its own for good (one INFO line) and recomputes the stale
    ones by running their producers (convolutions) again on their bottoms and weights, which must be
    unchanged since that forward (``SyncedMemory.version``), else a NetError says what changed.
    Setting one whole (``blob.data = x``) needs no recomputation. A forward over part of the net
    first recomputes what is stale, then stops sharing for good. ``exclude``: blobs something else
    reads after the forward (a BatchNorm's input its regenerated Scale input comes from).
    ``config.share_data`` off, per-layer hooks or layers with outside effects: nothing is shared."""

    def __init__(self, net: NetGraph, hooks: Mapping[str, list], watch_changed: Callable[[], None],
                 exclude: Collection[int] = ()) -> None:
        self.net = net
        self.hooks = hooks
        self.watch_changed = watch_changed
        self.watching = False
        self.disabled = False
        self.stale: set[int] = set()
        self.candidates = set() if any(layer.outside_effects for layer in net.layers) else (
            forward_only_blobs(net) - set(exclude))
        self.slots: list = []
        self._slot_bytes: list[int] = []
        self._planned: set[int] = set()
        self._overwritten: set[int] = set()
        self._key: tuple | None = None
        self._producer = {b: k for k in range(len(net.layers)) for b in net.top_id_vecs[k] if b in self.candidates}
        self._inputs: dict[int, list[tuple[SyncedMemory, int]]] = {}  # stale blob -> its producer's inputs then
        self._ids = {id(blob): bid for bid, blob in enumerate(net.blobs)}

    def _eligible(self) -> bool:
        return bool(self.candidates) and data_sharing_enabled() and not self.disabled and not any(self.hooks.values())

    def _plan(self) -> None:
        on_gpu = common.mode() is common.Mode.GPU
        key = (shape_generation(), on_gpu)
        if key == self._key:
            return
        self._release()
        net = self.net
        span: dict[int, tuple[int, int]] = {}
        for k in range(len(net.layers)):
            for b in net.bottom_id_vecs[k] + net.top_id_vecs[k]:
                if b in self.candidates:
                    span[b] = (span.get(b, (k, k))[0], k)
        intervals = [(first, last, net.blobs[b].data_memory.nbytes, [b]) for b, (first, last) in span.items()]
        for nbytes, groups in assign_slots(intervals):
            if len(groups) < 2:
                continue
            slot = backend.alloc(max(nbytes, 8)) if on_gpu else np.empty(nbytes, np.uint8)
            self.slots.append(slot)
            self._slot_bytes.append(nbytes)
            self._overwritten.update(b for bids in groups[:-1] for b in bids)
            for (b,) in groups:
                mem = net.blobs[b].data_memory
                if on_gpu:
                    mem.use_storage(device=slot)
                else:
                    mem.use_storage(host=slot[:mem.nbytes].view(mem.dtype))
                self._planned.add(b)
        self._key = key

    def _release(self) -> None:
        """Every planned blob back in memory of its own (stale ones keep being stale)."""
        for b in self._planned:
            self.net.blobs[b].data_memory.own_storage()
        self._planned, self._overwritten, self.slots, self._slot_bytes, self._key = set(), set(), [], [], None

    def planned_bytes(self) -> tuple[int, int]:
        """(bytes of the slot buffers, bytes the planned memories would take alone)."""
        return sum(self._slot_bytes), sum(self.net.blobs[b].data_memory.nbytes for b in self._planned)

    @contextmanager
    def forward(self, start: int, end: int) -> Iterator[None]:
        """Around the executor's forward over layers ``start..end``."""
        full = start == 0 and end == len(self.net.layers) - 1
        if not full and (self._planned or self.stale):
            self._recompute(f"a forward over layers {start}..{end}")
            self.disabled = True
        elif full and self._eligible():
            self._plan()
        elif self._planned:
            self._release()
        ok = False
        try:
            yield
            ok = True
        finally:
            if full:
                self.stale = set(self._overwritten) if ok else set(self._planned)
                net = self.net
                self._inputs = {b: [(blob.data_memory, blob.data_memory.version)
                                    for blob in (*net.bottom_vecs[self._producer[b]], *net.layers[self._producer[b]].blobs)]
                                for b in self.stale}
            else:  # what the range wrote is current
                self.stale -= {b for k in range(start, end + 1) for b in self.net.top_id_vecs[k]}
            self.watching = bool(self.stale)
            self.watch_changed()

    def access(self, blob: Blob, what: str) -> None:
        """A user accessed ``blob.data`` / ``.diff`` (``what``; the executor calls this while watching)."""
        bid = self._ids.get(id(blob))
        if bid is None or bid not in self.stale or what in ("diff", "set_diff"):
            return
        if what == "set_data":
            self.stale.discard(bid)
        self._recompute(f"blob '{self.net.blob_names[bid]}'")

    def _recompute(self, what: str) -> None:
        net = self.net
        if self._planned:
            self._release()
            self.disabled = True
            log.info("net '%s': %s needs intermediate data the net shared between blobs only its forward reads, "
                     "so they get memory of their own from now on (PYCAFFE_LITE_SHARE_DATA=0 avoids this)",
                     net.name, what)
        for b in sorted(self.stale, key=lambda b: self._producer[b]):  # producers in forward order
            changed = [m for m, version in self._inputs[b] if m.version != version]
            if changed:
                k = self._producer[b]
                raise NetError(
                    f"net '{net.name}': {what} needs the data of blob '{net.blob_names[b]}' from the last forward, "
                    f"which is gone (the net shared its memory: only forward passes read it), and recomputing it "
                    f"runs layer '{net.layer_names[k]}' again, but its input or weights changed since. Run the "
                    f"forward again, or set PYCAFFE_LITE_SHARE_DATA=0 to keep every blob")
            k = self._producer[b]
            net.layers[k].forward(net.bottom_vecs[k], net.top_vecs[k])
        self.stale = set()
        self.watching = False
        self.watch_changed()
