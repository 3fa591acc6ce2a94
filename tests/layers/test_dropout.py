"""Dropout: TRAIN masks (rate, scaling, repeatability under a seed), TEST identity, backward with
the forward's mask, in place, gradients; GPU: device-drawn masks (statistics, seed repeatability,
independence), TEST identity."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import common
from pycaffe_lite.errors import NetError
from pycaffe_lite.gradient_check import GradientChecker
from pycaffe_lite.layer_testing import blobs, empty_blobs, make_layer


def forward(text, x, dtype=np.float64, seed=None):
    layer = make_layer(f"type: 'Dropout' {text}", dtype)
    bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    if seed is not None:
        common.set_random_seed(seed)
    layer.forward(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("ratio", [0.5, 0.2, 0.8])
def test_train_rate_and_scale(mode, ratio):
    x = np.random.default_rng(0).uniform(1, 2, (200, 500))  # nonzero everywhere
    _, _, top = forward(f"dropout_param {{ dropout_ratio: {ratio} }}", x, seed=1)
    y = top[0].data
    kept = y != 0
    ratio32 = float(np.float32(ratio))  # dropout_ratio is a float field
    assert abs(1 - kept.mean() - ratio32) < 0.01
    np.testing.assert_allclose(y[kept], x[kept] / (1 - ratio32), rtol=1e-6)
    assert abs(y.mean() / x.mean() - 1) < 0.03  # unbiased in expectation


def test_same_seed_same_mask_new_draw_otherwise(mode):
    x = np.ones((50, 40))
    layer, bottom, top = forward("", x, seed=7)
    first = top[0].data.copy()
    layer.forward(bottom, top)
    assert not np.array_equal(first, top[0].data)  # a new mask each forward
    common.set_random_seed(7)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(first, top[0].data)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_test_phase_is_identity(mode, dtype):
    x = np.random.default_rng(1).standard_normal((3, 4, 5))
    layer, bottom, top = forward("phase: TEST dropout_param { dropout_ratio: 0.7 }", x, dtype)
    np.testing.assert_array_equal(top[0].data, x.astype(dtype))
    top[0].diff[...] = 2 * x
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, (2 * x).astype(dtype))


def test_backward_uses_forward_mask(mode):
    rng = np.random.default_rng(2)
    x, dy = rng.uniform(1, 2, (6, 7)), rng.standard_normal((6, 7))
    layer, bottom, top = forward("dropout_param { dropout_ratio: 0.4 }", x, seed=3)
    kept = top[0].data != 0
    assert 0 < kept.sum() < kept.size
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    scale = 1 / (1 - float(np.float32(0.4)))
    np.testing.assert_allclose(bottom[0].diff, np.where(kept, dy * scale, 0), rtol=1e-12)


def test_in_place(mode):
    x = np.random.default_rng(3).uniform(1, 2, (8, 9))
    layer, (b,) = make_layer("type: 'Dropout'"), blobs([x])
    layer.setup([b], [b])
    common.set_random_seed(5)
    layer.forward([b], [b])
    kept = b.data != 0
    np.testing.assert_allclose(b.data[kept], 2 * x[kept])
    b.diff[...] = 1.0
    layer.backward([b], [True], [b])
    np.testing.assert_allclose(b.diff, np.where(kept, 2.0, 0.0))


def test_scale_train_false_scales_at_test_instead():
    """The non-BVLC ``scale_train: false`` behaviour (set on the layer: BVLC's proto lacks the field)."""
    x = np.random.default_rng(4).uniform(1, 2, (20, 30))
    for phase, check in (("TRAIN", "train"), ("TEST", "test")):
        layer = make_layer(f"type: 'Dropout' phase: {phase} dropout_param {{ dropout_ratio: 0.25 }}")
        bottom, top = blobs([x]), empty_blobs(1)
        layer.setup(bottom, top)
        layer.scale_train = False
        layer.forward(bottom, top)
        y = top[0].data
        if check == "train":
            np.testing.assert_array_equal(y[y != 0], x[y != 0])
        else:
            np.testing.assert_allclose(y, x * 0.75)


@pytest.mark.parametrize("ratio", [1.0, -0.1])
def test_bad_ratio_is_clear(ratio):
    with pytest.raises(NetError, match="dropout_ratio"):
        forward(f"dropout_param {{ dropout_ratio: {ratio} }}", np.ones(3))


def test_gradient(mode):
    x = np.random.default_rng(5).standard_normal((3, 4, 2))
    layer = make_layer("type: 'Dropout' dropout_param { dropout_ratio: 0.3 }")
    GradientChecker(1e-3, 1e-4).check(layer, blobs([x]), empty_blobs(1))


# -- GPU: masks come from the device generator, so compare statistics, not bits ----------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ratio", [0.5, 0.1, 0.9])
def test_gpu_mask_statistics(gpu_mode, dtype, ratio):
    x = np.ones((1000, 1000))
    layer, bottom, top = forward(f"dropout_param {{ dropout_ratio: {ratio} }}", x, dtype, seed=11)
    y = top[0].data.astype(np.float64)
    kept = y != 0
    ratio32 = float(np.float32(ratio))
    assert abs(1 - kept.mean() - ratio32) < 0.003
    np.testing.assert_allclose(y[kept], 1 / (1 - ratio32), rtol=1e-6)
    # neighbours and rows are independent: joint drop rates match the product of the marginals
    flat = ~kept.ravel()
    assert abs((flat[1:] & flat[:-1]).mean() - ratio32**2) < 0.004
    assert abs((~kept[1:] & ~kept[:-1]).mean() - ratio32**2) < 0.004
    # and every block of the array sees the same rate (no stuck lanes)
    blocks = (~kept).reshape(100, -1).mean(axis=1)
    assert np.all(np.abs(blocks - ratio32) < 0.03)


@pytest.mark.gpu
def test_gpu_seed_repeatability_and_fresh_draws(gpu_mode):
    x = np.ones((64, 33))
    layer, bottom, top = forward("", x, seed=21)
    first = top[0].data.copy()
    layer.forward(bottom, top)
    second = top[0].data.copy()
    assert not np.array_equal(first, second)
    common.set_random_seed(21)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, first)
    common.set_random_seed(22)
    layer.forward(bottom, top)
    assert not np.array_equal(top[0].data, first)
    # a second layer seeded the same way draws the same mask (the seed, not the layer, decides)
    _, _, top2 = forward("", x, seed=21)
    np.testing.assert_array_equal(top2[0].data, first)


@pytest.mark.gpu
def test_gpu_backward_matches_forward_mask(gpu_mode):
    rng = np.random.default_rng(6)
    x, dy = rng.uniform(1, 2, (30, 40)), rng.standard_normal((30, 40))
    layer, bottom, top = forward("dropout_param { dropout_ratio: 0.35 }", x, seed=4)
    kept = top[0].data != 0
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    scale = 1 / (1 - float(np.float32(0.35)))
    np.testing.assert_allclose(bottom[0].diff, np.where(kept, dy * scale, 0), rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_gpu_agree_at_test(dtype):
    rng = np.random.default_rng(7)
    x, dy = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    out = {}
    for m in ("cpu", "gpu"):
        caffe.set_mode_gpu() if m == "gpu" else caffe.set_mode_cpu()
        try:
            layer, bottom, top = forward("phase: TEST", x, dtype)
            top[0].diff[...] = dy
            layer.backward(top, [True], bottom)
            out[m] = (top[0].data.copy(), bottom[0].diff.copy())
        finally:
            caffe.set_mode_cpu()
    for a, b in zip(out["cpu"], out["gpu"]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_phase_comes_from_the_net(mode, phase):
    from pycaffe_lite.proto import caffe_pb2
    from pycaffe_lite.protoio import parse_text

    text = """layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 40 dim: 50 } } }
    layer { name: "drop" type: "Dropout" bottom: "data" top: "data" dropout_param { dropout_ratio: 0.5 } }"""
    net = caffe.Net(parse_text(text, caffe_pb2.NetParameter(), "<net>"), getattr(caffe, phase), dtype=np.float64)
    net.blobs["data"].data[...] = 1.0
    common.set_random_seed(3)
    net.forward()
    y = net.blobs["data"].data
    if phase == "TEST":
        assert np.all(y == 1.0)
    else:
        assert set(np.unique(y)) == {0.0, 2.0}
        assert 0.4 < (y == 0).mean() < 0.6
