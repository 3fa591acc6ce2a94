"""Split layer: tops share the bottom's data; backward sums the top diffs."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def _setup(n_top, shape=(2, 3, 2), dtype=np.float64):
    x = np.random.default_rng(0).standard_normal(shape)
    layer = make_layer('type: "Split"', dtype)
    bottom, top = blobs([x], dtype), empty_blobs(n_top, dtype)
    layer.setup(bottom, top)
    return x, layer, bottom, top


@pytest.mark.parametrize("n_top", [1, 2, 3])
def test_forward_shares_data(mode, n_top):
    x, layer, bottom, top = _setup(n_top)
    layer.forward(bottom, top)
    for t in top:
        assert t.shape == x.shape
        assert t.data_memory is bottom[0].data_memory
        assert t.diff_memory is not bottom[0].diff_memory
        np.testing.assert_array_equal(t.data, x)


@pytest.mark.parametrize("n_top", [1, 2, 4])
def test_backward_sums_diffs(mode, n_top):
    _, layer, bottom, top = _setup(n_top)
    layer.forward(bottom, top)
    rng = np.random.default_rng(1)
    diffs = [rng.standard_normal(t.shape) for t in top]
    for t, d in zip(top, diffs):
        t.diff[...] = d
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, np.sum(diffs, axis=0), rtol=1e-12)


def test_gradient(mode):
    layer = make_layer('type: "Split"')
    bottom, top = blobs([np.random.default_rng(2).standard_normal((2, 3))]), empty_blobs(3)
    GradientChecker().check(layer, bottom, top)


def test_propagate_down_false_leaves_bottom_diff():
    _, layer, bottom, top = _setup(2)
    bottom[0].diff[...] = 5.0
    for t in top:
        t.diff[...] = 1.0
    layer.backward(top, [False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 5.0)


def test_in_place_rejected():
    layer = make_layer('type: "Split"')
    b = blobs([np.zeros(3)])
    with pytest.raises(NetError, match="in place"):
        layer.setup(b, b + empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_top", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(2, 3, 2), (2, 4, 8)])
def test_cpu_gpu_agree(n_top, dtype, shape):
    x = np.random.default_rng(0).standard_normal(shape)
    tol = 1e-6 if dtype == np.float32 else 1e-12
    assert_cpu_gpu_agree('type: "Split"', [x], ntop=n_top, rtol=tol, atol=tol, dtype=dtype)
