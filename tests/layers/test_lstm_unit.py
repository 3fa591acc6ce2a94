"""LSTMUnit: forward against a per-element loop of the LSTM equations, BVLC's backward formulas,
cont resets, gradient checks on CPU and GPU, shape errors, CPU-vs-GPU agreement."""

import math

import numpy as np
import pytest

from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

N, D = 3, 4
RNG = np.random.default_rng(11)
C_PREV = RNG.standard_normal((1, N, D))
GATES = RNG.standard_normal((1, N, 4 * D))
CONT = np.array([[1.0, 0.0, 1.0]])
TEXT = 'type: "LSTMUnit"'


def sig(v):
    return 1 / (1 + math.exp(-v))


def reference(c_prev, gates, cont):
    c = np.zeros((N, D))
    h = np.zeros((N, D))
    for n in range(N):
        for d in range(D):
            i = sig(gates[0, n, d])
            f = sig(gates[0, n, D + d]) * cont[0, n]
            o = sig(gates[0, n, 2 * D + d])
            g = math.tanh(gates[0, n, 3 * D + d])
            c[n, d] = f * c_prev[0, n, d] + i * g
            h[n, d] = o * math.tanh(c[n, d])
    return c[None], h[None]


def test_forward(mode):
    layer, _, top = run_layer(TEXT, [C_PREV, GATES, CONT], ntop=2, propagate=[True, True, False])
    c, h = reference(C_PREV, GATES, CONT)
    assert top[0].shape == (1, N, D) and top[1].shape == (1, N, D)
    np.testing.assert_allclose(top[0].cpu_data(), c, rtol=1e-12)
    np.testing.assert_allclose(top[1].cpu_data(), h, rtol=1e-12)
    # stream 1 starts a sequence: its cell ignores c_prev entirely
    np.testing.assert_allclose(top[0].cpu_data()[0, 1], reference(np.zeros_like(C_PREV), GATES, CONT)[0][0, 1])


def test_backward_formulas(mode):
    _, bottom, top = run_layer(TEXT, [C_PREV, GATES, CONT], ntop=2, propagate=[True, True, False])
    dc, dh = top[0].cpu_diff()[0], top[1].cpu_diff()[0]
    x = GATES[0]
    for n in range(N):
        for d in range(D):
            i, o = sig(x[n, d]), sig(x[n, 2 * D + d])
            f = CONT[0, n] * sig(x[n, D + d])
            g = math.tanh(x[n, 3 * D + d])
            tc = math.tanh(f * C_PREV[0, n, d] + i * g)
            ct = dc[n, d] + dh[n, d] * o * (1 - tc * tc)
            assert bottom[0].cpu_diff()[0, n, d] == pytest.approx(ct * f, rel=1e-10, abs=1e-14)
            got = bottom[1].cpu_diff()[0, n]
            assert got[d] == pytest.approx(ct * g * i * (1 - i), rel=1e-10, abs=1e-14)
            assert got[D + d] == pytest.approx(ct * C_PREV[0, n, d] * f * (1 - f), rel=1e-10, abs=1e-14)
            assert got[2 * D + d] == pytest.approx(dh[n, d] * tc * o * (1 - o), rel=1e-10, abs=1e-14)
            assert got[3 * D + d] == pytest.approx(ct * i * (1 - g * g), rel=1e-10, abs=1e-14)


@pytest.mark.parametrize("cont", [[[1.0, 1.0, 1.0]], [[1.0, 0.0, 1.0]]])
def test_gradient(mode, cont):
    layer = make_layer(TEXT)
    GradientChecker(1e-4, 1e-6).check(layer, blobs([C_PREV, GATES, np.array(cont)]), empty_blobs(2),
                                      check_bottom=[0, 1])


def test_errors():
    with pytest.raises(NetError, match="cont"):
        run_layer(TEXT, [C_PREV, GATES, CONT], ntop=2, propagate=[True, True, True])
    with pytest.raises(NetError, match="4 x D"):
        run_layer(TEXT, [C_PREV, GATES[:, :, :-1], CONT], ntop=2)
    with pytest.raises(NetError, match="one time step"):
        run_layer(TEXT, [np.zeros((2, N, D)), np.zeros((2, N, 4 * D)), np.zeros((2, N))], ntop=2)
    with pytest.raises(NetError, match="LSTMUnit"):
        run_layer(TEXT, [C_PREV, GATES, CONT[:, :2]], ntop=2)
    assert make_layer(TEXT).allow_force_backward(2) is False


@pytest.mark.gpu
def test_cpu_gpu_agree():
    assert_cpu_gpu_agree(TEXT, [C_PREV, GATES, CONT], ntop=2, propagate=[True, True, False])
    assert_cpu_gpu_agree(TEXT, [C_PREV, GATES, CONT], ntop=2, propagate=[False, True, False])
    assert_cpu_gpu_agree(TEXT, [C_PREV, GATES, CONT], ntop=2, propagate=[True, True, False],
                         dtype=np.float32, rtol=1e-5, atol=1e-6)
