"""Reverse (CTPN's fork): forward against index loops on several axes, backward, gradient checks,
errors, CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

X = np.random.default_rng(2).standard_normal((3, 2, 4))


def text(axis):
    return f'type: "Reverse" reverse_param {{ axis: {axis} }}'


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_forward_backward(mode, axis):
    _, bottom, top = run_layer(text(axis), [X])
    want = np.empty_like(X)
    dx = np.empty_like(X)
    n = X.shape[axis]
    for idx in np.ndindex(*X.shape):
        src = list(idx)
        src[axis] = n - 1 - idx[axis]
        want[idx] = X[tuple(src)]
        dx[tuple(src)] = top[0].cpu_diff()[idx]
    np.testing.assert_array_equal(top[0].cpu_data(), want)
    np.testing.assert_array_equal(bottom[0].cpu_diff(), dx)


def test_default_axis_is_time(mode):
    _, _, top = run_layer('type: "Reverse"', [X])
    np.testing.assert_array_equal(top[0].cpu_data(), X[::-1])


def test_gradient(mode):
    GradientChecker(1e-3, 1e-8).check(make_layer(text(1)), blobs([X]), empty_blobs(1))


def test_errors():
    with pytest.raises(NetError, match=r"axis 3 must be in \[0, 3\)"):
        run_layer(text(3), [X])
    layer = make_layer(text(0))
    b = blobs([X])
    with pytest.raises(NetError, match="in place"):
        layer.setup(b, b)


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [0, 2])
def test_cpu_gpu_agree(axis):
    assert_cpu_gpu_agree(text(axis), [X])
    assert_cpu_gpu_agree(text(axis), [X], dtype=np.float32)
