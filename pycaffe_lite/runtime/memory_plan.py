"""Memory plans: blobs whose values are never live at the same time share memory.

:func:`shared_diff_slots` plans the gradients of a training iteration. In Caffe every blob keeps a
diff as large as its data; but the backward pass writes a blob's diff when it reaches the blob's
last consumer and reads it for the last time at the blob's producer, so diffs of blobs whose
[consumer, producer] ranges of the backward pass do not overlap can use one buffer. The executor
applies the plan to whole training iterations on the GPU (``PYCAFFE_LITE_SHARE_DIFFS=0`` turns it
off); after such an iteration the diffs of intermediate blobs hold whatever the last blob using
their buffer wrote. Loss tops (their diff holds the loss weight), net inputs, parameters and blobs
that take no gradient keep their own diffs.

:func:`shared_data_slots` plans the data of a net that never runs backward (a deploy net): a
blob's data is live from its producer to its last consumer. :class:`SharedData` applies that plan
on the host or the device and keeps pycaffe's semantics: see its docstring
(``PYCAFFE_LITE_SHARE_DATA=0`` turns it off). Both plans share one allocator, :func:`assign_slots`.

:func:`recomputable_inputs` finds the in-place Scale layers (after a BatchNorm that is not in
place, as MobileNet writes them) whose saved input copy whole training iterations replace by
re-normalizing the BatchNorm's intact input in the Scale's backward: one full-size buffer per such
layer less, for one extra elementwise pass (also under ``PYCAFFE_LITE_SHARE_DIFFS``).
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


def shared_diff_slots(net: NetGraph) -> list[tuple[int, list[int]]]:
    """``[(bytes, [blob ids])]``: each slot's size and the blobs whose diffs it holds in turn."""
    layers = len(net.layers)
    first: dict[int, int] = {}  # blob id -> highest layer index touching it (its first backward step)
    last: dict[int, int] = {}  # blob id -> lowest layer index producing it (its last backward step)
    for k in range(layers):
        for bid in net.bottom_id_vecs[k]:
            first[bid] = max(first.get(bid, -1), k)
        for bid in net.top_id_vecs[k]:
            first[bid] = max(first.get(bid, -1), k)
            last[bid] = min(last.get(bid, layers), k)
    keep = set(net.input_blob_indices)
    keep |= {bid for bid, w in enumerate(net.blob_loss_weights) if w}
    # The first backward step touching a candidate must write its diff (a consumer propagating to
    # it, not producing it): otherwise Caffe's backward would read a diff nobody wrote (zeros).
    def written_first(bid: int) -> bool:
        k = first[bid]
        return net.layer_need_backward[k] and bid not in net.top_id_vecs[k] and any(
            b == bid and need for b, need in zip(net.bottom_id_vecs[k], net.bottom_need_backward[k]))

    candidates = [bid for bid in last if bid not in keep and net.blob_need_backward[bid] and written_first(bid)]
    blobs = net.blobs
    steps = layers - 1  # backward step of layer k
    return assign_slots([(steps - first[b], steps - last[b], blobs[b].count * blobs[b].dtype.itemsize, b)
                         for b in candidates])


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
    through its ``data``/``diff`` properties (layers never use those):

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
                 skippable: Sequence[frozenset[int]] = ()) -> None:
        self.net = net
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
        for blob in (*self.net.blobs, *self.net.params_list):
            blob.on_access = self._access if on else None

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
                # current (no device traffic), the others on their first access (_access).
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
    def _access(self, blob: Blob) -> None:
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
