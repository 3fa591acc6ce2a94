"""The six update rules of Caffe's ``sgd_solvers`` (CPU in numpy, GPU in ``updates.cu``).

With ``g`` the clipped, normalized and regularized gradient, ``lr`` the local rate (policy rate
times the param's ``lr_mult``) and ``h`` (``h2``) the history blobs, each rule writes the update
value into the param's diff (then ``data -= diff``):

- SGD:      h = momentum·h + lr·g;                        update = h
- Nesterov: h' = momentum·h + lr·g;                       update = (1+momentum)·h' − momentum·h
- AdaGrad:  h += g²;                                      update = lr·g / (√h + delta)
- RMSProp:  h = rms_decay·h + (1−rms_decay)·g²;           update = lr·g / (√h + delta)
- AdaDelta: h = m·h + (1−m)·g²;  s = g·√((h2+delta)/(h+delta));  h2 = m·h2 + (1−m)·s²;
            update = lr·s   (m = ``momentum``)
- Adam:     m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;
            update = lr·√(1−β2^t)/(1−β1^t) · m / (√v + delta),  t = iter + 1
            (β1 = ``momentum``, β2 = ``momentum2``)

History layout is Caffe's, so ``.solverstate`` files interoperate: one blob per learnable param,
and for AdaDelta/Adam a second set after the first (``h2`` / ``v``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ..gpu import backend
from ..proto import caffe_pb2
from .lr_policy import SolverConfigError
from .solver import Solver, load_solver_param

KERNELS = Path(__file__).with_name("updates.cu")


def _update_gpu(name: str, blob, history, *args) -> None:
    """Launch update kernel ``name(count, w, g, *history, *args)`` over ``blob``'s data and diff."""

    backend.kernel(KERNELS, name, blob.dtype)(blob.count, blob.mutable_gpu_data(), blob.mutable_gpu_diff(),
                                              *(h.mutable_gpu_data() for h in history), *args)


class SGDSolver(Solver):
    """Stochastic gradient descent with momentum (``type: "SGD"``)."""

    type_name = "SGD"

    @property
    def lr(self) -> float:
        """pycaffe's ``SGDSolver.lr`` (BVLC's GetLearningRate): the policy's rate at the current iteration."""
        return self.learning_rate

    def update_cpu(self, param_id: int, diff: np.ndarray, local_rate) -> None:
        (h,) = (b.mutable_cpu_data() for b in self.history_views(param_id))
        h *= self.dtype.type(self.param.momentum)
        diff *= local_rate  # in place (no temporary): the diff is overwritten with h below anyway
        h += diff
        diff[...] = h

    def update_gpu(self, param_id, blob, rate_ptr, lr_mult, scale, decay, reg) -> None:
        _update_gpu("sgd_update", blob, self.history_views(param_id),
                    scale, decay, reg, self.param.momentum, rate_ptr, lr_mult)


class NesterovSolver(Solver):
    """Nesterov's accelerated gradient (``type: "Nesterov"``)."""

    type_name = "Nesterov"

    def update_cpu(self, param_id: int, diff: np.ndarray, local_rate) -> None:
        (h,) = (b.mutable_cpu_data() for b in self.history_views(param_id))
        momentum = self.dtype.type(self.param.momentum)
        old = h.copy()
        h *= momentum
        h += local_rate * diff
        diff[...] = (self.dtype.type(1) + momentum) * h - momentum * old

    def update_gpu(self, param_id, blob, rate_ptr, lr_mult, scale, decay, reg) -> None:
        _update_gpu("nesterov_update", blob, self.history_views(param_id),
                    scale, decay, reg, self.param.momentum, rate_ptr, lr_mult)


class AdaGradSolver(Solver):
    """AdaGrad (``type: "AdaGrad"``); ``momentum`` must be 0."""

    type_name = "AdaGrad"

    def check_rule_param(self) -> None:
        if self.param.momentum != 0:
            raise SolverConfigError(f"Momentum cannot be used with AdaGrad (momentum: {self.param.momentum})")

    def update_cpu(self, param_id: int, diff: np.ndarray, local_rate) -> None:
        (h,) = (b.mutable_cpu_data() for b in self.history_views(param_id))
        h += diff * diff
        diff[...] = local_rate * (diff / (np.sqrt(h) + self.dtype.type(self.param.delta)))

    def update_gpu(self, param_id, blob, rate_ptr, lr_mult, scale, decay, reg) -> None:
        _update_gpu("adagrad_update", blob, self.history_views(param_id),
                    scale, decay, reg, self.param.delta, rate_ptr, lr_mult)


class RMSPropSolver(Solver):
    """RMSProp (``type: "RMSProp"``, ``rms_decay``); ``momentum`` must be 0."""

    type_name = "RMSProp"

    def check_rule_param(self) -> None:
        if self.param.momentum != 0:
            raise SolverConfigError(f"Momentum cannot be used with RMSProp (momentum: {self.param.momentum})")
        if not 0 <= self.param.rms_decay <= 1:
            raise SolverConfigError(f"RMSProp: rms_decay must be in [0, 1], got {self.param.rms_decay}")

    def update_cpu(self, param_id: int, diff: np.ndarray, local_rate) -> None:
        (h,) = (b.mutable_cpu_data() for b in self.history_views(param_id))
        decay = self.dtype.type(self.param.rms_decay)
        h *= decay
        h += (self.dtype.type(1) - decay) * (diff * diff)
        diff[...] = local_rate * (diff / (np.sqrt(h) + self.dtype.type(self.param.delta)))

    def update_gpu(self, param_id, blob, rate_ptr, lr_mult, scale, decay, reg) -> None:
        _update_gpu("rmsprop_update", blob, self.history_views(param_id),
                    scale, decay, reg, self.param.rms_decay, self.param.delta, rate_ptr, lr_mult)


class AdaDeltaSolver(Solver):
    """AdaDelta (``type: "AdaDelta"``; ``momentum`` is the decay, ``delta`` the epsilon)."""

    type_name = "AdaDelta"
    history_factor = 2

    def update_cpu(self, param_id: int, diff: np.ndarray, local_rate) -> None:
        h, h2 = (b.mutable_cpu_data() for b in self.history_views(param_id))
        one = self.dtype.type(1)
        m = self.dtype.type(self.param.momentum)
        delta = self.dtype.type(self.param.delta)
        h *= m
        h += (one - m) * (diff * diff)
        diff *= np.sqrt((h2 + delta) / (h + delta))
        h2 *= m
        h2 += (one - m) * (diff * diff)
        diff *= local_rate

    def update_gpu(self, param_id, blob, rate_ptr, lr_mult, scale, decay, reg) -> None:
        _update_gpu("adadelta_update", blob, self.history_views(param_id),
                    scale, decay, reg, self.param.momentum, self.param.delta, rate_ptr, lr_mult)


class AdamSolver(Solver):
    """Adam (``type: "Adam"``; β1 = ``momentum``, β2 = ``momentum2``, ε = ``delta``)."""

    type_name = "Adam"
    history_factor = 2

    def device_rate(self, rate: float, it: int | None = None) -> float:
        return self._corrected_rate(rate, it)

    def _corrected_rate(self, local_rate: float, it: int | None = None) -> float:
        t = (self.iter if it is None else it) + 1
        p = self.param
        return local_rate * math.sqrt(1.0 - p.momentum2**t) / (1.0 - p.momentum**t)

    def update_cpu(self, param_id: int, diff: np.ndarray, local_rate) -> None:
        m, v = (b.mutable_cpu_data() for b in self.history_views(param_id))
        one = self.dtype.type(1)
        b1 = self.dtype.type(self.param.momentum)
        b2 = self.dtype.type(self.param.momentum2)
        m *= b1
        m += (one - b1) * diff
        v *= b2
        v += (one - b2) * (diff * diff)
        rate = self.dtype.type(self._corrected_rate(float(local_rate)))
        diff[...] = rate * (m / (np.sqrt(v) + self.dtype.type(self.param.delta)))

    def update_gpu(self, param_id, blob, rate_ptr, lr_mult, scale, decay, reg) -> None:
        _update_gpu("adam_update", blob, self.history_views(param_id),
                    scale, decay, reg, self.param.momentum, self.param.momentum2, self.param.delta, rate_ptr, lr_mult)


SOLVERS: dict[str, type[Solver]] = {
    cls.type_name: cls
    for cls in (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver, AdaDeltaSolver, AdamSolver)
}


def solver_class(type_name: str) -> type[Solver]:
    """The solver class registered for a ``SolverParameter.type``."""
    try:
        return SOLVERS[type_name]
    except KeyError:
        raise SolverConfigError(
            f"unknown solver type '{type_name}' (known: {', '.join(SOLVERS)})"
        ) from None


def get_solver(
    solver: str | os.PathLike | caffe_pb2.SolverParameter, **kwargs
) -> Solver:
    """A solver of the class named by the file's ``type`` (or legacy ``solver_type``), as
    pycaffe's ``caffe.get_solver``. ``kwargs`` go to :class:`Solver` (``dtype``, ``progress``)."""
    param, _ = load_solver_param(solver)
    try:
        cls = solver_class(param.type)
    except SolverConfigError as exc:
        raise SolverConfigError(f"{solver if isinstance(solver, (str, os.PathLike)) else 'solver'}: {exc}") from None
    return cls(solver, **kwargs)


__all__ = [
    "AdaDeltaSolver",
    "AdaGradSolver",
    "AdamSolver",
    "NesterovSolver",
    "RMSPropSolver",
    "SGDSolver",
    "SOLVERS",
    "get_solver",
    "solver_class",
]
