"""Memory plans: blobs whose values are never live at the same time share memory. This module
plans; the classes that apply a plan and keep pycaffe's semantics are ``shared_diffs.SharedDiffs``
(gradients), ``shared_data.SharedData`` (nets without backward), ``forward_data.ForwardOnlyData``
(data only forward passes read, in nets with backward) and ``training_data.TrainingData`` (such
data in training iterations, kept inside their gradient slots: :func:`training_slots`).

:func:`shared_diff_slots` plans the gradients of a backward pass over a layer range. In Caffe
every blob keeps a diff as large as its data; but the backward pass writes a blob's diff when it
reaches the blob's last consumer and reads it for the last time at the blob's producer, so diffs
of blobs whose [consumer, producer] ranges of the backward pass do not overlap can use one buffer.
:class:`~.shared_diffs.SharedDiffs` applies the plan to every backward (pycaffe's ``net.backward()`` over any
range, ``forward_backward_all``, the solver's iterations; CPU and GPU) and keeps pycaffe's
semantics: see its docstring (``PYCAFFE_LITE_SHARE_DIFFS=0`` turns it off). After a pass the diffs
of intermediate blobs hold whatever the last blob using their buffer wrote until a user reads
them (then the pass is re-run). The range's seeds (diffs it reads before writing), net inputs and
sources, outputs, loss tops, parameters and the blobs ``backward(diffs=[...])`` names keep their
own diffs.

:func:`shared_data_slots` plans the data of a net that never runs backward (a deploy net): a
blob's data is live from its producer to its last consumer. :class:`~.shared_data.SharedData` applies that plan
on the host or the device and keeps pycaffe's semantics: see its docstring
(``PYCAFFE_LITE_SHARE_DATA=0`` turns it off). The plans share one allocator, :func:`assign_slots`.

:func:`recomputable_inputs` finds the in-place Scale layers (after a BatchNorm that is not in
place, as MobileNet writes them) whose saved input copy training iterations and pycaffe forwards
on the GPU replace by re-normalizing the BatchNorm's intact input in the Scale's backward: one
full-size buffer per such layer less, for one extra elementwise pass (also under
``PYCAFFE_LITE_SHARE_DIFFS``; :meth:`~.shared_diffs.SharedDiffs.regenerating` checks the input is unchanged).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from .. import common
from ..blob import Blob, shape_generation
from ..config import config
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
        if not scale.traits.saves_input_in_place or len(net.bottom_id_vecs[k]) != 1 or tops[k] != net.bottom_id_vecs[k]:
            continue
        bid = tops[k][0]
        j = max((i for i in range(k) if bid in tops[i]), default=-1)
        if j < 0 or not net.layers[j].traits.regenerates_top or net.bottom_id_vecs[j][0] == bid:
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


def shared_data_slots(net: NetGraph, keep: Collection[int] = (),
                      only: Collection[int] | None = None) -> list[tuple[int, list[list[int]]]]:
    """``[(bytes, [groups])]`` for a net that runs no backward: each slot's size and the groups of
    blob ids whose data it holds in turn, in forward order. A group is the blobs of one data memory
    (a Split's bottom and tops, a Flatten/Reshape view and its bottom); it is live from the first
    layer touching one of them to the last. Never shared: ``keep``, sources (:func:`source_blobs`),
    outputs, loss tops, and memory a layer holds in a blob of its own (params, internal blobs).
    ``only``: plan these blobs alone (:func:`forward_only_blobs` in a net that runs backward)."""
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
                 for key, bids in groups.items() if key not in held and not never.intersection(bids)
                 and (only is None or set(bids) <= set(only))]
    return assign_slots(intervals)


def forward_only_blobs(net: NetGraph, training: bool = False) -> set[int]:
    """Blob ids whose data only forward passes read, in a net that runs backward: the blob has a
    memory of its own, every layer touching it says its backward does not read it
    (``backward_reads_data``: a convolution's top, a BatchNorm on global statistics, an in-place
    BatchNorm or Scale, which keep what their backward needs in buffers of their own, an Eltwise
    SUM's bottoms), and it is no source, output or loss top.

    TEST phase (``training`` False): also one layer with a ``pure_forward`` writes it (a re-run of
    that layer recomputes a stale one). Published MobileNet and ResNet files write Convolution ->
    BatchNorm -> Scale with a top per layer: the convolutions' tops. ``training``: a TRAIN-phase
    net driven by whole training iterations (forward, backward, update), where nothing recomputes a
    stale blob (reading one after the iteration is an error), so in-place chains qualify too:
    ResNet's Convolution -> BatchNorm -> Scale blobs that feed only an Eltwise SUM."""
    phase = common.TRAIN if training else common.TEST
    if net.phase != phase or not any(net.layer_need_backward):
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
        if b in never or memories[id(net.blobs[b].data_memory)] != 1:
            continue
        producers = [k for k, as_top, _ in uses if as_top]
        if not training and (len(producers) != 1 or not net.layers[producers[0]].traits.pure_forward
                             or len(net.top_id_vecs[producers[0]]) != 1
                             or producers[0] in {k for k, as_top, _ in uses if not as_top}):
            continue
        if not any(net.layers[k].backward_reads_data(as_top, i) for k, as_top, i in uses):
            out.add(b)
    return out


@dataclass(frozen=True)
class TrainingSlot:
    """One buffer of a training iteration's plan: ``diffs`` (groups of blob ids of one diff memory)
    hold gradients in it during the backward, ``data`` (groups of one data memory) forward-only
    data during the forward before; ``nbytes`` covers the largest of either."""

    nbytes: int
    diffs: list[list[int]]
    data: list[list[int]]


def training_slots(diff_plan: Sequence[tuple[int, list[list[int]]]],
                   data_plan: Sequence[tuple[int, list[list[int]]]]) -> list[TrainingSlot]:
    """Place a :func:`shared_data_slots` plan of :func:`forward_only_blobs` (``training``) inside
    the gradient slots of a :func:`shared_diff_slots` plan of the same iteration's backward: during
    the forward those slots are idle (the backward writes each planned diff before reading it) and
    no backward reads that data, so each data slot goes into one diff slot, the largest into the
    largest (which keeps the sum of the maxima least), and the buffer is as large as either use.
    Data slots left over keep buffers of their own. Returns the buffers worth allocating: two
    memories or more (a diff slot alone with one group keeps that diff in memory of its own)."""
    diffs = sorted(diff_plan, key=lambda s: -s[0])
    data = sorted(data_plan, key=lambda s: -s[0])
    out = []
    for n in range(max(len(diffs), len(data))):
        d_bytes, d_groups = diffs[n] if n < len(diffs) else (0, [])
        f_bytes, f_groups = data[n] if n < len(data) else (0, [])
        if len(d_groups) + len(f_groups) > 1:
            out.append(TrainingSlot(max(d_bytes, f_bytes), list(d_groups), list(f_groups)))
    return out


def training_data_blobs(net: NetGraph) -> set[int]:
    """What training iterations keep in their gradient slots: :func:`forward_only_blobs` with
    ``training``, but the sources a Scale input is regenerated from (:func:`recomputable_inputs`),
    and nothing in a net with a layer acting outside it."""
    if any(layer.traits.outside_effects for layer in net.layers):
        return set()
    regenerated = {id(source.data_memory) for _, _, source in recomputable_inputs(net)}
    return {b for b in forward_only_blobs(net, training=True) if id(net.blobs[b].data_memory) not in regenerated}


def training_blob_bytes(net: NetGraph, data: bool = True) -> tuple[int, int]:
    """``(alone, planned)``: bytes of the net blobs' data and diff memories (params excluded) in a
    training iteration over every layer, each memory alone, and under the iteration's plan: the
    gradient slots (:func:`shared_diff_slots`) holding, with ``data``, the forward-only data too
    (:func:`training_slots`), plus every memory no slot holds. A count on the host: nothing is
    allocated."""
    memories: dict[int, int] = {}
    for blob in net.blobs:
        memories[id(blob.data_memory)] = blob.data_memory.nbytes
        memories[id(blob.diff_memory)] = blob.diff_memory.nbytes
    data_plan = shared_data_slots(net, only=training_data_blobs(net)) if data else []
    slots = training_slots(shared_diff_slots(net), data_plan)
    planned = {id(net.blobs[bids[0]].diff_memory) for slot in slots for bids in slot.diffs}
    planned |= {id(net.blobs[bids[0]].data_memory) for slot in slots for bids in slot.data}
    alone = sum(memories.values())
    return alone, alone - sum(memories[key] for key in planned) + sum(slot.nbytes for slot in slots)


class BlobLayout:
    """What a memory plan of ``net`` depends on that a reshape may change: each net blob's shape and
    memories (:meth:`key`). Recounted only after a reshape anywhere (:func:`shape_generation`); a
    layer reshaping buffers of its own (on its first forward, say) leaves it equal, so plans made
    before stand (a new plan allocates its slots while the old ones still hold their values)."""

    def __init__(self, net: NetGraph) -> None:
        self.net = net
        self._generation = -1
        self._key: tuple = ()

    def key(self) -> tuple:
        gen = shape_generation()
        if gen != self._generation:
            self._generation = gen
            self._key = tuple((b.shape, id(b.data_memory), id(b.diff_memory)) for b in self.net.blobs)
        return self._key


def new_slot(nbytes: int, on_gpu: bool):
    """One buffer of a plan: a device allocation on the GPU, a byte array on the host."""
    return backend.alloc(max(nbytes, 8)) if on_gpu else np.empty(nbytes, np.uint8)


@dataclass
class DataSlots:
    """A data plan applied (:func:`point_data_into_slots`)."""

    buffers: list = field(default_factory=list)  # one per slot shared by two groups or more
    nbytes: list[int] = field(default_factory=list)
    memories: list[SyncedMemory] = field(default_factory=list)  # the memories pointed into them
    planned: set[int] = field(default_factory=set)  # their blob ids
    overwritten: set[int] = field(default_factory=set)  # blob ids a later member of their slot overwrites


def point_data_into_slots(net: NetGraph, plan: list[tuple[int, list[list[int]]]], on_gpu: bool) -> DataSlots:
    """Allocate the slots of a :func:`shared_data_slots` plan and point its groups' data into them."""
    out = DataSlots()
    for nbytes, groups in plan:
        if len(groups) < 2:
            continue
        slot = new_slot(nbytes, on_gpu)
        out.buffers.append(slot)
        out.nbytes.append(nbytes)
        out.overwritten.update(b for bids in groups[:-1] for b in bids)
        for bids in groups:
            mem = net.blobs[bids[0]].data_memory
            point_into(mem, slot, on_gpu)
            out.memories.append(mem)
            out.planned.update(bids)
    return out


def point_into(mem: SyncedMemory, slot, on_gpu: bool) -> None:
    """Keep ``mem``'s next values in ``slot`` (shared with other memories of the plan)."""
    if on_gpu:
        mem.use_storage(device=slot)
    else:
        mem.use_storage(host=slot[:mem.nbytes].view(mem.dtype))
