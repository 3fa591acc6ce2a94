"""Transpose (CTPN's and the OCR forks'): forward against index loops, the inverse permutation in
backward, gradient checks, errors, CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

X = np.random.default_rng(4).standard_normal((2, 3, 4, 5))


def text(dims):
    return 'type: "Transpose" transpose_param { ' + " ".join(f"dim: {d}" for d in dims) + " }"


@pytest.mark.parametrize("dims", [(3, 0, 2, 1), (0, 1, 2, 3), (2, 3, 0, 1)])
def test_forward_backward(mode, dims):
    _, bottom, top = run_layer(text(dims), [X])
    assert top[0].shape == tuple(X.shape[d] for d in dims)
    dx = np.empty_like(X)
    for idx in np.ndindex(*top[0].shape):
        src = [0] * 4
        for i, d in enumerate(dims):  # top axis i is bottom axis d
            src[d] = idx[i]
        assert top[0].cpu_data()[idx] == X[tuple(src)]
        dx[tuple(src)] = top[0].cpu_diff()[idx]
    np.testing.assert_array_equal(bottom[0].cpu_diff(), dx)


def test_gradient(mode):
    GradientChecker(1e-3, 1e-8).check(make_layer(text((1, 2, 0))), blobs([X[0]]), empty_blobs(1))


def test_errors():
    with pytest.raises(NetError, match="permutation"):
        make_layer(text((0, 0, 1, 2))).setup(blobs([X]), empty_blobs(1))
    with pytest.raises(NetError, match="one per axis"):
        run_layer(text((1, 0)), [X])
    layer = make_layer(text((1, 0)))
    b = blobs([X[0, 0]])
    with pytest.raises(NetError, match="in place"):
        layer.setup(b, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [(3, 0, 2, 1), (2, 3, 0, 1)])
def test_cpu_gpu_agree(dims):
    assert_cpu_gpu_agree(text(dims), [X])
    assert_cpu_gpu_agree(text(dims), [X], dtype=np.float32)
