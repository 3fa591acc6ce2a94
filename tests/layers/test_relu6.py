"""ReLU6: forward vs numpy, mask at both ends, in place, gradient, CPU/GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer


def _x(shape=(2, 3, 4), seed=0):
    x = np.random.default_rng(seed).uniform(-3, 9, shape)
    for k in (0.0, 6.0):  # keep away from the kinks for gradient checks
        x[np.abs(x - k) < 0.1] = k + 0.5
    return x


def test_forward_backward(mode):
    x = _x()
    layer, bottom, top = run_layer('type: "ReLU6"', [x])
    expected = [min(max(v, 0.0), 6.0) for v in x.ravel()]
    np.testing.assert_array_equal(top[0].cpu_data().ravel(), expected)
    dy = top[0].cpu_diff()
    inside = (x > 0) & (x < 6)
    np.testing.assert_array_equal(bottom[0].cpu_diff(), np.where(inside, dy, 0.0))


def test_edges():
    layer, bottom, top = run_layer('type: "ReLU6"', [np.array([-1.0, 0.0, 3.0, 6.0, 7.0])])
    np.testing.assert_array_equal(top[0].cpu_data(), [0, 0, 3, 6, 6])
    dy = top[0].cpu_diff()
    np.testing.assert_array_equal(bottom[0].cpu_diff(), [0, 0, dy[2], 0, 0])


def test_in_place(mode):
    x = _x()
    layer = make_layer('type: "ReLU6"')
    (blob,) = blobs([x])
    layer.setup([blob], [blob])
    layer.forward([blob], [blob])
    np.testing.assert_array_equal(blob.cpu_data(), np.clip(x, 0, 6))
    blob.mutable_cpu_diff()[...] = 2.0
    layer.backward([blob], [True], [blob])
    np.testing.assert_array_equal(blob.cpu_diff(), np.where((x > 0) & (x < 6), 2.0, 0.0))


def test_gradient(mode):
    layer = make_layer('type: "ReLU6"')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([_x((2, 3, 2), 1)]), empty_blobs(1))


@pytest.mark.gpu
def test_cpu_gpu_agree():
    assert_cpu_gpu_agree('type: "ReLU6"', [_x((3, 5, 7), 2)])
    assert_cpu_gpu_agree('type: "ReLU6"', [_x((3, 5, 7), 2)], dtype=np.float32, rtol=0, atol=0)
