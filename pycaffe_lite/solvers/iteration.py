"""The two ways a solver runs one training iteration, behind one interface.

:class:`PlainIteration` is Caffe's ``Solver::Step`` body: clear the param diffs, ``iter_size`` x
forward/backward through the executor, the loss read at once, the gradients-ready callbacks, then
``apply_update`` (host-driven kernels or numpy).

:class:`ReplayedIteration` runs the whole iteration (diff clearing, forward, backward, the fused
update) as one CUDA-graph replay. Its learning rates come from a device table of the next
:attr:`ReplayedIteration.RATE_TABLE` iterations that it owns (one upload per table; a kernel in the
replay moves the next entry into the rate slot the update kernels read), and its losses stay on the
device until :meth:`settle` reads a batch of them with one sync.

The solver asks each iteration which one applies (:meth:`ReplayedIteration.possible`) and calls, in
Caffe's order: ``prepare`` (before testing and the start callbacks), ``run`` (the passes and the
loss), then ``finish`` (the gradients-ready callbacks and the update).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, SupportsInt

import numpy as np

from ..blob import Blob
from ..gpu import backend
from ..net import Net
from ..proto import caffe_pb2
from . import lr_policy


class Driver(Protocol):
    """What an iteration needs of its solver (:class:`~pycaffe_lite.solvers.solver.Solver`)."""

    param: caffe_pb2.SolverParameter
    net: Net
    iter: int
    current_step: int
    history: list[Blob]
    callbacks: list[tuple[Callable[[], None] | None, Callable[[], None] | None]]
    dtype: np.dtype

    def account_loss(self, it: int, loss: float) -> None: ...
    def apply_update(self) -> None: ...
    def device_rate(self, rate: float, it: int | None = None) -> float: ...
    def rate_slot(self) -> int: ...
    def log_rate(self, rate: float) -> None: ...
    def queue_gpu_updates(self) -> None: ...


class PlainIteration:
    def __init__(self, solver: Driver) -> None:
        self.solver = solver

    def prepare(self) -> None:
        self.solver.net.clear_param_diffs()

    def run(self, display: bool) -> None:
        s = self.solver
        loss = 0.0
        for _ in range(s.param.iter_size):
            loss += s.net.forward_backward()
        s.account_loss(s.iter, loss / s.param.iter_size)

    def finish(self) -> None:
        s = self.solver
        for _, on_ready in s.callbacks:
            if on_ready is not None:
                on_ready()
        s.apply_update()

    def settle(self) -> None:
        """Nothing is queued: every loss was read when it was computed."""


class ReplayedIteration:
    RATE_TABLE = 256

    def __init__(self, solver: Driver) -> None:
        self.solver = solver
        self._table: tuple[int, list[tuple[float, int]]] | None = None  # (first iter, (rate, step)s)
        self._device: tuple[SupportsInt, SupportsInt] | None = None  # (rates, cursor) on the device
        self.queued: list[int] = []  # iterations whose loss is still on the device

    def reset(self) -> None:
        """Forget the rate table (the solver's parameters may have changed since the last step)."""
        self._table = None

    def possible(self) -> bool:
        """GPU mode, ``iter_size`` 1, no gradient clipping (it reads a norm back to the host), only
        graph-safe callbacks (others run host code mid-way) and a net whose backward runs on the device."""
        s = self.solver
        if s.param.iter_size != 1 or s.param.clip_gradients >= 0 or not all(
                getattr(fn, "graph_safe", False) for pair in s.callbacks for fn in pair if fn is not None):
            return False
        return s.net.executor.can_replay_iteration()

    def prepare(self) -> None:
        """The replay clears the diffs itself."""

    def run(self, display: bool) -> None:
        s = self.solver
        self._schedule_rates()
        for h in s.history:  # restored or user-edited history reaches the replay
            h.gpu_data()
        s.net.executor.train_iteration(self._queue_update, type(s).__name__)
        self.queued.append(s.iter)
        loss_log = s.net.executor.loss_log
        assert loss_log is not None
        if display or loss_log.full:
            self.settle()

    def finish(self) -> None:
        """The replay ran the callbacks and the update."""

    def settle(self) -> None:
        """Read the queued losses (one sync) and account for them in order."""
        if not self.queued:
            return
        s = self.solver
        assert s.net.executor.loss_log is not None
        for it, loss in zip(self.queued, s.net.executor.loss_log.read()):
            s.account_loss(it, loss)
        self.queued.clear()

    def _schedule_rates(self) -> None:
        s = self.solver
        table = self._table
        if table is None or not table[0] <= s.iter < table[0] + len(table[1]):
            steps, values, cs = [], [], s.current_step
            for j in range(self.RATE_TABLE):
                rate, cs = lr_policy.learning_rate(s.param, s.iter + j, cs)
                steps.append((rate, cs))
                values.append(s.device_rate(rate, s.iter + j))
            s.rate_slot()  # allocated before any capture
            if self._device is None:
                self._device = (backend.alloc(self.RATE_TABLE * s.dtype.itemsize), backend.alloc(4))
            backend.memcpy_htod(int(self._device[0]), np.array(values, s.dtype))
            backend.memset_zero(int(self._device[1]), 4)
            self._table = table = (s.iter, steps)
        rate, s.current_step = table[1][s.iter - table[0]]
        s.log_rate(rate)

    def _queue_update(self) -> None:
        """The update inside the replay: graph-safe callbacks, the next table rate, the fused updates."""
        s = self.solver
        assert self._device is not None
        values, cursor = (int(a) for a in self._device)
        for _, on_ready in s.callbacks:  # graph-safe ones only (multi-GPU gradient reduction)
            if on_ready is not None:
                on_ready()
        backend.elementwise("next_rate", "const Dtype* table, int* cursor, Dtype* rate",
                            "rate[0] = table[cursor[0]]; cursor[0] += 1", s.dtype)(1, values, cursor, s.rate_slot())
        s.queue_gpu_updates()
