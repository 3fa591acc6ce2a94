"""Permute (SSD fork): axis orders against numpy, gradient, identity, errors, CPU vs GPU."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

X = np.random.default_rng(3).standard_normal((2, 3, 4, 5))


def _ref(x, order):
    """Naive loop: top[c0, c1, ...] = x[index with axis order[k] at c_k]."""
    out = np.empty(tuple(x.shape[o] for o in order))
    for idx in np.ndindex(*out.shape):
        src = [0] * x.ndim
        for k, o in enumerate(order):
            src[o] = idx[k]
        out[idx] = x[tuple(src)]
    return out


@pytest.mark.parametrize("orders,full", [
    ([0, 2, 3, 1], [0, 2, 3, 1]),    # SSD's NCHW -> NHWC
    ([1, 0], [1, 0, 2, 3]),          # missing axes follow in order
    ([3], [3, 0, 1, 2]),
    ([], [0, 1, 2, 3]),              # identity: a copy
])
def test_forward_backward(mode, orders, full):
    text = 'type: "Permute" permute_param { ' + " ".join(f"order: {o}" for o in orders) + " }"
    layer, bottom, top = run_layer(text, [X])
    np.testing.assert_array_equal(top[0].cpu_data(), _ref(X, full))
    dy = top[0].cpu_diff()
    expect = np.zeros_like(X)
    for idx in np.ndindex(*dy.shape):  # scatter back: each bottom element gets its one top element
        src = [0] * 4
        for k, o in enumerate(full):
            src[o] = idx[k]
        expect[tuple(src)] = dy[idx]
    np.testing.assert_array_equal(bottom[0].cpu_diff(), expect)


def test_gradient(mode):
    layer = make_layer('type: "Permute" permute_param { order: 0 order: 2 order: 3 order: 1 }')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([X[:, :, :2, :3]]), empty_blobs(1), check_bottom=[0])


def test_errors():
    with pytest.raises(caffe.NetError, match="order 4 is not an axis"):
        run_layer('type: "Permute" permute_param { order: 4 }', [X])
    with pytest.raises(caffe.NetError, match="appears twice"):
        run_layer('type: "Permute" permute_param { order: 1 order: 1 }', [X])
    b = blobs([X])
    with pytest.raises(caffe.NetError, match="in place"):
        make_layer('type: "Permute" permute_param { order: 1 order: 0 }').setup(b, b)


@pytest.mark.gpu
@pytest.mark.parametrize("orders", ["order: 0 order: 2 order: 3 order: 1", "order: 3 order: 2", ""])
def test_cpu_gpu_agree(orders):
    assert_cpu_gpu_agree(f'type: "Permute" permute_param {{ {orders} }}', [X])
