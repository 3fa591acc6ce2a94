"""BatchReindex (BVLC's): gather by index with repeats, summed diffs, gradient checks, errors,
CPU-vs-GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

X = np.random.default_rng(3).standard_normal((4, 2, 3))
IDX = np.array([2.0, 0.0, 2.0, 3.0, 2.0])  # item 1 never picked, item 2 three times
TEXT = 'type: "BatchReindex"'


def test_forward_backward(mode):
    _, bottom, top = run_layer(TEXT, [X, IDX], propagate=[True, False])
    assert top[0].shape == (5, 2, 3)
    dx = np.zeros_like(X)
    for j, n in enumerate(IDX.astype(int)):
        np.testing.assert_array_equal(top[0].cpu_data()[j], X[n])
        dx[n] += top[0].cpu_diff()[j]
    np.testing.assert_allclose(bottom[0].cpu_diff(), dx, rtol=1e-14)
    assert not bottom[0].cpu_diff()[1].any()


def test_gradient(mode):
    GradientChecker(1e-3, 1e-8).check(make_layer(TEXT), blobs([X, IDX]), empty_blobs(1), check_bottom=[0])


def test_errors():
    with pytest.raises(NetError, match="outside the batch of 4"):
        run_layer(TEXT, [X, np.array([0.0, 4.0])], propagate=[True, False])
    with pytest.raises(NetError, match="outside"):
        run_layer(TEXT, [X, np.array([-1.0])], propagate=[True, False])
    with pytest.raises(NetError, match="indices"):
        run_layer(TEXT, [X, IDX], propagate=[True, True])
    with pytest.raises(NetError, match="1 axis"):
        run_layer(TEXT, [X, IDX.reshape(5, 1)], propagate=[True, False])
    assert make_layer(TEXT).allow_force_backward(1) is False


@pytest.mark.gpu
def test_cpu_gpu_agree():
    assert_cpu_gpu_agree(TEXT, [X, IDX], propagate=[True, False])
    assert_cpu_gpu_agree(TEXT, [X, IDX], propagate=[True, False], dtype=np.float32)
