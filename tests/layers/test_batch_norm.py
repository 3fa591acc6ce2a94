"""BatchNorm: batch and global statistics, Caffe's running sums, gradients, CPU/GPU agreement."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(2)
X = RNG.standard_normal((3, 2, 2, 3)) * 2 + 1
TRAIN = 'type: "BatchNorm" phase: TRAIN'
GLOBAL = 'type: "BatchNorm" batch_norm_param { use_global_stats: true }'


def set_stats(layer, mean, var, factor):
    layer.blobs[0].mutable_cpu_data()[...] = mean
    layer.blobs[1].mutable_cpu_data()[...] = var
    layer.blobs[2].mutable_cpu_data()[...] = factor


def test_blobs_and_param_specs():
    layer = make_layer(TRAIN)
    layer.setup(blobs([X]), empty_blobs(1))
    assert [b.shape for b in layer.blobs] == [(2,), (2,), (1,)]
    assert all(np.all(b.cpu_data() == 0) for b in layer.blobs)
    assert [p.lr_mult for p in layer.layer_param.param] == [0, 0, 0]
    assert layer.param_propagate_down == [False, False, False]
    assert not layer.use_global_stats
    test_layer = make_layer('type: "BatchNorm" phase: TEST')
    test_layer.setup(blobs([X]), empty_blobs(1))
    assert test_layer.use_global_stats


def test_learned_stats_rejected():
    layer = make_layer('type: "BatchNorm" param { lr_mult: 1 }')
    with pytest.raises(caffe.NetError, match="lr_mult"):
        layer.setup(blobs([X]), empty_blobs(1))


def test_batch_forward_and_running_sums(mode):
    layer = make_layer('type: "BatchNorm" batch_norm_param { moving_average_fraction: 0.9 eps: 1e-3 }')
    bottom, top = blobs([X]), empty_blobs(1)
    layer.setup(bottom, top)
    mean = X.mean(axis=(0, 2, 3))
    var = X.var(axis=(0, 2, 3))
    m = X.size / 2
    layer.forward(bottom, top)
    expect = (X - mean[None, :, None, None]) / np.sqrt(var + 1e-3)[None, :, None, None]
    np.testing.assert_allclose(top[0].cpu_data(), expect, rtol=1e-10)
    np.testing.assert_allclose(layer.blobs[2].cpu_data(), [1.0])
    np.testing.assert_allclose(layer.blobs[0].cpu_data(), mean)
    np.testing.assert_allclose(layer.blobs[1].cpu_data(), var * m / (m - 1))
    layer.forward(bottom, top)
    np.testing.assert_allclose(layer.blobs[2].cpu_data(), [1.9])
    np.testing.assert_allclose(layer.blobs[0].cpu_data(), 1.9 * mean)
    np.testing.assert_allclose(layer.blobs[1].cpu_data(), 1.9 * var * m / (m - 1))


@pytest.mark.parametrize("factor", [2.0, 0.0])
def test_global_forward_divides_by_scale_factor(mode, factor):
    layer = make_layer(GLOBAL)
    bottom, top = blobs([X]), empty_blobs(1)
    layer.setup(bottom, top)
    set_stats(layer, [2.0, -4.0], [8.0, 0.5], factor)
    layer.forward(bottom, top)
    sf = 0.0 if factor == 0 else 1 / factor
    mean = sf * np.array([2.0, -4.0])
    var = sf * np.array([8.0, 0.5])
    eps = layer.eps  # float32 1e-5
    expect = (X - mean[None, :, None, None]) / np.sqrt(var + eps)[None, :, None, None]
    np.testing.assert_allclose(top[0].cpu_data(), expect, rtol=1e-10)
    np.testing.assert_allclose(layer.blobs[2].cpu_data(), [factor])  # untouched at test time
    top[0].mutable_cpu_diff()[...] = 1.0
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].cpu_diff(), np.broadcast_to(1 / np.sqrt(var + eps)[None, :, None, None], X.shape))


def test_two_axis_input():
    x = RNG.standard_normal((5, 3))
    layer, _, top = run_layer(TRAIN, [x])
    np.testing.assert_allclose(top[0].cpu_data(), (x - x.mean(0)) / np.sqrt(x.var(0) + layer.eps), rtol=1e-10)


def test_in_place(mode):
    layer = make_layer(TRAIN)
    (b,) = blobs([X])
    layer.setup([b], [b])
    layer.forward([b], [b])
    y = b.cpu_data().copy()
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0, atol=1e-12)
    dy = RNG.standard_normal(X.shape)
    b.mutable_cpu_diff()[...] = dy
    layer.backward([b], [True], [b])
    std = np.sqrt(X.var(axis=(0, 2, 3)) + layer.eps)[None, :, None, None]
    expect = (dy - dy.mean(axis=(0, 2, 3), keepdims=True) - y * (dy * y).mean(axis=(0, 2, 3), keepdims=True)) / std
    np.testing.assert_allclose(b.cpu_diff(), expect, rtol=1e-9, atol=1e-12)


def test_gradient_batch_stats(mode):
    GradientChecker(1e-3, 1e-4).check(make_layer(TRAIN), blobs([X]), empty_blobs(1))


def test_gradient_global_stats(mode):
    layer = make_layer(GLOBAL)
    bottom, top = blobs([X]), empty_blobs(1)
    layer.setup(bottom, top)
    set_stats(layer, [1.0, 2.0], [3.0, 0.5], 1.5)
    GradientChecker(1e-3, 1e-5).check(layer, bottom, top)
    assert layer.blobs[2].cpu_data()[0] == 1.5  # global statistics are never updated


def test_net_gives_zero_lr(tmp_path):
    net_file = tmp_path / "bn.prototxt"
    net_file.write_text(
        'layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 2 } } }\n'
        'layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y" }\n'
    )
    net = caffe.Net(str(net_file), caffe.TRAIN)
    assert [b.shape for b in net.params["bn"]] == [(3,), (3,), (1,)]
    assert net.params_lr == [0, 0, 0]
    assert net.layers[1].param_propagate_down == [False, False, False]


@pytest.mark.gpu
@pytest.mark.parametrize("text", [TRAIN, 'type: "BatchNorm" phase: TRAIN batch_norm_param { eps: 0.1 moving_average_fraction: 0.5 }'])
def test_cpu_gpu_agree_batch(text):
    assert_cpu_gpu_agree(text, [X])


def with_stats(text, mean, var, factor):
    """Layer text with the running sums embedded as its param blobs."""
    def blob(values):
        return f"blobs {{ shape {{ dim: {len(values)} }} " + " ".join(f"data: {v}" for v in values) + " }"
    return f"{text} {blob(mean)} {blob(var)} {blob([factor])}"


@pytest.mark.gpu
@pytest.mark.parametrize("factor", [1.5, 0.0])
@pytest.mark.parametrize("x", [X, RNG.standard_normal((4, 2, 4, 6)) + 3], ids=["odd", "vec4"])
def test_cpu_gpu_agree_global(factor, x):
    assert_cpu_gpu_agree(with_stats(GLOBAL, [1.0, 2.0], [3.0, 0.5], factor), [x], rtol=1e-10, atol=1e-12)


LARGE = RNG.standard_normal((8, 3, 40, 48)) * 3 + 5  # many reduction chunks; a mean far from 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("x", [X, LARGE, RNG.standard_normal((6, 4)), RNG.standard_normal((2, 3, 1, 1))],
                         ids=["odd", "large", "2-axis", "1x1"])
@pytest.mark.parametrize("text", [TRAIN, GLOBAL])
def test_cpu_gpu_agree_shapes(dtype, x, text):
    if text == GLOBAL:
        c = x.shape[1]
        text = with_stats(GLOBAL, np.linspace(-1, 1, c), np.linspace(0.5, 2, c), 2.0)
    tol = {"rtol": 1e-3, "atol": 1e-3} if dtype == np.float32 else {"rtol": 1e-8, "atol": 1e-10}
    assert_cpu_gpu_agree(text, [x], dtype=dtype, **tol)


ITER_TEXT = 'type: "BatchNorm" phase: TRAIN batch_norm_param { moving_average_fraction: 0.7 }'
ITER_X = [RNG.standard_normal((4, 3, 4, 4)) * (i + 1) + i for i in range(4)]
ITER_DY = [np.cos(np.arange(x.size) + i).reshape(x.shape) for i, x in enumerate(ITER_X)]


def reference_iterations(layer):
    """numpy: per TRAIN iteration over ITER_X/ITER_DY, (y, dx, [mean sum, variance sum, scale factor])."""
    maf, eps = layer.maf, layer.eps  # as stored (float32)
    s, run_mean, run_var, m = 0.0, np.zeros(3), np.zeros(3), 4 * 16
    for x, dy in zip(ITER_X, ITER_DY):
        mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
        std = np.sqrt(var + eps)[None, :, None, None]
        y = (x - mean[None, :, None, None]) / std
        dx = (dy - dy.mean(axis=(0, 2, 3), keepdims=True) - y * (dy * y).mean(axis=(0, 2, 3), keepdims=True)) / std
        s, run_mean, run_var = maf * s + 1, mean + maf * run_mean, var * m / (m - 1) + maf * run_var
        yield y, dx, [run_mean, run_var, np.array([s])]


def check_iteration(layer, b, top, expected):
    y, dx, stats = expected
    np.testing.assert_allclose(top[0].cpu_data(), y, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(b.cpu_diff(), dx, rtol=1e-9, atol=1e-12)
    for blob, want in zip(layer.blobs, stats):
        np.testing.assert_allclose(blob.cpu_data(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("in_place", [False, True])
def test_running_average_over_iterations(mode, in_place):
    """Several TRAIN iterations with changing inputs, on each device against numpy: outputs, input
    gradients and Caffe's running sums (on the GPU these never leave the device)."""
    layer = make_layer(ITER_TEXT)
    (b,) = blobs([ITER_X[0]])
    top = [b] if in_place else empty_blobs(1)
    layer.setup([b], top)
    for x, dy, expected in zip(ITER_X, ITER_DY, reference_iterations(layer)):
        b.mutable_cpu_data()[...] = x
        layer.forward([b], top)
        top[0].mutable_cpu_diff()[...] = dy
        layer.backward(top, [True], [b])
        check_iteration(layer, b, top, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("in_place", [False, True])
def test_train_pass_replays_in_cuda_graph(gpu_mode, in_place):
    """Forward + backward captured once and replayed with new inputs: the statistics, the factor and
    the running sums are device-side, so every replay matches numpy."""
    from pycaffe_lite.gpu import cuda_graph

    layer = make_layer(ITER_TEXT)
    (b,) = blobs([ITER_X[0]])
    top = [b] if in_place else empty_blobs(1)
    layer.setup([b], top)
    expected = reference_iterations(layer)
    layer.forward([b], top)  # eager first: compiles, sizes the workspace and internal blobs
    top[0].mutable_cpu_diff()[...] = ITER_DY[0]
    layer.backward(top, [True], [b])
    check_iteration(layer, b, top, next(expected))
    recording = cuda_graph.Recording()
    with cuda_graph.capture(recording):
        layer.forward([b], top)
        layer.backward(top, [True], [b])
    graph = recording.graph
    for x, dy, want in zip(ITER_X[1:], ITER_DY[1:], expected):
        b.mutable_cpu_data()[...] = x
        b.gpu_data()
        top[0].mutable_cpu_diff()[...] = dy
        top[0].gpu_diff()
        graph.launch()
        for blob in [b, top[0], *layer.blobs]:  # the replay wrote these on the device
            blob.mutable_gpu_data()
            blob.mutable_gpu_diff()
        check_iteration(layer, b, top, want)
