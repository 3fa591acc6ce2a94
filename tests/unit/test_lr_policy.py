"""Learning-rate policies against Caffe's formulas, written out independently here."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.solvers.lr_policy import SolverConfigError, learning_rate


def sp(text: str) -> caffe_pb2.SolverParameter:
    return parse_text(text, caffe_pb2.SolverParameter())


def rates(param, iters):
    step = 0
    out = []
    for it in iters:
        r, step = learning_rate(param, it, step)
        out.append(r)
    return out


def test_fixed():
    p = sp('lr_policy: "fixed" base_lr: 0.05 gamma: 0.5')
    assert rates(p, [0, 1, 1000]) == pytest.approx([0.05] * 3, rel=1e-7)


def test_step():
    p = sp('lr_policy: "step" base_lr: 0.1 gamma: 0.5 stepsize: 3')
    got = rates(p, range(10))
    want = [0.1 * 0.5 ** (it // 3) for it in range(10)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert learning_rate(p, 7, 0)[1] == 2  # current_step tracks floor(it / stepsize)


def test_exp():
    p = sp('lr_policy: "exp" base_lr: 0.2 gamma: 0.9')
    np.testing.assert_allclose(rates(p, [0, 1, 5, 20]), [0.2 * 0.9**i for i in (0, 1, 5, 20)], rtol=1e-6)


def test_inv_lenet_value():
    """lenet_solver: base_lr 0.01, gamma 1e-4, power 0.75 -> Caffe logs lr = 0.00992565 at 100."""
    p = sp('lr_policy: "inv" base_lr: 0.01 gamma: 0.0001 power: 0.75')
    for it in (0, 100, 5000, 10000):
        want = 0.01 * (1 + 0.0001 * it) ** -0.75
        assert learning_rate(p, it)[0] == pytest.approx(want, rel=1e-6)
    assert f"{learning_rate(p, 100)[0]:g}" == "0.00992565"


def test_multistep_advances_once_per_stepvalue():
    p = sp('lr_policy: "multistep" base_lr: 1 gamma: 0.1 stepvalue: 2 stepvalue: 5 stepvalue: 6')
    got = rates(p, range(9))
    k = [0, 0, 1, 1, 1, 2, 3, 3, 3]
    np.testing.assert_allclose(got, [0.1**j for j in k], rtol=1e-6)


def test_multistep_keeps_counter_from_caller():
    p = sp('lr_policy: "multistep" base_lr: 1 gamma: 0.5 stepvalue: 10 stepvalue: 20')
    # restored solver at iter 25 with current_step 2 (as saved in a solverstate)
    assert learning_rate(p, 25, 2) == (pytest.approx(0.25), 2)
    # Caffe's counter moves by at most one per query
    assert learning_rate(p, 25, 0)[1] == 1


def test_poly():
    p = sp('lr_policy: "poly" base_lr: 0.3 power: 2 max_iter: 10')
    np.testing.assert_allclose(rates(p, [0, 3, 10]), [0.3, 0.3 * 0.7**2, 0.0], rtol=1e-6, atol=1e-12)
    assert math.isnan(learning_rate(sp('lr_policy: "poly" base_lr: 1 power: 0.5 max_iter: 10'), 20)[0])


def test_sigmoid():
    p = sp('lr_policy: "sigmoid" base_lr: 0.5 gamma: 0.2 stepsize: 10')
    for it in (0, 10, 17):
        want = 0.5 / (1 + math.exp(-0.2 * (it - 10)))
        assert learning_rate(p, it)[0] == pytest.approx(want, rel=1e-6)
    assert learning_rate(p, 10)[0] == pytest.approx(0.25, rel=1e-6)
    steep = sp('lr_policy: "sigmoid" base_lr: 0.5 gamma: 100 stepsize: 100')
    assert learning_rate(steep, 0)[0] == 0.0


@pytest.mark.parametrize(
    "text, match",
    [
        ('lr_policy: "step" base_lr: 1 gamma: 0.5', "stepsize"),
        ('lr_policy: "exp" base_lr: 1 gamma: -1', "gamma"),
        ('lr_policy: "sigmoid" base_lr: 1 gamma: 1', "stepsize"),
        ('lr_policy: "poly" base_lr: 1 power: 1', "max_iter"),
        ('lr_policy: "cosine" base_lr: 1', "unknown lr_policy 'cosine'"),
        ("base_lr: 1", "no lr_policy"),
    ],
)
def test_bad_policies(text, match):
    with pytest.raises(SolverConfigError, match=match):
        learning_rate(sp(text), 5)


def test_solver_logs_policy_rate(caplog):
    """The solver queries the policy every iteration and logs 'Iteration N, lr = X' on display."""
    from pycaffe_lite.solvers.sgd_solvers import SGDSolver

    net = """
      name: "lin"
      layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
      layer { name: "ip" type: "InnerProduct" bottom: "data" top: "out" loss_weight: 1
              inner_product_param { num_output: 1 } }
    """
    param = sp(f'net_param {{ {net} }} base_lr: 0.01 lr_policy: "multistep" gamma: 0.1 '
               'stepvalue: 2 stepvalue: 3 display: 1 max_iter: 4')
    solver = SGDSolver(param, dtype=np.float64, progress=False)
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        solver.step(4)
    lines = [r.getMessage() for r in caplog.records if ", lr = " in r.getMessage()]
    assert lines == ["Iteration 0, lr = 0.01", "Iteration 1, lr = 0.01", "Iteration 2, lr = 0.001",
                     "Iteration 3, lr = 0.0001"]
    assert solver.current_step == 2
