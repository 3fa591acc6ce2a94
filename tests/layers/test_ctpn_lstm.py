"""CTPN's Lstm (type "Lstm", lstm_param): forward against a per-stream loop of the fork's
equations, with and without the clip bottom (carried state), the gradient bound, gradient checks
on CPU and GPU, errors, CPU-vs-GPU agreement, and CTPN's bidirectional pattern with Reverse."""

import math

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

T, N, I, H = 4, 2, 3, 3
RNG = np.random.default_rng(21)
X = RNG.standard_normal((T, N, I))
CLIP = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])


def text(limit=0.0):
    return (f'name: "lstm" type: "Lstm" lstm_param {{ num_output: {H} clipping_threshold: {limit} '
            'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "uniform" min: -0.5 max: 0.5 } }')


def sig(v):
    return 1 / (1 + math.exp(-v))


def reference(w_i, w_h, b, x, clip=None, h0=None, c0=None):
    out = np.zeros((T, N, H))
    h_last, c_last = np.zeros((N, H)), np.zeros((N, H))
    for n in range(N):
        h = np.zeros(H) if h0 is None else h0[n]
        c = np.zeros(H) if c0 is None else c0[n]
        for t in range(T):
            cl = clip[t, n] if clip is not None else float(t > 0)
            a = w_i @ x[t, n] + b + cl * (w_h @ h)
            new_c = np.zeros(H)
            new_h = np.zeros(H)
            for d in range(H):
                i, f, o = sig(a[d]), sig(a[H + d]), sig(a[2 * H + d])
                g = math.tanh(a[3 * H + d])
                new_c[d] = cl * f * c[d] + i * g
                new_h[d] = o * math.tanh(new_c[d])
            h, c = new_h, new_c
            out[t, n] = h
        h_last[n], c_last[n] = h, c
    return out, h_last, c_last


def test_forward_without_clip(mode):
    layer, bottom, top = run_layer(text(), [X])
    w_i, w_h, b = (p.cpu_data() for p in layer.blobs)
    assert (w_i.shape, w_h.shape, b.shape) == ((4 * H, I), (4 * H, H), (4 * H,))
    np.testing.assert_allclose(top[0].cpu_data(), reference(w_i, w_h, b, X)[0], rtol=1e-10, atol=1e-12)
    layer.forward(bottom, top)  # no clip: every forward starts from zeros
    np.testing.assert_allclose(top[0].cpu_data(), reference(w_i, w_h, b, X)[0], rtol=1e-10, atol=1e-12)


def test_forward_with_clip_carries_state(mode):
    caffe.set_random_seed(1)
    layer = make_layer(text())
    bottom, top = blobs([X, CLIP]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    w_i, w_h, b = (p.cpu_data() for p in layer.blobs)
    want, h_last, c_last = reference(w_i, w_h, b, X, CLIP)
    np.testing.assert_allclose(top[0].cpu_data(), want, rtol=1e-10, atol=1e-12)
    ones = np.ones((T, N))
    bottom[1].mutable_cpu_data()[...] = ones
    layer.forward(bottom, top)
    want2, _, _ = reference(w_i, w_h, b, X, ones, h_last, c_last)
    np.testing.assert_allclose(top[0].cpu_data(), want2, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("with_clip", [False, True])
def test_gradient(mode, with_clip):
    caffe.set_random_seed(2)
    arrays = [X] + ([CLIP] if with_clip else [])
    GradientChecker(1e-4, 1e-6).check(make_layer(text()), blobs(arrays), empty_blobs(1), check_bottom=[0])


def test_gradient_bound(mode):
    """With a tiny clipping_threshold the bias gradient (the sum of the gate-input gradients) is
    at most T*N*threshold per entry, and the unbounded one is larger."""
    limit = 1e-3
    caffe.set_random_seed(4)
    free, _, _ = run_layer(text(), [X * 3], seed=4)
    bounded, _, _ = run_layer(text(limit), [X * 3], seed=4)
    db_free = free.blobs[2].cpu_diff() - 0.25
    db_bounded = bounded.blobs[2].cpu_diff() - 0.25
    assert np.abs(db_bounded).max() <= T * N * limit * (1 + 1e-9)
    assert np.abs(db_free).max() > T * N * limit


def test_errors():
    with pytest.raises(NetError, match="num_output"):
        make_layer('type: "Lstm" lstm_param { num_output: 0 }').setup(blobs([X]), empty_blobs(1))
    with pytest.raises(NetError, match="clip"):
        run_layer(text(), [X, CLIP[:, :1]])
    with pytest.raises(NetError, match="continuation"):
        run_layer(text(), [X, CLIP], propagate=[True, True])
    layer, bottom, top = run_layer(text(), [X])
    with pytest.raises(NetError, match="3 inputs per step"):
        layer.forward(blobs([np.zeros((T, N, I + 1))]), top)


BIDI = """
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 4 dim: 2 dim: 3 } } }
layer { name: "lstm" type: "Lstm" bottom: "x" top: "fwd"
        lstm_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "rev1" type: "Reverse" bottom: "x" top: "xr" reverse_param { axis: 0 } }
layer { name: "rlstm" type: "Lstm" bottom: "xr" top: "bwd_r"
        lstm_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "rev2" type: "Reverse" bottom: "bwd_r" top: "bwd" reverse_param { axis: 0 } }
layer { name: "merge" type: "Concat" bottom: "fwd" bottom: "bwd" top: "out" concat_param { axis: 2 } }
"""


def test_ctpn_bidirectional_pattern(tmp_path, mode):
    (tmp_path / "bidi.prototxt").write_text(BIDI)
    net = caffe.Net(str(tmp_path / "bidi.prototxt"), caffe.TEST, dtype=np.float64)
    out = net.forward(x=X)["out"]
    assert out.shape == (T, N, 2 * H)
    fwd = reference(*(b.data for b in net.params["lstm"]), X)[0]
    bwd = reference(*(b.data for b in net.params["rlstm"]), X[::-1])[0][::-1]
    np.testing.assert_allclose(out[:, :, :H], fwd, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out[:, :, H:], bwd, rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
def test_cpu_gpu_agree():
    assert_cpu_gpu_agree(text(), [X])
    assert_cpu_gpu_agree(text(), [X, CLIP], propagate=[True, False])
    assert_cpu_gpu_agree(text(0.05), [X * 3], dtype=np.float32, rtol=1e-4, atol=1e-5)


def test_net_spec_shorthand():
    """net_spec's shorthand fills lstm_param for CTPN's Lstm; BVLC's LSTM takes recurrent_param."""
    from pycaffe_lite.net_spec import NetSpec
    from pycaffe_lite.net_spec import layers as L

    n = NetSpec()
    n.x, n.cont = L.Input(shape=[dict(dim=[T, N, I]), dict(dim=[T, N])], ntop=2)
    n.ctpn = L.Lstm(n.x, num_output=H, clipping_threshold=1)
    n.bvlc = L.LSTM(n.x, n.cont, recurrent_param=dict(num_output=H))
    layers = {lp.name: lp for lp in n.to_proto().layer}
    assert layers["ctpn"].lstm_param.num_output == H and layers["ctpn"].lstm_param.clipping_threshold == 1
    assert layers["bvlc"].recurrent_param.num_output == H
