"""Data only forward passes read, in TEST nets that run backward: :class:`ForwardOnlyData` shares
the memory of :func:`~.memory_plan.forward_only_blobs` and recomputes stale ones when read."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .. import common
from ..blob import Blob
from ..errors import NetError
from ..synced_memory import SyncedMemory
from .memory_plan import (
    BlobLayout,
    data_sharing_enabled,
    forward_only_blobs,
    point_data_into_slots,
    shared_data_slots,
)

if TYPE_CHECKING:
    from ..net_graph import NetGraph

log = logging.getLogger("pycaffe_lite")


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
        self.layout = BlobLayout(net)  # the part of the plan key reshapes change
        self.hooks = hooks
        self.watch_changed = watch_changed
        self.watching = False
        self.disabled = False
        self.stale: set[int] = set()
        self.candidates = set() if any(layer.traits.outside_effects for layer in net.layers) else (
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
        key = (self.layout.key(), on_gpu)
        if key == self._key:
            return
        self._release()
        applied = point_data_into_slots(self.net, shared_data_slots(self.net, only=self.candidates), on_gpu)
        self.slots, self._slot_bytes = applied.buffers, applied.nbytes
        self._planned, self._overwritten = applied.planned, applied.overwritten
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
