"""InnerProduct layer: forward vs numpy (axis, transpose, bias), gradients, param errors, GPU."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.layer import create_layer
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, layer_param, make_layer

FILLERS = "weight_filler { type: 'gaussian' std: 1 } bias_filler { type: 'uniform' min: -1 max: 1 }"


def _layer(extra="", n=4, dtype=np.float64):
    return make_layer(
        f'type: "InnerProduct" inner_product_param {{ num_output: {n} {FILLERS} {extra} }}', dtype
    )


def _reference(x, w, b, axis, transpose):
    rows = int(np.prod(x.shape[:axis]))
    w_nk = w.T if transpose else w
    y = x.reshape(rows, -1) @ w_nk.T
    if b is not None:
        y = y + b
    return y.reshape(x.shape[:axis] + (w_nk.shape[0],))


@pytest.mark.parametrize(
    "extra,shape,axis",
    [
        ("", (2, 3, 2, 2), 1),
        ("bias_term: false", (2, 3, 2, 2), 1),
        ("axis: 2", (2, 3, 2, 2), 2),
        ("axis: -1", (2, 3, 5), 2),
        ("transpose: true", (3, 5), 1),
        ("transpose: true axis: 2 bias_term: false", (2, 2, 3, 2), 2),
        ("axis: 0", (3, 2), 0),
    ],
)
def test_forward_matches_numpy(mode, extra, shape, axis):
    caffe.set_random_seed(0)
    x = np.random.default_rng(1).standard_normal(shape)
    layer = _layer(extra)
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    transpose = "transpose: true" in extra
    k = int(np.prod(shape[axis:]))
    assert layer.blobs[0].shape == ((k, 4) if transpose else (4, k))
    has_bias = "bias_term: false" not in extra
    assert len(layer.blobs) == (2 if has_bias else 1)
    if has_bias:
        assert layer.blobs[1].shape == (4,)
    layer.forward(bottom, top)
    b = layer.blobs[1].data if has_bias else None
    expected = _reference(x, layer.blobs[0].data, b, axis, transpose)
    assert top[0].shape == expected.shape
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12, atol=1e-12)


def test_hand_checked_values():
    layer = make_layer('type: "InnerProduct" inner_product_param { num_output: 2 }')
    bottom, top = blobs([[[1.0, 2.0, 3.0]]]), empty_blobs(1)
    layer.setup(bottom, top)
    assert top[0].shape == (1, 2)
    np.testing.assert_array_equal(layer.blobs[0].data, 0)  # default filler: constant 0
    layer.blobs[0].data[...] = [[1, 0, -1], [0.5, 0.5, 0.5]]
    layer.blobs[1].data[...] = [10, 20]
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, [[8.0, 23.0]])


@pytest.mark.parametrize(
    "extra,shape",
    [("", (2, 3, 2)), ("axis: 2", (2, 2, 3)), ("transpose: true", (2, 3)),
     ("bias_term: false transpose: true axis: 2", (2, 2, 2))],
)
def test_gradient(mode, extra, shape):
    caffe.set_random_seed(2)
    layer = _layer(extra, n=3)
    bottom, top = blobs([np.random.default_rng(3).standard_normal(shape)]), empty_blobs(1)
    GradientChecker(1e-3, 1e-4).check(layer, bottom, top)


def test_param_diffs_accumulate():
    caffe.set_random_seed(0)
    layer = _layer(n=2)
    bottom, top = blobs([np.random.default_rng(0).standard_normal((3, 4))]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    once_w, once_b = layer.blobs[0].diff.copy(), layer.blobs[1].diff.copy()
    np.testing.assert_allclose(once_b, [3.0, 3.0])
    np.testing.assert_allclose(once_w, np.tile(bottom[0].data.sum(axis=0), (2, 1)))
    bottom[0].diff[...] = 0
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * once_w)
    np.testing.assert_allclose(layer.blobs[1].diff, 2 * once_b)


def test_param_propagate_down_false_skips_param_diff():
    layer = _layer(n=2)
    bottom, top = blobs([np.ones((2, 3))]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.param_propagate_down = [False, False]
    layer.forward(bottom, top)
    top[0].diff[...] = 1
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(layer.blobs[0].diff, 0)
    np.testing.assert_array_equal(layer.blobs[1].diff, 0)
    np.testing.assert_allclose(bottom[0].diff, np.ones((2, 2)) @ layer.blobs[0].data)


def test_missing_num_output():
    with pytest.raises(NetError, match="num_output"):
        make_layer('type: "InnerProduct"').setup(blobs([np.ones((2, 3))]), empty_blobs(1))


def _with_blobs(shapes, extra=""):
    param = layer_param(f'name: "ip" type: "InnerProduct" inner_product_param {{ num_output: 2 {extra} }}')
    for s in shapes:
        bp = param.blobs.add()
        bp.shape.dim.extend(s)
        bp.data.extend([0.5] * int(np.prod(s)))
    return create_layer(param, np.float64)


def test_embedded_param_blobs_are_used_and_checked():
    layer = _with_blobs([(2, 3), (2,)])
    bottom, top = blobs([np.ones((1, 3))]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, [[2.0, 2.0]])
    with pytest.raises(NetError, match=r"param blob 0 has shape \(3, 2\), expected \(2, 3\)"):
        _with_blobs([(3, 2), (2,)]).setup(blobs([np.ones((1, 3))]), empty_blobs(1))
    with pytest.raises(NetError, match=r"'ip'.*param blob 1"):
        _with_blobs([(2, 3), (3,)]).setup(blobs([np.ones((1, 3))]), empty_blobs(1))
    with pytest.raises(NetError, match="1 param blobs, expected 2"):
        _with_blobs([(2, 3)]).setup(blobs([np.ones((1, 3))]), empty_blobs(1))
    # transpose: true expects (K, N)
    _with_blobs([(3, 2)], "transpose: true bias_term: false").setup(blobs([np.ones((1, 3))]), empty_blobs(1))


def test_k_mismatch_on_reshape():
    layer = _layer(n=2)
    bottom, top = blobs([np.ones((2, 3, 2))]), empty_blobs(1)
    layer.setup(bottom, top)
    bottom[0].reshape(2, 4, 2)
    with pytest.raises(NetError, match=r"'innerproduct'.*\(2, 4, 2\).*8.*6") as exc:
        layer.forward(bottom, top)
    assert "incompatible" in str(exc.value)
    bottom[0].reshape(5, 6)  # same K, new batch size: fine
    layer.forward(bottom, top)
    assert top[0].shape == (5, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "extra,shape",
    [("", (4, 3, 2, 2)), ("axis: 2", (2, 3, 5)), ("transpose: true", (3, 7)),
     ("transpose: true bias_term: false axis: 2", (2, 3, 2, 3))],
)
def test_cpu_gpu_agree(dtype, extra, shape):
    x = np.random.default_rng(6).standard_normal(shape)
    results = []
    for dev in ("cpu", "gpu"):
        caffe.set_mode_gpu() if dev == "gpu" else caffe.set_mode_cpu()
        try:
            caffe.set_random_seed(7)
            layer = _layer(extra, n=5, dtype=dtype)
            bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
            layer.setup(bottom, top)
            layer.forward(bottom, top)
            top[0].diff[...] = np.random.default_rng(8).standard_normal(top[0].shape)
            layer.backward(top, [True], bottom)
            results.append([top[0].data.copy(), bottom[0].diff.copy()] + [p.diff.copy() for p in layer.blobs])
        finally:
            caffe.set_mode_cpu()
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for c, g in zip(*results):
        np.testing.assert_allclose(c, g, rtol=tol, atol=tol)
