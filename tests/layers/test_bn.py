"""BN (yjxiong / PSPNet and SegNet layouts): forward against a per-channel reference in every mode,
running averages, frozen parameters, tops of batch statistics, gradients, caffemodels of both forks,
CPU/GPU agreement, errors."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(11)
X = RNG.standard_normal((3, 4, 2, 5)) * 2 + 1
SLOPE = RNG.uniform(0.5, 1.5, 4)
BIAS = RNG.standard_normal(4)
RMEAN = RNG.standard_normal(4)
RVAR = RNG.uniform(0.5, 2, 4)
YJ = ('type: "BN" bn_param {{ slope_filler {{ type: "constant" value: 1 }} bias_filler {{ type: "constant" '
      'value: 0 }} momentum: 0.9 {extra} }} {phase}')


def per_channel(x, mean, var, eps, scale, shift):
    y = np.empty_like(x)
    for c in range(x.shape[1]):
        y[:, c] = scale[c] * (x[:, c] - mean[c]) / np.sqrt(var[c] + eps) + shift[c]
    return y


def batch_moments(x):
    m = np.array([x[:, c].mean() for c in range(x.shape[1])])
    v = np.array([((x[:, c] - m[c]) ** 2).mean() for c in range(x.shape[1])])
    return m, v


def set_params(layer, *values):
    for blob, v in zip(layer.blobs, values):
        blob.mutable_cpu_data()[...] = np.asarray(v).reshape(blob.shape)


def setup(text, x=X, ntop=1):
    layer = make_layer(text)
    bottom, top = blobs([x]), empty_blobs(ntop)
    layer.setup(bottom, top)
    return layer, bottom, top


def test_yjxiong_train_batch_stats_and_running_average(mode):
    layer, bottom, top = setup(YJ.format(extra="", phase=""))
    assert [b.shape for b in layer.blobs] == [(1, 4)] * 4
    assert [p.lr_mult for p in layer.layer_param.param[2:]] == [0, 0]
    set_params(layer, SLOPE, BIAS, RMEAN, RVAR)
    layer.forward(bottom, top)
    m, v = batch_moments(X)
    np.testing.assert_allclose(top[0].cpu_data(), per_channel(X, m, v, 1e-5, SLOPE, BIAS), rtol=1e-12, atol=1e-12)
    mom = float(np.float32(0.9))
    np.testing.assert_allclose(layer.blobs[2].cpu_data().ravel(), mom * RMEAN + (1 - mom) * m, rtol=1e-12)
    np.testing.assert_allclose(layer.blobs[3].cpu_data().ravel(), mom * RVAR + (1 - mom) * v, rtol=1e-12)


@pytest.mark.parametrize("extra,phase", [("frozen: true", ""), ("", "phase: TEST")])
def test_yjxiong_fixed_stats(mode, extra, phase):
    layer, bottom, top = setup(YJ.format(extra=extra, phase=phase))
    set_params(layer, SLOPE, BIAS, RMEAN, RVAR)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].cpu_data(), per_channel(X, RMEAN, RVAR, 1e-5, SLOPE, BIAS), rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_array_equal(layer.blobs[2].cpu_data().ravel(), RMEAN)  # not updated
    dy = RNG.standard_normal(X.shape)
    top[0].mutable_cpu_diff()[...] = dy
    for p in layer.blobs:
        p.mutable_cpu_diff()[...] = 0
    layer.backward(top, [True], bottom)
    k = (SLOPE / np.sqrt(RVAR + 1e-5))[None, :, None, None]
    np.testing.assert_allclose(bottom[0].cpu_diff(), k * dy, rtol=1e-12)
    if extra:  # frozen: nothing learns (the fork's forced lr_mult 0) and no parameter gradient
        assert [p.lr_mult for p in layer.layer_param.param] == [0, 0, 0, 0]
        assert layer.param_propagate_down == [False] * 4
    else:
        xh = per_channel(X, RMEAN, RVAR, 1e-5, np.ones(4), np.zeros(4))
        np.testing.assert_allclose(layer.blobs[0].cpu_diff().ravel(), (dy * xh).sum(axis=(0, 2, 3)), rtol=1e-12)
        np.testing.assert_allclose(layer.blobs[1].cpu_diff().ravel(), dy.sum(axis=(0, 2, 3)), rtol=1e-12)


def test_new_frozen_layer_starts_with_unit_variance():
    layer, _, _ = setup('type: "BN" bn_param { frozen: true }')
    np.testing.assert_array_equal(layer.blobs[3].cpu_data(), 1)
    np.testing.assert_array_equal(layer.blobs[0].cpu_data(), 0)  # the fork's default filler: constant 0


def test_segnet_learn_with_statistics_tops(mode):
    layer, bottom, top = setup('type: "BN" bn_param { scale_filler { type: "constant" value: 1 } '
                               'shift_filler { type: "constant" value: 0.001 } }', ntop=3)
    assert [b.shape for b in layer.blobs] == [(1, 4, 1, 1)] * 2
    set_params(layer, SLOPE, BIAS)
    layer.forward(bottom, top)
    m, v = batch_moments(X)
    np.testing.assert_allclose(top[0].cpu_data(), per_channel(X, m, v, 1e-9, SLOPE, BIAS), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(top[1].cpu_data().ravel(), m, rtol=1e-12)
    np.testing.assert_allclose(top[2].cpu_data().ravel(), v, rtol=1e-12)


def test_segnet_inference(mode):
    layer, bottom, top = setup('type: "BN" bn_param { bn_mode: INFERENCE }')
    set_params(layer, SLOPE, BIAS)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].cpu_data(), SLOPE[None, :, None, None] * X + BIAS[None, :, None, None],
                               rtol=1e-13)


def test_in_place(mode):
    layer = make_layer(YJ.format(extra="", phase=""))
    (b,) = blobs([X])
    layer.setup([b], [b])
    set_params(layer, SLOPE, BIAS, RMEAN, RVAR)
    layer.forward([b], [b])
    m, v = batch_moments(X)
    np.testing.assert_allclose(b.cpu_data(), per_channel(X, m, v, 1e-5, SLOPE, BIAS), rtol=1e-12, atol=1e-12)
    b.mutable_cpu_diff()[...] = 1.0
    layer.backward([b], [True], [b])
    np.testing.assert_allclose(b.cpu_diff(), 0, atol=1e-12)  # a constant gradient is normalized away


@pytest.mark.parametrize("x", [X, X.reshape(3, 4, 1, 10)[:2].repeat(2, axis=3)], ids=["scalar", "vec4"])
@pytest.mark.parametrize("extra,phase", [("", ""), ("", "phase: TEST")])
def test_in_place_backward_equals_out_of_place(mode, extra, phase, x):
    """In place the layer keeps x_hat; out of place backward normalizes its input again: the
    gradients (dx, slope, bias) agree (planes of 10 and 20 elements: the scalar and 4-wide GPU
    kernels)."""
    dy = np.random.default_rng(3).standard_normal(x.shape)
    got = []
    for in_place in (True, False):
        layer = make_layer(YJ.format(extra=extra, phase=phase))
        (b,) = blobs([x])
        t = b if in_place else empty_blobs(1)[0]
        layer.setup([b], [t])
        set_params(layer, SLOPE, BIAS, RMEAN, RVAR)
        layer.forward([b], [t])
        t.mutable_cpu_diff()[...] = dy
        layer.backward([t], [True], [b])
        got.append([b.cpu_diff().copy(), layer.blobs[0].cpu_diff().copy(), layer.blobs[1].cpu_diff().copy()])
    for kept, rebuilt in zip(*got):
        np.testing.assert_allclose(kept, rebuilt, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("text", [
    YJ.format(extra="", phase=""),
    YJ.format(extra="", phase="phase: TEST"),
    YJ.format(extra="frozen: true", phase=""),
    'type: "BN" bn_param { bn_mode: LEARN scale_filler { type: "uniform" min: 0.5 max: 1.5 } }',
    'type: "BN" bn_param { bn_mode: INFERENCE scale_filler { type: "uniform" } shift_filler { type: "gaussian" } }',
])
def test_gradient(mode, text):
    layer = make_layer(text)
    GradientChecker(1e-3, 1e-5).check(layer, blobs([X[:2, :3, :, :2]]), empty_blobs(1))


def test_errors():
    with pytest.raises(caffe.NetError, match="mixes SegNet"):
        run_layer('type: "BN" bn_param { bn_mode: INFERENCE frozen: true }', [X])
    with pytest.raises(caffe.NetError, match="only SegNet"):
        run_layer('type: "BN" bn_param { frozen: true }', [X], ntop=2)
    with pytest.raises(caffe.NetError, match="expected 4"):
        make_layer('type: "BN" blobs { shape { dim: 1 dim: 4 } data: [1, 1, 1, 1] } blobs { shape { dim: 1 dim: 4 } '
                   'data: [0, 0, 0, 0] } blobs { shape { dim: 1 dim: 4 } data: [0, 0, 0, 0] }').setup(
            blobs([X]), empty_blobs(1))


NET = """name: "bn" layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ dim: 3 dim: 4 dim: 2 dim: 5 }} }} }}
layer {{ name: "bn1" type: "BN" bottom: "data" top: "data" bn_param {{ {bn} }} }}"""


def _caffemodel(tmp_path, shapes, values, layer_extra=b""):
    net = caffe_pb2.NetParameter(name="bn")
    lp = net.layer.add(name="bn1", type="BN")
    for shape, v in zip(shapes, values):
        b = lp.blobs.add()
        b.shape.dim.extend(shape)
        b.data.extend(np.asarray(v, np.float32).ravel())
    raw = net.SerializeToString()
    if layer_extra:  # a field of the fork's LayerParameter that ours does not know, as the fork wrote it
        lp.ParseFromString(lp.SerializeToString() + layer_extra)
        raw = net.SerializeToString()
    path = tmp_path / "w.caffemodel"
    path.write_bytes(raw)
    return path


def test_load_pspnet_caffemodel(tmp_path):
    path = _caffemodel(tmp_path, [(1, 4)] * 4, [SLOPE, BIAS, RMEAN, RVAR])
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(NET.format(bn="slope_filler { value: 1 } frozen: true momentum: 0.95"))
    net = caffe.Net(str(proto), caffe.TEST, weights=str(path))
    out = net.forward(data=X.astype(np.float32))["data"]
    np.testing.assert_allclose(out, per_channel(X, RMEAN, RVAR, 1e-5, SLOPE, BIAS), rtol=1e-4, atol=1e-5)


def test_load_segnet_caffemodel(tmp_path):
    # SegNet files carry bn_param as LayerParameter field 45 (bn_mode = field 3 of their message).
    segnet_bn_param = bytes([0xEA, 0x02, 2, 3 * 8, 1])  # tag (45 << 3 | 2) as a varint, length 2
    path = _caffemodel(tmp_path, [(1, 4, 1, 1)] * 2, [SLOPE, BIAS], layer_extra=segnet_bn_param)
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(NET.format(bn="bn_mode: INFERENCE"))
    net = caffe.Net(str(proto), caffe.TEST, weights=str(path))
    out = net.forward(data=X.astype(np.float32))["data"]
    np.testing.assert_allclose(out, SLOPE[None, :, None, None] * X + BIAS[None, :, None, None], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("text,ntop", [
    (YJ.format(extra="", phase=""), 1),
    (YJ.format(extra="", phase="phase: TEST"), 1),
    (YJ.format(extra="frozen: true", phase=""), 1),
    ('type: "BN" bn_param { bn_mode: LEARN scale_filler { type: "uniform" } shift_filler { type: "uniform" } }', 3),
    ('type: "BN" bn_param { bn_mode: INFERENCE scale_filler { type: "uniform" } shift_filler { type: "uniform" } }', 1),
])
@pytest.mark.parametrize("shape", [(4, 5, 13, 11), (3, 5, 12, 8)], ids=["scalar", "vec4"])
def test_cpu_gpu_agree(text, ntop, shape):
    """Planes of 143 elements take the scalar kernels, of 96 the 4-wide ones."""
    big = RNG.standard_normal(shape)
    assert_cpu_gpu_agree(text, [big], ntop=ntop, rtol=1e-10, atol=1e-12)
    # float32: the slope/bias gradients reach 1e4 and are sums of 572 terms whose order differs between
    # the devices, so a small entry beside them agrees to ~1e-7 of that scale, not of its own
    assert_cpu_gpu_agree(text, [big], ntop=ntop, dtype=np.float32, rtol=2e-4, atol=5e-3)


def test_frozen_overrides_the_prototxt_lr_mult(tmp_path):
    """PSPNet files write lr_mult 1 on slope and bias with frozen: true; the fork forces 0, so the
    net learns nothing there (and a frozen layer computes no parameter gradient)."""
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET.format(bn="slope_filler { value: 1 } frozen: true").replace(
        'type: "BN"', 'type: "BN" param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 1 decay_mult: 1 } '
        'param { lr_mult: 1 } param { lr_mult: 1 }') + '\nforce_backward: true\n')
    net = caffe.Net(str(proto), caffe.TRAIN)
    bn = net.layers[1]
    assert [p.lr_mult for p in net.param.layer[1].param] == [0, 0, 0, 0]
    assert all(lr == 0 for lr in net.params_lr)
    net.forward(data=X.astype(np.float32))
    net.blobs["data"].diff[...] = 1
    net.backward()
    assert all(not p.diff.any() for p in bn.blobs)
    proto.write_text(NET.format(bn="slope_filler { value: 1 }").replace(
        'type: "BN"', 'type: "BN" param { lr_mult: 1 } param { lr_mult: 2 } param { lr_mult: 1 } param { lr_mult: 1 }'))
    net = caffe.Net(str(proto), caffe.TRAIN)
    assert [p.lr_mult for p in net.param.layer[1].param] == [1, 2, 0, 0]  # statistics never learn
