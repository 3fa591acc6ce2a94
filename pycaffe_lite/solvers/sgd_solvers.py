"""pycaffe's solver classes (``caffe.SGDSolver`` & co.): a :class:`~.solver.Solver` per update
rule of :mod:`.rules`, and the registry that maps a ``SolverParameter.type`` to its class."""

from __future__ import annotations

import os

from ..schema import caffe_pb2
from . import rules
from .lr_policy import SolverConfigError
from .solver import Solver, load_solver_param


class SGDSolver(Solver):
    """Stochastic gradient descent with momentum (``type: "SGD"``)."""

    type_name, rule = "SGD", rules.SGD

    @property
    def lr(self) -> float:
        """pycaffe's ``SGDSolver.lr`` (BVLC's GetLearningRate): the policy's rate at the current iteration."""
        return self.learning_rate


class NesterovSolver(Solver):
    """Nesterov's accelerated gradient (``type: "Nesterov"``)."""

    type_name, rule = "Nesterov", rules.Nesterov


class AdaGradSolver(Solver):
    """AdaGrad (``type: "AdaGrad"``); ``momentum`` must be 0."""

    type_name, rule = "AdaGrad", rules.AdaGrad


class RMSPropSolver(Solver):
    """RMSProp (``type: "RMSProp"``, ``rms_decay``); ``momentum`` must be 0."""

    type_name, rule = "RMSProp", rules.RMSProp


class AdaDeltaSolver(Solver):
    """AdaDelta (``type: "AdaDelta"``; ``momentum`` is the decay, ``delta`` the epsilon)."""

    type_name, rule = "AdaDelta", rules.AdaDelta


class AdamSolver(Solver):
    """Adam (``type: "Adam"``; β1 = ``momentum``, β2 = ``momentum2``, ε = ``delta``)."""

    type_name, rule = "Adam", rules.Adam


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
