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

A rule is a value of the solver's parameters: it holds no state (the history blobs belong to the
:class:`~pycaffe_lite.solvers.update.Update` that calls it). History layout is Caffe's, so
``.solverstate`` files interoperate: one blob per learnable param, and for AdaDelta/Adam a second
set after the first (``h2`` / ``v``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

import numpy as np

from ..blob import Blob
from ..gpu import backend
from ..schema import caffe_pb2
from .lr_policy import SolverConfigError

KERNELS = Path(__file__).with_name("updates.cu")


class Rule:
    """One update rule over a param's diff (CPU) or data + diff (GPU), given its history."""

    name: ClassVar[str] = ""
    history_factor: ClassVar[int] = 1  # history blobs per learnable param
    kernel: ClassVar[str] = ""  # updates.cu entry point: name(count, w, g, *history, scale, decay, reg, *args, rate, lr_mult)

    def __init__(self, param: caffe_pb2.SolverParameter, dtype: np.dtype) -> None:
        self.param = param
        self.dtype = np.dtype(dtype)

    def check(self, where: str) -> None:
        """SolverConfigError naming ``where`` for parameters this rule cannot use."""

    def device_rate(self, rate: float, it: int) -> float:
        """The base rate the GPU kernels read at iteration ``it`` (Adam folds its bias correction in)."""
        return rate

    def cpu(self, diff: np.ndarray, history: list[np.ndarray], local_rate: np.floating, it: int) -> None:
        """Turn the regularized gradient ``diff`` into the update value, in place."""
        raise NotImplementedError(f"{type(self).__name__}.cpu")

    def kernel_args(self) -> tuple[float, ...]:
        """The rule's own scalars, between ``reg`` and the rate pointer of its kernel."""
        return (self.param.momentum,)

    def gpu(self, blob: Blob, history: list[Blob], rate_ptr: int, lr_mult: float, scale: float, decay: float,
            reg: int) -> None:
        """Fused GPU step: ``g = g·scale + decay·{w | sign(w)}``, the rule, ``w -= update``; the
        base rate is read from device memory at ``rate_ptr`` (graph-safe)."""
        backend.kernel(KERNELS, self.kernel, blob.dtype)(
            blob.count, blob.mutable_gpu_data(), blob.mutable_gpu_diff(), *(h.mutable_gpu_data() for h in history),
            scale, decay, reg, *self.kernel_args(), rate_ptr, lr_mult)

    def _t(self, x: float) -> np.floating:
        return self.dtype.type(x)


class SGD(Rule):
    name, kernel = "SGD", "sgd_update"

    def cpu(self, diff, history, local_rate, it) -> None:
        (h,) = history
        h *= self._t(self.param.momentum)
        diff *= local_rate  # in place (no temporary): the diff is overwritten with h below anyway
        h += diff
        diff[...] = h


class Nesterov(Rule):
    name, kernel = "Nesterov", "nesterov_update"

    def cpu(self, diff, history, local_rate, it) -> None:
        (h,) = history
        momentum = self._t(self.param.momentum)
        old = h.copy()
        h *= momentum
        h += local_rate * diff
        diff[...] = (self._t(1) + momentum) * h - momentum * old


class AdaGrad(Rule):
    """``momentum`` must be 0."""

    name, kernel = "AdaGrad", "adagrad_update"

    def check(self, where: str) -> None:
        if self.param.momentum != 0:
            raise SolverConfigError(f"Momentum cannot be used with AdaGrad (momentum: {self.param.momentum})")

    def cpu(self, diff, history, local_rate, it) -> None:
        (h,) = history
        h += diff * diff
        diff[...] = local_rate * (diff / (np.sqrt(h) + self._t(self.param.delta)))

    def kernel_args(self) -> tuple[float, ...]:
        return (self.param.delta,)


class RMSProp(Rule):
    """``rms_decay``; ``momentum`` must be 0."""

    name, kernel = "RMSProp", "rmsprop_update"

    def check(self, where: str) -> None:
        if self.param.momentum != 0:
            raise SolverConfigError(f"Momentum cannot be used with RMSProp (momentum: {self.param.momentum})")
        if not 0 <= self.param.rms_decay <= 1:
            raise SolverConfigError(f"RMSProp: rms_decay must be in [0, 1], got {self.param.rms_decay}")

    def cpu(self, diff, history, local_rate, it) -> None:
        (h,) = history
        decay = self._t(self.param.rms_decay)
        h *= decay
        h += (self._t(1) - decay) * (diff * diff)
        diff[...] = local_rate * (diff / (np.sqrt(h) + self._t(self.param.delta)))

    def kernel_args(self) -> tuple[float, ...]:
        return (self.param.rms_decay, self.param.delta)


class AdaDelta(Rule):
    """``momentum`` is the decay, ``delta`` the epsilon."""

    name, kernel, history_factor = "AdaDelta", "adadelta_update", 2

    def cpu(self, diff, history, local_rate, it) -> None:
        h, h2 = history
        one, m, delta = self._t(1), self._t(self.param.momentum), self._t(self.param.delta)
        h *= m
        h += (one - m) * (diff * diff)
        diff *= np.sqrt((h2 + delta) / (h + delta))
        h2 *= m
        h2 += (one - m) * (diff * diff)
        diff *= local_rate

    def kernel_args(self) -> tuple[float, ...]:
        return (self.param.momentum, self.param.delta)


class Adam(Rule):
    """β1 = ``momentum``, β2 = ``momentum2``, ε = ``delta``."""

    name, kernel, history_factor = "Adam", "adam_update", 2

    def device_rate(self, rate: float, it: int) -> float:
        t, p = it + 1, self.param
        return rate * math.sqrt(1.0 - p.momentum2**t) / (1.0 - p.momentum**t)

    def cpu(self, diff, history, local_rate, it) -> None:
        m, v = history
        one, b1, b2 = self._t(1), self._t(self.param.momentum), self._t(self.param.momentum2)
        m *= b1
        m += (one - b1) * diff
        v *= b2
        v += (one - b2) * (diff * diff)
        rate = self._t(self.device_rate(float(local_rate), it))
        diff[...] = rate * (m / (np.sqrt(v) + self._t(self.param.delta)))

    def kernel_args(self) -> tuple[float, ...]:
        return (self.param.momentum, self.param.momentum2, self.param.delta)


RULES: dict[str, type[Rule]] = {cls.name: cls for cls in (SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam)}
