"""ShuffleChannel: the channel permutation against explicit indices, inverse backward, errors."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

X = np.random.default_rng(3).standard_normal((2, 6, 3, 2))


@pytest.mark.parametrize("group", [1, 2, 3, 6])
def test_forward_backward(mode, group):
    layer, bottom, top = run_layer(f'type: "ShuffleChannel" shuffle_channel_param {{ group: {group} }}', [X])
    k = X.shape[1] // group
    y, dy, dx = top[0].cpu_data(), top[0].cpu_diff(), bottom[0].cpu_diff()
    for g in range(group):
        for j in range(k):
            np.testing.assert_array_equal(y[:, j * group + g], X[:, g * k + j])
            np.testing.assert_array_equal(dx[:, g * k + j], dy[:, j * group + g])


def test_known_order():
    x = np.arange(6.0).reshape(1, 6)
    _, _, top = run_layer('type: "ShuffleChannel" shuffle_channel_param { group: 2 }', [x])
    np.testing.assert_array_equal(top[0].cpu_data(), [[0, 3, 1, 4, 2, 5]])


def test_errors():
    with pytest.raises(caffe.NetError, match="does not divide the 6 channels"):
        run_layer('type: "ShuffleChannel" shuffle_channel_param { group: 4 }', [X])
    with pytest.raises(caffe.NetError, match="positive"):
        run_layer('type: "ShuffleChannel" shuffle_channel_param { group: 0 }', [X])
    layer = make_layer('type: "ShuffleChannel" shuffle_channel_param { group: 2 }')
    (b,) = blobs([X])
    with pytest.raises(caffe.NetError, match="in-place"):
        layer.setup([b], [b])


def test_gradient(mode):
    layer = make_layer('type: "ShuffleChannel" shuffle_channel_param { group: 3 }')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([X[:, :, :2, :1]]), empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("group", [1, 2, 3])
def test_cpu_gpu_agree(group):
    assert_cpu_gpu_agree(f'type: "ShuffleChannel" shuffle_channel_param {{ group: {group} }}', [X])
