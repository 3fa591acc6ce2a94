"""Reduction: SUM / ASUM / SUMSQ / MEAN over the axes from axis, coeff, gradients."""

import numpy as np
import pytest

from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(8)
X = RNG.standard_normal((2, 3, 4))
OPS = {
    "SUM": lambda r: r.sum(-1),
    "ASUM": lambda r: np.abs(r).sum(-1),
    "SUMSQ": lambda r: (r * r).sum(-1),
    "MEAN": lambda r: r.mean(-1),
}
GRADS = {
    "SUM": lambda r: np.ones_like(r),
    "ASUM": np.sign,
    "SUMSQ": lambda r: 2 * r,
    "MEAN": lambda r: np.full_like(r, 1.0 / r.shape[-1]),
}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_forward_backward(mode, op, axis):
    coeff = -1.5
    text = f'type: "Reduction" reduction_param {{ operation: {op} axis: {axis} coeff: {coeff} }}'
    _, bottom, top = run_layer(text, [X])
    ax = axis % X.ndim
    rows = X.reshape(int(np.prod(X.shape[:ax])), -1)
    assert top[0].shape == X.shape[:ax]
    np.testing.assert_allclose(top[0].cpu_data().ravel(), coeff * OPS[op](rows), rtol=1e-12)
    dy = top[0].cpu_diff().reshape(-1, 1)
    np.testing.assert_allclose(bottom[0].cpu_diff().reshape(rows.shape), coeff * dy * GRADS[op](rows), rtol=1e-12)


def test_default_is_sum_of_everything():
    _, _, top = run_layer('type: "Reduction"', [X])
    assert top[0].shape == ()
    np.testing.assert_allclose(top[0].cpu_data(), X.sum())


@pytest.mark.parametrize("op", list(OPS))
def test_gradient(mode, op):
    layer = make_layer(f'type: "Reduction" reduction_param {{ operation: {op} axis: 1 coeff: 2 }}')
    kw = {"kink": 0.0, "kink_range": 1e-2} if op == "ASUM" else {}
    GradientChecker(1e-3, 1e-5, **kw).check(layer, blobs([X]), empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(OPS))
def test_cpu_gpu_agree(op):
    assert_cpu_gpu_agree(f'type: "Reduction" reduction_param {{ operation: {op} axis: 1 coeff: 0.5 }}', [X])
    assert_cpu_gpu_agree(f'type: "Reduction" reduction_param {{ operation: {op} }}', [X])
