"""Reduction: SUM / ASUM / SUMSQ / MEAN over the axes from axis, coeff, gradients."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.gradient_check import GradientChecker
from pycaffe_lite.testing import blobs, empty_blobs, make_layer


def run_layer(text, arrays, ntop=1, propagate=None, seed=5, dtype=np.float64):
    """Set up, forward, then backward with fixed random top diffs; returns (layer, bottom, top)."""
    caffe.set_random_seed(seed)
    layer = make_layer(text, dtype)
    bottom, top = blobs(arrays, dtype), empty_blobs(ntop, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    rng = np.random.default_rng(seed)
    for t in top:
        t.mutable_cpu_diff()[...] = rng.standard_normal(t.shape)
    for p in layer.blobs:
        p.mutable_cpu_diff()[...] = 0.25  # param diffs accumulate onto this
    layer.backward(top, propagate if propagate is not None else [True] * len(bottom), bottom)
    return layer, bottom, top


def assert_cpu_gpu_agree(text, arrays, ntop=1, propagate=None, rtol=1e-9, atol=1e-11, dtype=np.float64):
    """Same layer and inputs on both devices: tops, bottom diffs, param data and diffs agree."""
    results = []
    for gpu in (False, True):
        caffe.set_mode_gpu() if gpu else caffe.set_mode_cpu()
        try:
            layer, bottom, top = run_layer(text, arrays, ntop, propagate, dtype=dtype)
            prop = propagate if propagate is not None else [True] * len(bottom)
            out = [t.cpu_data().copy() for t in top]
            out += [b.cpu_diff().copy() for b, p in zip(bottom, prop) if p]
            out += [p.cpu_data().copy() for p in layer.blobs] + [p.cpu_diff().copy() for p in layer.blobs]
            results.append(out)
        finally:
            caffe.set_mode_cpu()
    assert len(results[0]) == len(results[1])
    for i, (a, b) in enumerate(zip(*results)):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol, err_msg=f"array {i}")


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
