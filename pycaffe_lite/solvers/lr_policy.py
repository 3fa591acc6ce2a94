"""Learning-rate policies of Caffe's SGDSolver (``SolverParameter.lr_policy``).

With ``it`` the current iteration and ``base_lr``, ``gamma``, ``power``, ``stepsize``,
``stepvalue``, ``max_iter`` taken from the SolverParameter:

- ``fixed``:     base_lr
- ``step``:      base_lr · gamma ^ floor(it / stepsize)
- ``exp``:       base_lr · gamma ^ it
- ``inv``:       base_lr · (1 + gamma · it) ^ (−power)
- ``multistep``: base_lr · gamma ^ k, k = number of ``stepvalue`` entries passed so far
- ``poly``:      base_lr · (1 − it / max_iter) ^ power
- ``sigmoid``:   base_lr · 1 / (1 + exp(−gamma · (it − stepsize)))

``step`` and ``multistep`` keep a step counter (``current_step``, saved in the solverstate).
As in Caffe, ``multistep`` advances it by at most one per call, when ``it`` reaches the next
``stepvalue``; so the rate must be queried every iteration, as the solver does.
"""

from __future__ import annotations

import math

from ..errors import CaffeError
from ..schema import caffe_pb2

POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


class SolverConfigError(CaffeError):
    """A SolverParameter value is missing or out of range."""


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise SolverConfigError(message)


def _pow(x: float, y: float) -> float:
    try:
        return math.pow(x, y)
    except OverflowError:
        return math.inf
    except ValueError:  # negative base, fractional power (poly past max_iter): Caffe gives NaN
        return math.nan


def learning_rate(param: caffe_pb2.SolverParameter, it: int, current_step: int = 0) -> tuple[float, int]:
    """The rate at iteration ``it`` and the updated step counter: ``(rate, current_step)``."""
    policy = param.lr_policy
    base = param.base_lr
    gamma = param.gamma
    if policy == "fixed":
        return base, current_step
    if policy == "step":
        _need(param.stepsize > 0, f"lr_policy 'step' needs stepsize > 0, got {param.stepsize}")
        _need(gamma >= 0, f"lr_policy 'step' needs gamma >= 0, got {gamma}")
        current_step = it // param.stepsize
        return base * _pow(gamma, current_step), current_step
    if policy == "exp":
        _need(gamma >= 0, f"lr_policy 'exp' needs gamma >= 0, got {gamma}")
        return base * _pow(gamma, it), current_step
    if policy == "inv":
        _need(gamma >= 0, f"lr_policy 'inv' needs gamma >= 0, got {gamma}")
        return base * _pow(1.0 + gamma * it, -param.power), current_step
    if policy == "multistep":
        if current_step < len(param.stepvalue) and it >= param.stepvalue[current_step]:
            current_step += 1
        _need(gamma >= 0, f"lr_policy 'multistep' needs gamma >= 0, got {gamma}")
        return base * _pow(gamma, current_step), current_step
    if policy == "poly":
        _need(param.max_iter > 0, f"lr_policy 'poly' needs max_iter > 0, got {param.max_iter}")
        return base * _pow(1.0 - it / param.max_iter, param.power), current_step
    if policy == "sigmoid":
        _need(gamma >= 0, f"lr_policy 'sigmoid' needs gamma >= 0, got {gamma}")
        _need(param.stepsize > 0, f"lr_policy 'sigmoid' needs stepsize > 0, got {param.stepsize}")
        x = -gamma * (it - param.stepsize)
        return (base / (1.0 + math.exp(x)) if x < 700 else 0.0), current_step
    if not policy:
        raise SolverConfigError(f"solver has no lr_policy (one of: {', '.join(POLICIES)})")
    raise SolverConfigError(f"unknown lr_policy '{policy}' (known: {', '.join(POLICIES)})")
