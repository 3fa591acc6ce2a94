"""Memory plans: blobs whose values are never live at the same time share device memory.

:func:`shared_diff_slots` plans the gradients of a training iteration. In Caffe every blob keeps a
diff as large as its data; but the backward pass writes a blob's diff when it reaches the blob's
last consumer and reads it for the last time at the blob's producer, so diffs of blobs whose
[consumer, producer] ranges of the backward pass do not overlap can use one buffer. The executor
applies the plan to whole training iterations on the GPU (``PYCAFFE_LITE_SHARE_DIFFS=0`` turns it
off); after such an iteration the diffs of intermediate blobs hold whatever the last blob using
their buffer wrote. Loss tops (their diff holds the loss weight), net inputs, parameters and blobs
that take no gradient keep their own diffs.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .net import Net


def sharing_enabled() -> bool:
    return os.environ.get("PYCAFFE_LITE_SHARE_DIFFS", "1") != "0"


def shared_diff_slots(net: Net) -> list[tuple[int, list[int]]]:
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
    keep |= {bid for bid, w in enumerate(net._blob_loss_weights) if w}
    # The first backward step touching a candidate must write its diff (a consumer propagating to
    # it, not producing it): otherwise Caffe's backward would read a diff nobody wrote (zeros).
    def written_first(bid: int) -> bool:
        k = first[bid]
        return net.layer_need_backward[k] and bid not in net.top_id_vecs[k] and any(
            b == bid and need for b, need in zip(net.bottom_id_vecs[k], net.bottom_need_backward[k]))

    candidates = [bid for bid in last if bid not in keep and net._blob_need_backward[bid] and written_first(bid)]
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for bid in candidates:
        starts.setdefault(first[bid], []).append(bid)
        ends.setdefault(last[bid], []).append(bid)
    slots: list[tuple[int, list[int]]] = []
    free: list[int] = []  # slot indices whose current blob's lifetime has ended
    holder: dict[int, int] = {}  # blob id -> slot index
    for k in range(layers - 1, -1, -1):  # the backward pass, step by step
        for bid in sorted(starts.get(k, ()), key=lambda b: -net._blobs[b].count):
            need = net._blobs[bid].count * net._blobs[bid].dtype.itemsize
            fitting = [i for i in free if slots[i][0] >= need]
            if fitting:  # the smallest slot that fits, else grow the largest free one
                i = min(fitting, key=lambda j: slots[j][0])
            elif free:
                i = max(free, key=lambda j: slots[j][0])
            else:
                slots.append((0, []))
                i = len(slots) - 1
            if i in free:
                free.remove(i)
            size, members = slots[i]
            slots[i] = (max(size, need), members + [bid])
            holder[bid] = i
        for bid in ends.get(k, ()):  # read for the last time at step k: free after it
            free.append(holder[bid])
    return slots
