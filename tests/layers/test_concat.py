"""Concat layer: forward against np.concatenate, gradients, shape errors, CPU/GPU agreement."""

import numpy as np
import pytest

from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def _inputs(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


CASES = [
    ("concat_param { axis: 1 }", [(2, 3, 2, 2), (2, 1, 2, 2), (2, 2, 2, 2)], 1),
    ("concat_param { axis: 0 }", [(1, 3, 2), (3, 3, 2)], 0),
    ("concat_param { axis: -1 }", [(2, 3, 1), (2, 3, 4)], 2),
    ("concat_param { concat_dim: 2 }", [(2, 2, 3, 1), (2, 2, 1, 1)], 2),
    ("", [(2, 2, 3), (2, 5, 3)], 1),  # default axis 1
]


@pytest.mark.parametrize("param,shapes,axis", CASES)
def test_forward_matches_numpy(mode, param, shapes, axis):
    arrays = _inputs(shapes)
    layer = make_layer(f'type: "Concat" {param}')
    bottom, top = blobs(arrays), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, np.concatenate(arrays, axis=axis))


@pytest.mark.parametrize("param,shapes,axis", CASES[:4])
def test_gradient(mode, param, shapes, axis):
    layer = make_layer(f'type: "Concat" {param}')
    bottom, top = blobs(_inputs(shapes, 1)), empty_blobs(1)
    GradientChecker(1e-2, 1e-3).check(layer, bottom, top)


def test_backward_splits_top_diff_and_respects_propagate_down():
    arrays = _inputs([(2, 1, 3), (2, 2, 3)])
    layer = make_layer('type: "Concat"')
    bottom, top = blobs(arrays), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    dy = np.arange(top[0].count, dtype=float).reshape(top[0].shape)
    top[0].diff[...] = dy
    bottom[1].diff[...] = 7.0
    layer.backward(top, [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, dy[:, :1])
    np.testing.assert_array_equal(bottom[1].diff, 7.0)


def test_single_bottom_shares_data_and_diff():
    layer = make_layer('type: "Concat"')
    bottom, top = blobs(_inputs([(2, 3)])), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape == (2, 3)
    assert top[0].data_memory is bottom[0].data_memory
    assert top[0].diff_memory is bottom[0].diff_memory


def test_shape_mismatch_names_layer_bottom_and_shapes():
    layer = make_layer('name: "cat" type: "Concat" concat_param { axis: 1 }')
    bottom, top = blobs(_inputs([(2, 3, 4), (2, 3, 4), (2, 1, 5)])), empty_blobs(1)
    with pytest.raises(ShapeError) as exc:
        layer.setup(bottom, top)
    msg = str(exc.value)
    assert "'cat'" in msg and "bottom 2" in msg and "(2, 1, 5)" in msg and "(2, 3, 4)" in msg


def test_num_axes_mismatch_is_an_error():
    layer = make_layer('type: "Concat"')
    bottom, top = blobs(_inputs([(2, 3, 4), (2, 3)])), empty_blobs(1)
    with pytest.raises(ShapeError, match="bottom 1"):
        layer.setup(bottom, top)


def test_axis_and_concat_dim_together_rejected():
    layer = make_layer('type: "Concat" concat_param { axis: 1 concat_dim: 1 }')
    bottom, top = blobs(_inputs([(2, 3), (2, 3)])), empty_blobs(1)
    with pytest.raises(NetError, match="not both"):
        layer.setup(bottom, top)


@pytest.mark.parametrize("param", ["concat_param { axis: 3 }", "concat_param { concat_dim: 2 }"])
def test_axis_out_of_range(param):
    layer = make_layer(f'type: "Concat" {param}')
    bottom, top = blobs(_inputs([(2, 3), (2, 3)])), empty_blobs(1)
    with pytest.raises(ShapeError):
        layer.setup(bottom, top)


def test_reshape_follows_bottom_changes():
    layer = make_layer('type: "Concat"')
    bottom, top = blobs(_inputs([(2, 3), (2, 1)])), empty_blobs(1)
    layer.setup(bottom, top)
    bottom[0].reshape(4, 2)
    bottom[1].reshape(4, 5)
    bottom[0].data[...] = 1
    bottom[1].data[...] = 2
    layer.forward(bottom, top)
    assert top[0].shape == (4, 7)
    np.testing.assert_array_equal(top[0].data[:, 2:], 2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("param,shapes,axis", CASES + [
    ("concat_param { axis: 1 }", [(3, 4, 2, 2), (3, 8, 2, 2), (3, 1, 2, 2)], 1),  # 128-bit rows, then not
    ("concat_param { axis: 1 }", [(2, 3, 5), (2, 2, 5)], 1),
])
def test_cpu_gpu_agree(param, shapes, axis, dtype):
    assert_cpu_gpu_agree(f'type: "Concat" {param}', _inputs(shapes, 3), rtol=0, atol=0, dtype=dtype)


@pytest.mark.gpu
def test_cpu_gpu_agree_partial_backward():
    assert_cpu_gpu_agree('type: "Concat"', _inputs([(2, 4, 3), (2, 4, 3), (2, 8, 3)], 5),
                         propagate=[True, False, True], rtol=0, atol=0)
