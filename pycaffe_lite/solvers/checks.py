"""Solver values checked before anything is built: every error names the solver file and field.

BVLC's checks (a known ``lr_policy`` with the fields it needs, ``stepsize > 0``, increasing
``stepvalue``, ``average_loss``/``iter_size >= 1``, one ``test_iter`` per test net...) plus the
values BVLC lets through and that end in a NaN loss: negative, non-finite or huge rates, momentum
outside [0, 1), negative weight decay.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np

from ..net_graph import NetGraph
from ..schema import caffe_pb2
from .lr_policy import POLICIES, SolverConfigError

MAX_BASE_LR = 1e3  # far above any working rate; larger ones diverge at once


def _fail(source: str, field: str, message: str) -> None:
    raise SolverConfigError(f"{source}: {field}: {message}")


def check_solver_param(p: caffe_pb2.SolverParameter, source: str = "solver") -> None:
    """SolverConfigError naming ``source`` and the field for the first bad value of ``p``."""
    gamma, power = _check_rates(p, source)
    for field in ("max_iter", "display", "test_interval", "snapshot"):
        if getattr(p, field) < 0:
            _fail(source, field, f"must be >= 0, got {getattr(p, field)}")
    for i, n in enumerate(p.test_iter):
        if n < 1:
            _fail(source, f"test_iter[{i}]", f"must be >= 1, got {n}")
    if p.test_interval and not p.test_iter and not p.test_net and not p.test_net_param:
        # BVLC makes one test net per test_iter (CHECKs their counts agree), so none here: no test runs
        logging.getLogger("pycaffe_lite").warning(
            "%s: test_interval: %d is set but no test_iter is given: no test net is made, so no test will run "
            "(as in BVLC: one test_iter per test net); add test_iter: N (batches per test) to test",
            source, p.test_interval)
    _check_policy(p, source, gamma, power)


def _finite(p: caffe_pb2.SolverParameter, source: str, field: str) -> float:
    value = getattr(p, field)
    if not math.isfinite(value):
        _fail(source, field, f"must be a finite number, got {value}")
    return value


def _check_rates(p: caffe_pb2.SolverParameter, source: str) -> tuple[float, float]:
    """The rate, momentum and regularization fields; returns (gamma, power), checked finite."""
    base_lr = _finite(p, source, "base_lr")
    if base_lr < 0:
        _fail(source, "base_lr", f"must be >= 0, got {base_lr}")
    if base_lr > MAX_BASE_LR:
        _fail(source, "base_lr", f"{base_lr:g} is far too large (at most {MAX_BASE_LR:g}; typical: 0.1 to 1e-5)")
    for field in ("momentum", "momentum2"):
        value = _finite(p, source, field)
        if not 0 <= value < 1:
            _fail(source, field, f"must be in [0, 1), got {value}")
    if _finite(p, source, "weight_decay") < 0:
        _fail(source, "weight_decay", f"must be >= 0, got {p.weight_decay}")
    if _finite(p, source, "delta") <= 0:
        _fail(source, "delta", f"must be > 0, got {p.delta}")
    if not 0 <= _finite(p, source, "rms_decay") <= 1:
        _fail(source, "rms_decay", f"must be in [0, 1], got {p.rms_decay}")
    _finite(p, source, "clip_gradients")
    return _finite(p, source, "gamma"), _finite(p, source, "power")


def _check_policy(p: caffe_pb2.SolverParameter, source: str, gamma: float, power: float) -> None:
    """What the learning-rate policy needs of its fields."""
    policy = p.lr_policy
    if policy and policy not in POLICIES:  # (a missing one fails at the first step, as in BVLC)
        _fail(source, "lr_policy", f"unknown policy '{policy}' (known: {', '.join(POLICIES)})")
    if policy in ("step", "exp", "inv", "multistep", "sigmoid") and gamma < 0:
        _fail(source, "gamma", f"lr_policy '{policy}' needs gamma >= 0, got {gamma}")
    if policy in ("step", "sigmoid") and p.stepsize <= 0:
        _fail(source, "stepsize", f"lr_policy '{policy}' needs stepsize > 0, got {p.stepsize}")
    if policy == "multistep":
        values = list(p.stepvalue)
        if any(b <= a for a, b in zip(values, values[1:])) or any(v < 0 for v in values):
            _fail(source, "stepvalue", f"must be increasing and >= 0, got {values}")
    if policy == "poly" and p.max_iter <= 0:
        _fail(source, "max_iter", f"lr_policy 'poly' needs max_iter > 0, got {p.max_iter}")
    if policy == "inv" and power < 0:
        _fail(source, "power", f"lr_policy 'inv' needs power >= 0, got {power}")


class NonFiniteLossError(SolverConfigError):
    """Training produced a NaN or infinite loss."""


def first_nonfinite_layer(graph: NetGraph) -> str | None:
    """The first layer (in forward order) with a non-finite value in one of its tops."""
    for name, layer_tops in zip(graph.layer_names, graph.top_vecs):
        for blob in layer_tops:
            if not np.all(np.isfinite(blob.cpu_data())):
                return name
    return None


def nonfinite_loss_hook(solver) -> Callable[[int, float], None]:
    """An iteration hook that stops training with NonFiniteLossError (naming the iteration and
    the first layer whose output went non-finite) unless ``solver.stop_on_nonfinite_loss`` is
    False (BVLC's behaviour: carry on)."""

    def hook(iteration: int, loss: float) -> None:
        if math.isfinite(loss) or not getattr(solver, "stop_on_nonfinite_loss", True):
            return
        layer = first_nonfinite_layer(solver.graph)
        where = f"; first non-finite output: layer '{layer}'" if layer else ""
        raise NonFiniteLossError(
            f"iteration {iteration}: the loss is {loss}{where} (lower base_lr, check the data; "
            "--allow-nonfinite keeps training as BVLC does)"
        )

    return hook
