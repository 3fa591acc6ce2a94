"""The two ways a solver runs one training iteration, behind one interface.

Both take the executor of the train net's graph, the :class:`~.update.Update` and the solver's
pycaffe callbacks, and answer, in Caffe's order within ``Solver::Step``:

- ``forward_backward(it, display)``: the passes; returns the ``(iteration, loss)`` pairs whose
  loss is known now, oldest first;
- ``apply_update(it)``: the gradients-ready callbacks and the update;
- ``settle()``: the pairs still queued (one host sync), oldest first.

:class:`PlainIteration` is Caffe's body: clear the param diffs, ``iter_size`` x forward/backward
with the loss read at once (data only the forward reads kept in the gradient slots:
``Executor.forward_backward(training=True)``), then the callbacks and :meth:`Update.apply` (host-driven kernels or
numpy).

:class:`ReplayedIteration` runs the whole iteration (diff clearing, forward, backward, the
callbacks marked ``graph_safe``, the next rate from the update's device table and the fused
update) as one CUDA-graph replay in ``forward_backward``; its ``apply_update`` has nothing left to do. Its
losses stay on the device until a display, a test or the end of ``step`` settles them.
"""

from __future__ import annotations

from collections.abc import Callable

from ..runtime.executor import Executor
from .update import Update

Callbacks = list[tuple[Callable[[], None] | None, Callable[[], None] | None]]


class PlainIteration:
    def __init__(self, executor: Executor, update: Update, callbacks: Callbacks) -> None:
        self.executor, self.update, self.callbacks = executor, update, callbacks

    def forward_backward(self, it: int, display: bool) -> list[tuple[int, float]]:
        self.executor.clear_param_diffs()
        iter_size = self.update.param.iter_size
        loss = sum(self.executor.forward_backward(training=True) for _ in range(iter_size))
        return [(it, loss / iter_size)]

    def apply_update(self, it: int) -> None:
        for _, on_ready in self.callbacks:
            if on_ready is not None:
                on_ready()
        self.update.apply(it)

    def settle(self) -> list[tuple[int, float]]:
        return []  # every loss was read when it was computed


class ReplayedIteration:
    def __init__(self, executor: Executor, update: Update, callbacks: Callbacks, tag: str) -> None:
        self.executor, self.update, self.callbacks, self.tag = executor, update, callbacks, tag
        self.queued: list[int] = []  # iterations whose loss is still on the device

    def possible(self) -> bool:
        """GPU mode, ``iter_size`` 1, no gradient clipping (it reads a norm back to the host), only
        graph-safe callbacks (others run host code mid-way) and a net whose backward runs on the device."""
        p = self.update.param
        if p.iter_size != 1 or p.clip_gradients >= 0 or not all(
                getattr(fn, "graph_safe", False) for pair in self.callbacks for fn in pair if fn is not None):
            return False
        return self.executor.can_replay_iteration()

    def forward_backward(self, it: int, display: bool) -> list[tuple[int, float]]:
        self.update.schedule(it)
        self.executor.train_iteration(self._in_graph, self.tag)
        self.queued.append(it)
        loss_log = self.executor.loss_log
        assert loss_log is not None
        return self.settle() if display or loss_log.full else []

    def _in_graph(self) -> None:
        for _, on_ready in self.callbacks:  # graph-safe ones only (multi-GPU gradient reduction)
            if on_ready is not None:
                on_ready()
        self.update.queue_replayed()

    def apply_update(self, it: int) -> None:
        """The replay ran the callbacks and the update."""

    def settle(self) -> list[tuple[int, float]]:
        if not self.queued:
            return []
        assert self.executor.loss_log is not None
        out = list(zip(self.queued, self.executor.loss_log.read()))
        self.queued.clear()
        return out
