"""Unpooling / UnPooling: MAX with a mask, with switches recomputed from the pre-pooling input and
without either; AVE and TILE windows; sizes; V1 (DeconvNet) prototxts; gradients; CPU/GPU; errors."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(12)


def pool(x, k=2, s=2, pool="MAX"):
    layer = make_layer(f'type: "Pooling" pooling_param {{ pool: {pool} kernel_size: {k} stride: {s} }}')
    bottom, top = blobs([x]), empty_blobs(2 if pool == "MAX" else 1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return [t.cpu_data().copy() for t in top]


def scatter_reference(values, mask, out_hw):
    y = np.zeros(values.shape[:2] + out_hw)
    for n, c, i, j in np.ndindex(values.shape):
        k = int(mask[n, c, i, j])
        y[n, c, k // out_hw[1], k % out_hw[1]] = values[n, c, i, j]
    return y


@pytest.mark.parametrize("type_", ["Unpooling", "UnPooling"])
def test_max_with_mask(mode, type_):
    x = RNG.standard_normal((2, 3, 8, 6))
    pooled, mask = pool(x)
    text = f'type: "{type_}" unpooling_param {{ unpool: MAX kernel_size: 2 stride: 2 unpool_h: 8 unpool_w: 6 }}'
    layer, bottom, top = run_layer(text, [pooled, mask], propagate=[True, False])
    np.testing.assert_array_equal(top[0].cpu_data(), scatter_reference(pooled, mask, (8, 6)))
    dy = top[0].cpu_diff()
    expected = np.array([dy[n, c].ravel()[int(mask[n, c, i, j])] for n, c, i, j in np.ndindex(pooled.shape)])
    np.testing.assert_array_equal(bottom[0].cpu_diff().ravel(), expected)


def test_max_switches_recomputed_from_the_input(mode):
    x = RNG.standard_normal((2, 3, 7, 9))
    pooled, mask = pool(x, 3, 2)
    values = RNG.standard_normal(pooled.shape)  # decoder features, not the pooled maxima
    layer, bottom, top = run_layer('type: "Unpooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 }',
                                   [values, x], propagate=[True, False])
    assert top[0].shape == x.shape
    np.testing.assert_array_equal(top[0].cpu_data(), scatter_reference(values, mask, (7, 9)))


def test_max_without_switches_uses_window_start(mode):
    x = RNG.standard_normal((1, 2, 3, 4))
    _, _, top = run_layer('type: "Unpooling" unpooling_param { kernel_size: 2 stride: 2 unpool_size: 6 }', [x])
    y = top[0].cpu_data()
    expected = np.zeros((1, 2, 6, 6))
    expected[:, :, 0:6:2, 0:8:2] = x[:, :, :, :3]  # column 3 starts at 6: clipped to 5
    expected[:, :, 0:6:2, 5] = x[:, :, :, 3]
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("method", ["AVE", "TILE"])
@pytest.mark.parametrize("k,s", [(2, 2), (3, 2), (3, 1)])
def test_window_methods(mode, method, k, s):
    x = RNG.standard_normal((2, 2, 4, 3))
    text = f'type: "Unpooling" unpooling_param {{ unpool: {method} kernel_size: {k} stride: {s} }}'
    layer, bottom, top = run_layer(text, [x])
    ho = max((4 - 1) * s + k, 4 * s + 1)
    wo = max((3 - 1) * s + k, 3 * s + 1)
    assert top[0].shape == (2, 2, ho, wo)
    expected = np.zeros((2, 2, ho, wo))
    dx = np.zeros_like(x)
    dy = top[0].cpu_diff()
    for i in range(4):
        for j in range(3):
            h0, w0 = i * s, j * s
            h1, w1 = min(h0 + k, ho), min(w0 + k, wo)
            f = 1.0 / ((h1 - h0) * (w1 - w0)) if method == "AVE" else 1.0
            expected[:, :, h0:h1, w0:w1] += x[:, :, i:i + 1, j:j + 1] * f
            dx[:, :, i, j] = dy[:, :, h0:h1, w0:w1].sum(axis=(2, 3)) * f
    np.testing.assert_allclose(top[0].cpu_data(), expected, rtol=1e-13)
    np.testing.assert_allclose(bottom[0].cpu_diff(), dx, rtol=1e-13)


def test_pooling_param_sizes_and_ave(mode):
    x = RNG.standard_normal((1, 2, 3, 3))
    _, _, top = run_layer('type: "Unpooling" pooling_param { pool: AVE kernel_size: 2 stride: 2 }', [x])
    assert top[0].shape == (1, 2, 6, 6)
    np.testing.assert_allclose(top[0].cpu_data()[:, :, ::2, ::2], x / 4)


def test_deconvnet_v1_prototxt(tmp_path):
    path = tmp_path / "v1.prototxt"
    path.write_text("""name: "deconvnet" input: "data" input_dim: 1 input_dim: 2 input_dim: 4 input_dim: 4
layers { name: "pool" type: POOLING bottom: "data" top: "pool" top: "mask" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers { name: "unpool" type: UNPOOLING bottom: "pool" bottom: "mask" top: "unpool"
  unpooling_param { unpool: MAX kernel_size: 2 stride: 2 unpool_size: 4 } }""")
    net = caffe.Net(str(path), caffe.TEST)
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    out = net.forward(data=x)["unpool"]
    blocks = x.reshape(1, 2, 2, 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(1, 2, 2, 2, 4)
    keep = blocks == blocks.max(axis=-1, keepdims=True)
    expected = (blocks * keep).reshape(1, 2, 2, 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(1, 2, 4, 4)
    np.testing.assert_array_equal(out, expected)


def test_errors():
    x = RNG.standard_normal((1, 1, 2, 2))
    with pytest.raises(caffe.NetError, match="kernel_size"):
        run_layer('type: "Unpooling" unpooling_param { stride: 2 }', [x])
    with pytest.raises(caffe.NetError, match="zero padding"):
        run_layer('type: "Unpooling" unpooling_param { kernel_size: 2 pad: 1 }', [x])
    with pytest.raises(caffe.NetError, match="outside"):
        run_layer('type: "Unpooling" unpooling_param { kernel_size: 2 stride: 2 unpool_size: 4 }',
                  [x, np.full(x.shape, 16.0)], propagate=[True, False])
    with pytest.raises(caffe.NetError, match="pre-pooling input"):
        run_layer('type: "Unpooling" unpooling_param { kernel_size: 2 stride: 2 }', [x, np.zeros((1, 2, 4, 4))])
    with pytest.raises(caffe.NetError, match="global_pooling"):
        run_layer('type: "Unpooling" pooling_param { global_pooling: true }', [x])
    with pytest.raises(caffe.NetError, match="MAX or AVE"):
        run_layer('type: "Unpooling" pooling_param { pool: STOCHASTIC kernel_size: 2 }', [x])


@pytest.mark.parametrize("text,second", [
    ('unpooling_param { unpool: MAX kernel_size: 2 stride: 2 unpool_size: 4 }', "mask"),
    ('pooling_param { pool: MAX kernel_size: 2 stride: 2 }', "input"),  # distinct switches: the adjoint
    ('unpooling_param { unpool: AVE kernel_size: 3 stride: 2 }', None),
    ('unpooling_param { unpool: TILE kernel_size: 2 stride: 1 }', None),
])
def test_gradient(mode, text, second):
    x = RNG.standard_normal((1, 2, 4, 4)) if second else RNG.standard_normal((1, 2, 5, 5))
    pooled, mask = pool(x, *((2, 2) if second else (3, 2)))
    arrays = [pooled] + ([mask] if second == "mask" else [x] if second == "input" else [])
    layer = make_layer(f'type: "Unpooling" {text}')
    GradientChecker(1e-3, 1e-6).check(layer, blobs(arrays), empty_blobs(1), check_bottom=[0])


@pytest.mark.gpu
@pytest.mark.parametrize("text,second", [
    ('unpooling_param { unpool: MAX kernel_size: 2 stride: 2 unpool_size: 10 }', "mask"),
    ('pooling_param { pool: MAX kernel_size: 3 stride: 2 }', "input"),
    ('unpooling_param { unpool: MAX kernel_size: 2 stride: 2 }', None),
    ('unpooling_param { unpool: AVE kernel_size: 3 stride: 2 }', None),
    ('unpooling_param { unpool: TILE kernel_size: 3 stride: 1 }', None),
    ('pooling_param { pool: AVE kernel_size: 2 stride: 2 }', None),
])
def test_cpu_gpu_agree(text, second):
    x = RNG.standard_normal((2, 3, 10, 10))
    pooled, mask = pool(x, *((2, 2) if second == "mask" else (3, 2)))
    arrays = [pooled] + ([mask] if second == "mask" else [x] if second == "input" else [])
    prop = [True] + [False] * (len(arrays) - 1)
    assert_cpu_gpu_agree(f'type: "Unpooling" {text}', arrays, propagate=prop)
