"""Normalize (SSD fork): L2 norm across the sample or per position, shared or per-channel scale."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

X = np.random.default_rng(7).standard_normal((2, 3, 4, 5))

CONFIGS = [
    "",
    "across_spatial: false",
    "channel_shared: false scale_filler { type: 'constant' value: 20 }",
    "across_spatial: false channel_shared: false scale_filler { type: 'gaussian' std: 1 }",
    "eps: 0.5",
]


def _ref_forward(x, scale, across, eps):
    """Loops over samples / positions (independent of the layer's vectorised code)."""
    out = np.empty_like(x)
    n, c, h, w = x.shape
    s = np.broadcast_to(np.asarray(scale).reshape(-1), (c,))
    for i in range(n):
        if across:
            norm = np.sqrt(sum(v * v for v in x[i].ravel()) + eps)
            for ch in range(c):
                out[i, ch] = x[i, ch] / norm * s[ch]
        else:
            for y in range(h):
                for z in range(w):
                    norm = np.sqrt(eps + sum(x[i, ch, y, z] ** 2 for ch in range(c)))
                    out[i, :, y, z] = x[i, :, y, z] / norm * s
    return out


@pytest.mark.parametrize("params", CONFIGS)
def test_forward(mode, params):
    layer, bottom, top = run_layer(f"type: 'Normalize' norm_param {{ {params} }}", [X])
    p = layer.layer_param.norm_param
    ref = _ref_forward(X, layer.blobs[0].cpu_data(), p.across_spatial, p.eps)
    np.testing.assert_allclose(top[0].cpu_data(), ref, rtol=1e-12, atol=1e-14)
    assert layer.blobs[0].shape == (() if p.channel_shared else (3,))


@pytest.mark.parametrize("params", CONFIGS)
def test_gradient(mode, params):
    layer = make_layer(f"type: 'Normalize' norm_param {{ {params} }}")
    GradientChecker(1e-3, 1e-5).check(layer, blobs([X[:, :, :2, :3]]), empty_blobs(1))


def test_two_axis_bottom(mode):
    x = X.reshape(2, -1)[:, :6]
    layer, bottom, top = run_layer("type: 'Normalize'", [x])
    np.testing.assert_allclose(top[0].cpu_data(), x / np.sqrt((x * x).sum(1, keepdims=True) + 1e-10))


def test_errors():
    with pytest.raises(caffe.NetError, match="at least 2 axes"):
        run_layer("type: 'Normalize'", [np.ones(4)])
    layer = make_layer("type: 'Normalize' norm_param { channel_shared: false }")
    layer.blobs = [layer.make_param_blob((2,))]
    with pytest.raises(caffe.NetError, match="scale blob has 2 values"):
        layer.setup(blobs([X]), empty_blobs(1))
    b = blobs([X])
    with pytest.raises(caffe.NetError, match="in place"):
        make_layer("type: 'Normalize'").setup(b, b)


@pytest.mark.gpu
@pytest.mark.parametrize("params", CONFIGS)
def test_cpu_gpu_agree(params):
    assert_cpu_gpu_agree(f"type: 'Normalize' norm_param {{ {params} }}", [X])


# The per-position kernels' launch shapes: a partial last tile (63 positions), fewer channels than
# channel lanes, 4-wide tiles (3 positions), 1-wide tiles with two channel steps (300 > 256), SSD's
# conv4_3 width (38 positions, 512 channels).
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (2, 37, 3, 1), (3, 300, 1, 1), (2, 512, 2, 19)])
@pytest.mark.parametrize("shared", ["true", "false"])
@pytest.mark.parametrize("across", ["true", "false"])
def test_cpu_gpu_agree_shapes(shape, shared, across):
    x = np.random.default_rng(3).standard_normal(shape)
    text = (f"type: 'Normalize' norm_param {{ across_spatial: {across} channel_shared: {shared} "
            "scale_filler { type: 'gaussian' std: 1 } }")
    assert_cpu_gpu_agree(text, [x])
    assert_cpu_gpu_agree(text, [x], dtype=np.float32, rtol=2e-4, atol=2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("learn_scale,propagate", [(False, True), (True, False)])
def test_gpu_one_gradient(learn_scale, propagate):
    """Per position, only dx or only the scale gradient: the other output is left alone."""
    x = np.random.default_rng(4).standard_normal((2, 11, 5, 7))
    text = "type: 'Normalize' norm_param { across_spatial: false channel_shared: false }"
    out = []
    for gpu in (False, True):
        caffe.set_mode_gpu() if gpu else caffe.set_mode_cpu()
        try:
            layer = make_layer(text)
            bottom, top = blobs([x]), empty_blobs(1)
            layer.setup(bottom, top)
            layer.param_propagate_down = [learn_scale]
            layer.forward(bottom, top)
            top[0].mutable_cpu_diff()[...] = np.random.default_rng(5).standard_normal(x.shape)
            layer.blobs[0].mutable_cpu_diff()[...] = 0.25
            bottom[0].mutable_cpu_diff()[...] = 99.0
            layer.backward(top, [propagate], bottom)
            out.append((bottom[0].cpu_diff().copy(), layer.blobs[0].cpu_diff().copy()))
        finally:
            caffe.set_mode_cpu()
    for a, b in zip(*out):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-11)
    if not propagate:
        np.testing.assert_array_equal(out[1][0], 99.0)
    if not learn_scale:
        np.testing.assert_array_equal(out[1][1], 0.25)
