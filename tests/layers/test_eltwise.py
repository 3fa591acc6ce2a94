"""Eltwise layer: PROD / SUM (coeff) / MAX forward vs numpy, gradients, errors, CPU/GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer

SHAPE = (2, 3, 2, 2)


def _inputs(n, seed=0, shape=SHAPE):
    rng = np.random.default_rng(seed)
    # Keep values away from 0 so PROD's top/bottom gradient is well conditioned.
    return [rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape) for _ in range(n)]


def _run(param, arrays, dtype=np.float64):
    layer = make_layer(f'type: "Eltwise" eltwise_param {{ {param} }}', dtype)
    bottom, top = blobs(arrays, dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


def test_sum_default(mode):
    arrays = _inputs(3)
    _, _, top = _run("operation: SUM", arrays)
    np.testing.assert_allclose(top[0].data, arrays[0] + arrays[1] + arrays[2])


def test_sum_with_coeff(mode):
    arrays = _inputs(3)
    _, _, top = _run("operation: SUM coeff: 1 coeff: -0.5 coeff: 2", arrays)
    np.testing.assert_allclose(top[0].data, arrays[0] - 0.5 * arrays[1] + 2 * arrays[2])


def test_prod(mode):
    arrays = _inputs(3)
    _, _, top = _run("operation: PROD", arrays)
    np.testing.assert_allclose(top[0].data, arrays[0] * arrays[1] * arrays[2])


def test_max_and_mask(mode):
    arrays = _inputs(3)
    layer, _, top = _run("operation: MAX", arrays)
    stacked = np.stack(arrays)
    np.testing.assert_array_equal(top[0].data, stacked.max(axis=0))
    np.testing.assert_array_equal(layer.mask.cpu_data(), stacked.argmax(axis=0))


def test_max_ties_follow_caffe():
    # bottoms 0 and 1 tie -> 1 wins; a later bottom tying with the max does not take over
    a = np.array([1.0, 2.0, 0.0])
    b = np.array([1.0, 1.0, 3.0])
    c = np.array([1.0, 2.0, 3.0])
    layer, bottom, top = _run("operation: MAX", [a, b, c])
    np.testing.assert_array_equal(layer.mask.cpu_data(), [1, 0, 1])
    top[0].diff[...] = [10.0, 20.0, 30.0]
    layer.backward(top, [True, True, True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, [0, 20, 0])
    np.testing.assert_array_equal(bottom[1].diff, [10, 0, 30])
    np.testing.assert_array_equal(bottom[2].diff, [0, 0, 0])


@pytest.mark.parametrize(
    "param",
    ["operation: SUM", "operation: SUM coeff: 0.5 coeff: -2 coeff: 3", "operation: PROD",
     "operation: PROD stable_prod_grad: false", "operation: MAX"],
)
def test_gradient(mode, param):
    layer = make_layer(f'type: "Eltwise" eltwise_param {{ {param} }}')
    bottom, top = blobs(_inputs(3, 5, (2, 3, 2))), empty_blobs(1)
    GradientChecker(1e-3, 1e-4).check(layer, bottom, top)


def test_two_bottoms_gradient(mode):
    layer = make_layer('type: "Eltwise" eltwise_param { operation: PROD }')
    bottom, top = blobs(_inputs(2, 6, (3, 4))), empty_blobs(1)
    GradientChecker(1e-3, 1e-4).check(layer, bottom, top)


def test_stable_prod_grad_recomputes_from_other_bottoms():
    # With a zero in bottom 0 the top/bottom formula yields nan; the stable form multiplies the others.
    a = np.array([0.0, 2.0])
    b = np.array([3.0, 4.0])
    layer, bottom, top = _run("operation: PROD", [a, b])
    top[0].diff[...] = [1.0, 1.0]
    layer.backward(top, [True, True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, [3.0, 4.0])
    np.testing.assert_array_equal(bottom[1].diff, [0.0, 2.0])
    layer, bottom, top = _run("operation: PROD stable_prod_grad: false", [a, b])
    top[0].diff[...] = [1.0, 1.0]
    with np.errstate(invalid="ignore", divide="ignore"):
        layer.backward(top, [True, True], bottom)
    assert np.isnan(bottom[0].diff[0])
    assert bottom[0].diff[1] == 4.0


def test_propagate_down_false_leaves_diff():
    layer, bottom, top = _run("operation: SUM", _inputs(2))
    top[0].diff[...] = 1.0
    bottom[0].diff[...] = -3.0
    layer.backward(top, [False, True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, -3.0)
    np.testing.assert_array_equal(bottom[1].diff, 1.0)


def test_shape_mismatch_error():
    layer = make_layer('name: "elt" type: "Eltwise"')
    bottom, top = blobs([np.zeros((2, 3)), np.zeros((3, 2))]), empty_blobs(1)
    with pytest.raises(ShapeError) as exc:
        layer.setup(bottom, top)
    msg = str(exc.value)
    assert "'elt'" in msg and "bottom 1" in msg and "(3, 2)" in msg and "(2, 3)" in msg


def test_coeff_count_and_op_errors():
    bottom = blobs(_inputs(2))
    with pytest.raises(NetError, match="coeff"):
        make_layer('type: "Eltwise" eltwise_param { coeff: 1 }').setup(bottom, empty_blobs(1))
    with pytest.raises(NetError, match="SUM"):
        make_layer('type: "Eltwise" eltwise_param { operation: PROD coeff: 1 coeff: 2 }').setup(
            bottom, empty_blobs(1)
        )
    with pytest.raises(NetError, match="at least 2"):
        make_layer('type: "Eltwise"').setup(bottom[:1], empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "param",
    ["operation: SUM", "operation: SUM coeff: 0.5 coeff: -2 coeff: 3", "operation: PROD",
     "operation: PROD stable_prod_grad: false", "operation: MAX"],
)
@pytest.mark.parametrize("shape", [SHAPE, (2, 3, 5, 7)])  # 128-bit passes, then scalar ones
def test_cpu_gpu_agree(param, dtype, shape):
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert_cpu_gpu_agree(f'type: "Eltwise" eltwise_param {{ {param} }}', _inputs(3, 7, shape), rtol=tol, atol=tol,
                         dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2, 5, 9])  # one, two and three weighted_sum passes
def test_cpu_gpu_agree_sum_many(n):
    coeffs = " ".join(f"coeff: {0.5 * i - 1}" for i in range(n))
    assert_cpu_gpu_agree(f'type: "Eltwise" eltwise_param {{ operation: SUM {coeffs} }}', _inputs(n, 2, (3, 8, 4)))
