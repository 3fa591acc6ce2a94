"""Pooling's general path: N-D MAX/AVE (1-D, 3-D, 4-D), the per-axis *_nd fields, ceil_mode/round_mode,
and STOCHASTIC pooling (TRAIN sampling statistics, TEST weighted average, gradient routing)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer

FLT_MAX = float(np.finfo(np.float32).max)


def pool_text(body: str, phase: str = "TRAIN") -> str:
    return f'name: "pool" type: "Pooling" phase: {phase} pooling_param {{ {body} }}'


def out_len(n, k, p, s, ceil, any_pad=False):
    """Caffe's pooled length (the clip applies when any axis is padded)."""
    span = n + 2 * p - k
    q = (-(-span // s) if ceil else span // s) + 1
    if any_pad and (q - 1) * s >= n + p:
        q -= 1
    return q


def naive_pool(x, method, kernel, pad, stride, ceil=True):
    """Explicit loops over windows: (top, flat argmax index) for MAX, top for AVE."""
    n, c, *size = x.shape
    any_pad = any(pad)
    out = [out_len(a, k, p, s, ceil, any_pad) for a, k, p, s in zip(size, kernel, pad, stride)]
    y = np.zeros((n, c, *out))
    idx = np.full((n, c, *out), -1)
    for o in itertools.product(*map(range, out)):
        start = [q * s - p for q, s, p in zip(o, stride, pad)]
        lo = [max(a, 0) for a in start]
        hi = [min(a + k, m) for a, k, m in zip(start, kernel, size)]
        area = np.prod([min(a + k, m + p) - a for a, k, m, p in zip(start, kernel, size, pad)])
        for b in range(n):
            for ch in range(c):
                best, arg, total = -FLT_MAX, -1, 0.0
                for i in itertools.product(*(range(a, z) for a, z in zip(lo, hi))):
                    v = x[(b, ch, *i)]
                    total += v
                    if v > best:
                        best, arg = v, int(np.ravel_multi_index(i, size))
                y[(b, ch, *o)] = best if method == "MAX" else total / area
                idx[(b, ch, *o)] = arg
    return (y, idx) if method == "MAX" else y


def _setup(body, x, ntop=1, phase="TRAIN", dtype=np.float64):
    layer = make_layer(pool_text(body, phase), dtype)
    bottom, top = blobs([x], dtype), empty_blobs(ntop, dtype)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


ND_CASES = [  # (shape, body, kernel, pad, stride, ceil)
    ((2, 2, 9), "kernel_size: 3 stride: 2", (3,), (0,), (2,), True),
    ((2, 2, 5, 6, 7), "kernel_size: 2 stride: 2", (2, 2, 2), (0, 0, 0), (2, 2, 2), True),
    ((1, 2, 6, 5, 7), "kernel_size_nd: 3 kernel_size_nd: 2 kernel_size_nd: 3 stride_nd: 2 stride_nd: 1 "
     "stride_nd: 3 pad_nd: 1 pad_nd: 0 pad_nd: 1", (3, 2, 3), (1, 0, 1), (2, 1, 3), True),
    ((1, 2, 7, 6, 5), "kernel_size: 3 stride: 2 pad: 1 ceil_mode: false", (3, 3, 3), (1, 1, 1), (2, 2, 2), False),
    ((1, 2, 7, 6, 5), "kernel_size: 2 stride: 2 round_mode: FLOOR", (2, 2, 2), (0, 0, 0), (2, 2, 2), False),
    ((1, 1, 3, 4, 3, 4), "kernel_size: 2 stride: 2 pad: 1", (2,) * 4, (1,) * 4, (2,) * 4, True),
]


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,body,kernel,pad,stride,ceil", ND_CASES)
def test_nd_forward_matches_naive(mode, method, shape, body, kernel, pad, stride, ceil):
    x = np.random.default_rng(0).standard_normal(shape)
    ntop = 2 if method == "MAX" else 1
    layer, _, top = _setup(f"pool: {method} {body}", x, ntop)
    assert layer.nd is not None
    want = naive_pool(x, method, kernel, pad, stride, ceil)
    if method == "MAX":
        np.testing.assert_allclose(top[0].data, want[0], rtol=0, atol=0)
        np.testing.assert_array_equal(top[1].data, want[1])
    else:
        np.testing.assert_allclose(top[0].data, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_nd_fields_on_2d_match_2d_path(mode, method):
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 8))
    ntop = 2 if method == "MAX" else 1
    plain, pb, pt = _setup(f"pool: {method} kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 1",
                           x, ntop)
    general, gb, gt = _setup(f"pool: {method} kernel_size_nd: 3 kernel_size_nd: 2 stride_nd: 2 stride_nd: 1 "
                             "pad_nd: 1", x, ntop)
    assert plain.nd is None and general.nd is not None
    for a, b in zip(pt, gt):
        np.testing.assert_array_equal(b.data, a.data)
    for layer, b, t in ((plain, pb, pt), (general, gb, gt)):
        t[0].diff[...] = np.linspace(-1, 1, t[0].count).reshape(t[0].shape)
        layer.backward(t[:1], [True], b)
    np.testing.assert_allclose(gb[0].diff, pb[0].diff, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("body,want", [
    ("kernel_size: 3 stride: 2", (3, 3)),  # BVLC: ceil
    ("kernel_size: 3 stride: 2 ceil_mode: true", (3, 3)),
    ("kernel_size: 3 stride: 2 ceil_mode: false", (2, 2)),
    ("kernel_size: 3 stride: 2 ceil_mode: false round_mode: FLOOR", (2, 2)),
    ("kernel_size: 2 stride: 2 pad: 1 ceil_mode: false", (4, 4)),
    ("kernel_size: 2 stride: 2 pad: 1", (4, 4)),
])
def test_ceil_mode_2d(mode, body, want):
    x = np.random.default_rng(2).standard_normal((1, 2, 6, 6))
    _, _, top = _setup(f"pool: MAX {body}", x)
    assert top[0].shape[2:] == want
    k, s, p = (3, 2, 0) if "kernel_size: 3" in body else (2, 2, 1)
    ref, _ = naive_pool(x, "MAX", (k, k), (p, p), (s, s), ceil="false" not in body)
    np.testing.assert_array_equal(top[0].data, ref)


def test_ceil_mode_contradiction_is_an_error():
    layer = make_layer(pool_text("pool: MAX kernel_size: 2 ceil_mode: true round_mode: FLOOR"))
    with pytest.raises(NetError, match="ceil_mode: true contradicts round_mode: FLOOR") as info:
        layer.setup(blobs([np.zeros((1, 1, 4, 4))]), empty_blobs(1))
    assert "layer 'pool'" in str(info.value)


def test_pytorch_export_prototxt_with_ceil_mode_false_loads(tmp_path):
    (tmp_path / "n.prototxt").write_text(
        'input: "data" input_shape { dim: 1 dim: 1 dim: 7 dim: 7 }\n'
        'layer { name: "pool" type: "Pooling" bottom: "data" top: "pool"\n'
        '        pooling_param { pool: MAX kernel_size: 2 stride: 2 ceil_mode: false } }\n')
    net = caffe.Net(str(tmp_path / "n.prototxt"), caffe.TEST)
    x = np.arange(49.0).reshape(1, 1, 7, 7)
    out = net.forward(data=x)["pool"]
    np.testing.assert_array_equal(out[0, 0], x[0, 0, 1:6:2, 1:6:2])  # 3x3, floor: the last row/column unused


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,body", [
    ((2, 2, 5, 4, 5), "kernel_size: 2 stride: 2 pad: 1"),
    ((1, 2, 5, 5, 4), "kernel_size_nd: 3 kernel_size_nd: 2 kernel_size_nd: 2 stride_nd: 2 stride_nd: 1 stride_nd: 2"),
    ((2, 3, 7), "kernel_size: 3 stride: 2 pad: 1"),
])
@pytest.mark.slow
def test_nd_gradient(mode, method, shape, body):
    rng = np.random.default_rng(4)
    x = rng.permutation(np.prod(shape)).reshape(shape) / 7.0  # distinct values: no MAX ties
    layer = make_layer(pool_text(f"pool: {method} {body}"))
    bottom, top = blobs([x]), empty_blobs(1)
    GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)


@pytest.mark.parametrize("body,match", [
    ("pool: MAX kernel_size: 2 kernel_size_nd: 2", "give one of kernel_size, kernel_size_nd"),
    ("pool: MAX kernel_size_nd: 2 kernel_size_nd: 2", "kernel_size_nd has 2 values; give 1 or one per spatial axis"),
    ("pool: MAX kernel_h: 2 kernel_w: 2", "kernel_h and kernel_w are for 2-D pooling"),
    ("pool: MAX stride: 2", "pooling needs kernel_size"),
    ("pool: MAX kernel_size: 2 pad: 2", "must be smaller than the kernel"),
    ("pool: STOCHASTIC kernel_size: 2 pad: 1", "STOCHASTIC pooling takes no padding"),
    ("pool: AVE kernel_size: 2", "only MAX pooling has a second"),
    ("pool: MAX kernel_size: 9", "output would be empty"),
])
def test_nd_errors(body, match):
    layer = make_layer(pool_text(body))
    ntop = 2 if "AVE" in body else 1
    with pytest.raises(NetError, match=match) as info:
        layer.setup(blobs([np.zeros((1, 1, 4, 4, 4))]), empty_blobs(ntop))
    assert "layer 'pool'" in str(info.value)


def test_nd_global_pooling(mode):
    x = np.random.default_rng(5).standard_normal((2, 3, 3, 4, 5))
    _, _, top = _setup("pool: AVE global_pooling: true", x)
    assert top[0].shape == (2, 3, 1, 1, 1)
    np.testing.assert_allclose(top[0].data.reshape(2, 3), x.mean(axis=(2, 3, 4)), rtol=1e-12)


# -- STOCHASTIC ---------------------------------------------------------------------------------
def naive_stochastic_test(x, kernel, stride):
    """TEST phase: sum(x^2)/sum(x) over each window clipped to the input (0 when the sum is not positive)."""
    n, c, *size = x.shape
    out = [out_len(a, k, 0, s, True) for a, k, s in zip(size, kernel, stride)]
    y = np.zeros((n, c, *out))
    for o in itertools.product(*map(range, out)):
        win = tuple(slice(q * s, min(q * s + k, m)) for q, s, k, m in zip(o, stride, kernel, size))
        v = x[(slice(None), slice(None)) + win].reshape(n, c, -1)
        total = v.sum(axis=2)
        y[(slice(None), slice(None)) + o] = np.where(total > 0, (v * v).sum(axis=2) / np.where(total > 0, total, 1),
                                                     0)
    return y


@pytest.mark.parametrize("shape,body,kernel,stride", [
    ((2, 3, 7, 6), "kernel_size: 3 stride: 2", (3, 3), (2, 2)),
    ((1, 2, 5, 4, 6), "kernel_size_nd: 2 kernel_size_nd: 3 kernel_size_nd: 2 stride: 2", (2, 3, 2), (2, 2, 2)),
])
def test_stochastic_test_phase_weighted_average(mode, shape, body, kernel, stride):
    x = np.abs(np.random.default_rng(6).standard_normal(shape))
    x[0, 0] = 0.0  # all-zero windows give 0
    layer, bottom, top = _setup(f"pool: STOCHASTIC {body}", x, phase="TEST")
    np.testing.assert_allclose(top[0].data, naive_stochastic_test(x, kernel, stride), rtol=1e-12, atol=1e-12)
    top[0].diff[...] = 1.0
    with pytest.raises(NetError, match="TRAIN forward sampled"):
        layer.backward(top, [True], bottom)


def _window_members(x_shape, kernel, stride, top_shape):
    """For each top element of a plane, the set of flat plane indices its window covers."""
    size = x_shape[2:]
    members = {}
    for o in itertools.product(*map(range, top_shape[2:])):
        ranges = [range(q * s, min(q * s + k, m)) for q, s, k, m in zip(o, stride, kernel, size)]
        members[o] = {int(np.ravel_multi_index(i, size)) for i in itertools.product(*ranges)}
    return members


@pytest.mark.parametrize("shape,body,kernel,stride", [
    ((2, 3, 7, 6), "kernel_size: 3 stride: 2", (3, 3), (2, 2)),  # overlapping, ceil windows past the end
    ((2, 2, 5, 4, 5), "kernel_size: 2 stride: 2", (2, 2, 2), (2, 2, 2)),
])
def test_stochastic_train_picks_window_members_and_routes_gradient(mode, shape, body, kernel, stride):
    rng = np.random.default_rng(7)
    x = rng.uniform(0.1, 1.0, shape)
    caffe.set_random_seed(11)
    layer, bottom, top = _setup(f"pool: STOCHASTIC {body}", x)
    index = layer.nd.cpu_index if caffe.common.mode() is caffe.common.Mode.CPU else None
    members = _window_members(shape, kernel, stride, top[0].shape)
    planes = x.reshape(shape[0] * shape[1], -1)
    y = top[0].data.reshape(shape[0] * shape[1], -1)
    dy = rng.standard_normal(top[0].shape)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    dx = bottom[0].diff.reshape(planes.shape)
    want_dx = np.zeros_like(planes)
    outs = list(itertools.product(*map(range, top[0].shape[2:])))
    for p in range(planes.shape[0]):
        for j, o in enumerate(outs):
            hits = [i for i in members[o] if planes[p, i] == y[p, j]]  # values are distinct (continuous draws)
            assert len(hits) == 1, "the top value is not one of its window's values"
            if index is not None:
                assert index.reshape(planes.shape[0], -1)[p, j] == hits[0]
            want_dx[p, hits[0]] += dy.reshape(planes.shape[0], -1)[p, j]
    np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-12)


def test_stochastic_train_frequencies_follow_activations(mode):
    """4000 independent 2x2 windows holding (0, 1, 3, 4): picks follow p = v / 8, the zero is never taken."""
    values = np.array([0.0, 1.0, 3.0, 4.0])
    x = np.broadcast_to(values.reshape(1, 1, 2, 2), (40, 100, 2, 2)).copy()
    caffe.set_random_seed(3)
    _, _, top = _setup("pool: STOCHASTIC kernel_size: 2 stride: 2", x)
    picks = top[0].data.ravel()
    freq = np.array([(picks == v).mean() for v in values])
    assert freq.sum() == 1.0
    assert freq[0] == 0.0
    np.testing.assert_allclose(freq, values / values.sum(), atol=0.03)


def test_stochastic_cpu_draws_repeat_with_the_seed():
    x = np.random.default_rng(8).uniform(0, 1, (2, 3, 6, 6))
    runs = []
    for _ in range(2):
        caffe.set_random_seed(5)
        runs.append(_setup("pool: STOCHASTIC kernel_size: 3 stride: 2", x)[2][0].data.copy())
    np.testing.assert_array_equal(runs[0], runs[1])


# -- GPU ------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,body", [(c[0], c[1]) for c in ND_CASES])
def test_nd_cpu_gpu_agree(shape, body, method, dtype):
    x = np.random.default_rng(9).permutation(np.prod(shape)).reshape(shape) / 11.0
    assert_cpu_gpu_agree(pool_text(f"pool: {method} {body}"), [x], ntop=2 if method == "MAX" else 1,
                         propagate=[True], dtype=dtype, rtol=1e-5 if dtype == np.float32 else 1e-9,
                         atol=1e-8 if dtype == np.float32 else 1e-11)  # float32: window sums in another order


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stochastic_test_phase_cpu_gpu_agree(dtype):
    x = np.abs(np.random.default_rng(10).standard_normal((2, 3, 7, 6)))
    text = pool_text("pool: STOCHASTIC kernel_size: 3 stride: 2", "TEST")
    outs = []
    for gpu in (False, True):
        caffe.set_mode_gpu() if gpu else caffe.set_mode_cpu()
        try:
            layer = make_layer(text, dtype)
            bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
            layer.setup(bottom, top)
            layer.forward(bottom, top)
            outs.append(top[0].cpu_data().copy())
        finally:
            caffe.set_mode_cpu()
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5 if dtype == np.float32 else 1e-12)
