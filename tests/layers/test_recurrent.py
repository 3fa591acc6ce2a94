"""RNN and LSTM (BVLC's unrolled recurrent layers): forward against a step-by-step numpy reference
written from the equations, cont resets, the state carried across forwards, static input,
expose_hidden, BVLC's param layout (weights load by layer name from a caffemodel), gradient checks
on CPU and GPU, errors, CPU-vs-GPU agreement and a net that trains."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer

T, N, K, KS, D = 3, 2, 4, 3, 5
RNG = np.random.default_rng(7)
X = RNG.standard_normal((T, N, K))
XS = RNG.standard_normal((N, KS))
CONT = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0]])  # stream 1 restarts at step 3
H0 = RNG.standard_normal((1, N, D))
C0 = RNG.standard_normal((1, N, D))


def text(kind, expose=False, name="rec"):
    return (f'name: "{name}" type: "{kind}" recurrent_param {{ num_output: {D} expose_hidden: {str(expose).lower()} '
            'weight_filler { type: "gaussian" std: 0.4 } bias_filler { type: "uniform" min: -0.5 max: 0.5 } }')


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def rnn_reference(params, x, cont, h, static=None):
    if static is None:
        w_xh, b_h, w_hh, w_ho, b_o = params
    else:
        w_xh, b_h, w_s, w_hh, w_ho, b_o = params
    outs = []
    for t in range(x.shape[0]):
        h = h * cont[t][:, None]
        pre = h @ w_hh.T + x[t] @ w_xh.T + b_h
        if static is not None:
            pre = pre + static @ w_s.T
        h = np.tanh(pre)
        outs.append(np.tanh(h @ w_ho.T + b_o))
    return np.stack(outs), h


def lstm_reference(params, x, cont, h, c, static=None):
    if static is None:
        w_xc, b_c, w_hc = params
    else:
        w_xc, b_c, w_s, w_hc = params
    outs = []
    for t in range(x.shape[0]):
        keep = cont[t][:, None]
        gates = (h * keep) @ w_hc.T + x[t] @ w_xc.T + b_c
        if static is not None:
            gates = gates + static @ w_s.T
        i, f, o, g = (gates[:, k * D:(k + 1) * D] for k in range(4))
        c = sigmoid(f) * keep * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        outs.append(h)
    return np.stack(outs), h, c


def params_of(layer):
    return [b.cpu_data().copy() for b in layer.blobs]


def setup(kind, arrays, ntop=1, expose=False):
    caffe.set_random_seed(3)
    layer = make_layer(text(kind, expose))
    bottom, top = blobs(arrays), empty_blobs(ntop)
    layer.setup(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("static", [False, True])
def test_rnn_forward_and_carried_state(mode, static):
    arrays = [X, CONT] + ([XS] if static else [])
    layer, bottom, top = setup("RNN", arrays)
    p = params_of(layer)
    assert [a.shape for a in p] == [(D, K), (D,)] + ([(D, KS)] if static else []) + [(D, D), (D, D), (D,)]
    layer.forward(bottom, top)
    want, h_last = rnn_reference(p, X, CONT, np.zeros((N, D)), XS if static else None)
    np.testing.assert_allclose(top[0].cpu_data(), want, rtol=1e-10, atol=1e-12)
    # second forward with all cont 1: starts from the last forward's final state
    cont1 = np.ones((T, N))
    bottom[1].mutable_cpu_data()[...] = cont1
    layer.forward(bottom, top)
    want2, _ = rnn_reference(p, X, cont1, h_last, XS if static else None)
    np.testing.assert_allclose(top[0].cpu_data(), want2, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("static", [False, True])
def test_lstm_forward_and_carried_state(mode, static):
    arrays = [X, CONT] + ([XS] if static else [])
    layer, bottom, top = setup("LSTM", arrays)
    p = params_of(layer)
    assert [a.shape for a in p] == [(4 * D, K), (4 * D,)] + ([(4 * D, KS)] if static else []) + [(4 * D, D)]
    layer.forward(bottom, top)
    zero = np.zeros((N, D))
    want, h_last, c_last = lstm_reference(p, X, CONT, zero, zero, XS if static else None)
    np.testing.assert_allclose(top[0].cpu_data(), want, rtol=1e-10, atol=1e-12)
    cont1 = np.ones((T, N))
    bottom[1].mutable_cpu_data()[...] = cont1
    layer.forward(bottom, top)
    want2, _, _ = lstm_reference(p, X, cont1, h_last, c_last, XS if static else None)
    np.testing.assert_allclose(top[0].cpu_data(), want2, rtol=1e-10, atol=1e-12)


def test_cont_reset_isolates_sequences(mode):
    """Changing x before a reset (cont 0) does not change the outputs after it."""
    layer, bottom, top = setup("LSTM", [X, CONT])
    layer.forward(bottom, top)
    before = top[0].cpu_data().copy()
    layer2, bottom2, top2 = setup("LSTM", [X, CONT])
    bottom2[0].mutable_cpu_data()[:2, 1] += 1.0  # stream 1, steps 1-2; step 3 has cont 0
    layer2.forward(bottom2, top2)
    after = top2[0].cpu_data()
    np.testing.assert_allclose(after[2, 1], before[2, 1], rtol=1e-12)
    assert not np.allclose(after[1, 1], before[1, 1])
    np.testing.assert_allclose(after[:, 0], before[:, 0], rtol=1e-12)


def test_expose_hidden(mode):
    cont1 = np.ones((T, N))
    layer, bottom, top = setup("LSTM", [X, cont1, H0, C0], ntop=3, expose=True)
    layer.forward(bottom, top)
    want, h_last, c_last = lstm_reference(params_of(layer), X, cont1, H0[0], C0[0])
    np.testing.assert_allclose(top[0].cpu_data(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(top[1].cpu_data(), h_last[None], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(top[2].cpu_data(), c_last[None], rtol=1e-10, atol=1e-12)
    layer.forward(bottom, top)  # no carried state: the same again
    np.testing.assert_allclose(top[0].cpu_data(), want, rtol=1e-10, atol=1e-12)
    rnn, bottom, top = setup("RNN", [X, cont1, XS, H0], ntop=2, expose=True)
    rnn.forward(bottom, top)
    want, h_last = rnn_reference(params_of(rnn), X, cont1, H0[0], XS)
    np.testing.assert_allclose(top[0].cpu_data(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(top[1].cpu_data(), h_last[None], rtol=1e-10, atol=1e-12)
    for t in top:
        t.mutable_cpu_diff()[...] = 1.0
    bottom[3].mutable_cpu_diff()[...] = 7.0
    rnn.backward(top, [True, False, True, True], bottom)
    assert not bottom[3].cpu_diff().any()  # as BVLC: no gradient reaches h0


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.slow
def test_gradient(mode, kind, static):
    cont = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    arrays = [X, cont] + ([XS] if static else [])
    caffe.set_random_seed(5)
    layer = make_layer(text(kind))
    GradientChecker(1e-4, 1e-6).check(layer, blobs(arrays), empty_blobs(1),
                                      check_bottom=[0, 2] if static else [0])


@pytest.mark.slow
def test_gradient_expose_hidden(mode):
    caffe.set_random_seed(5)
    layer = make_layer(text("LSTM", expose=True))
    GradientChecker(1e-4, 1e-6).check(layer, blobs([X, np.ones((T, N)), H0, C0]), empty_blobs(3),
                                      check_bottom=[0], top_filter=lambda k: k == 0)


def test_batch_size_may_change_time_steps_may_not(mode):
    layer, bottom, top = setup("LSTM", [X, CONT])
    layer.forward(bottom, top)
    bottom = blobs([X[:, :1], CONT[:, :1]])
    layer.forward(bottom, top)
    want, _, _ = lstm_reference(params_of(layer), X[:, :1], CONT[:, :1], np.zeros((1, D)), np.zeros((1, D)))
    np.testing.assert_allclose(top[0].cpu_data(), want, rtol=1e-10, atol=1e-12)
    with pytest.raises(NetError, match="time steps"):
        layer.forward(blobs([X[:2], CONT[:2]]), top)


@pytest.mark.slow
def test_errors():
    with pytest.raises(NetError, match="cont"):
        setup("LSTM", [X, CONT[:, :1]])
    with pytest.raises(NetError, match="num_output"):
        layer = make_layer('type: "RNN" recurrent_param { num_output: 0 }')
        layer.setup(blobs([X, CONT]), empty_blobs(1))
    with pytest.raises(NetError, match="bottom blobs"):
        setup("LSTM", [X, CONT, H0], ntop=3, expose=True)
    with pytest.raises(NetError, match="top blob"):
        setup("LSTM", [X, CONT], ntop=2)
    with pytest.raises(NetError, match="c_0"):
        setup("LSTM", [X, CONT, H0, C0[:, :1]], ntop=3, expose=True)
    layer, bottom, top = setup("RNN", [X, CONT])
    layer.forward(bottom, top)
    with pytest.raises(NetError, match="continuation"):
        layer.backward(top, [True, True], bottom)
    assert layer.allow_force_backward(1) is False and layer.allow_force_backward(0)


NET = """
name: "seq"
layer { name: "in" type: "Input" top: "x" top: "cont" top: "target"
        input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } shape { dim: 3 dim: 2 dim: 5 } } }
layer { name: "lstm1" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
        recurrent_param { num_output: 5 weight_filler { type: "uniform" min: -0.3 max: 0.3 }
                          bias_filler { type: "constant" value: 0 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "target" top: "loss" }
"""


def test_caffemodel_layout_and_training(tmp_path, mode):
    """BVLC's layout: one layer 'lstm1' holding W_xc, b_c, W_hc; a weights file written in that
    layout loads; SGD on the net lowers the loss."""
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    net = caffe.Net(str(path), caffe.TRAIN)
    assert [b.data.shape for b in net.params["lstm1"]] == [(20, 4), (20,), (20, 5)]
    model = caffe_pb2.NetParameter(name="seq")
    lp = model.layer.add(name="lstm1", type="LSTM")
    values = [RNG.standard_normal(s) * 0.3 for s in [(20, 4), (20,), (20, 5)]]
    for v in values:
        blob = lp.blobs.add()
        blob.shape.dim.extend(v.shape)
        blob.data.extend(v.ravel().tolist())
    (tmp_path / "w.caffemodel").write_bytes(model.SerializeToString())
    net.copy_from(str(tmp_path / "w.caffemodel"))
    for b, v in zip(net.params["lstm1"], values):
        np.testing.assert_allclose(b.data, v, rtol=1e-6)
    x, target = RNG.standard_normal((3, 2, 4)), RNG.uniform(-0.5, 0.5, (3, 2, 5))
    cont = np.array([[0, 0], [1, 1], [1, 1]], float)
    losses = []
    for _ in range(30):
        net.blobs["x"].data[...] = x
        net.blobs["cont"].data[...] = cont
        net.blobs["target"].data[...] = target
        losses.append(float(net.forward()["loss"]))
        net.clear_param_diffs()
        net.backward()
        for b in net.params["lstm1"]:
            b.data[...] -= 0.5 * b.diff
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_cpu_gpu_agree(kind):
    assert_cpu_gpu_agree(text(kind), [X, CONT, XS], propagate=[True, False, True])
    assert_cpu_gpu_agree(text(kind, expose=True),
                         [X, np.ones((T, N)), H0] + ([C0] if kind == "LSTM" else []),
                         ntop=2 if kind == "RNN" else 3, propagate=[True, False, False] + [False] * (kind == "LSTM"),
                         dtype=np.float32, rtol=1e-4, atol=1e-5)


CHAIN = """
layer { name: "in" type: "Input" top: "x" top: "cont"
        input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } } }
layer { name: "lstm1" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
        recurrent_param { num_output: 5 weight_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "a" type: "TanH" bottom: "h" top: "a" }
layer { name: "b" type: "TanH" bottom: "a" top: "b" }
layer { name: "c" type: "TanH" bottom: "b" top: "c" }
layer { name: "out" type: "TanH" bottom: "c" top: "out" }
"""


def test_reading_blobs_of_a_test_net_does_not_advance_the_state(tmp_path):
    """A TEST net's memory sharing may re-run a forward when a user reads an overwritten blob; with
    a recurrent layer that would advance its carried state, so such nets keep their blobs apart."""
    (tmp_path / "chain.prototxt").write_text(CHAIN)
    outs = []
    for read_between in (False, True):
        caffe.set_random_seed(8)
        net = caffe.Net(str(tmp_path / "chain.prototxt"), caffe.TEST)
        net.forward(x=X.astype(np.float32), cont=np.ones((T, N), np.float32))  # continues the zero state
        if read_between:
            assert np.isfinite(net.blobs["a"].data).all()
        outs.append(net.forward(x=X.astype(np.float32), cont=np.ones((T, N), np.float32))["out"].copy())
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_one_forward_of_T_steps_equals_T_forwards_of_one_step(mode, kind):
    """As BVLC's test: the state carried between forwards continues a sequence exactly."""
    cont = np.array([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    whole, bottom, top = setup(kind, [X, cont])
    whole.forward(bottom, top)
    want = top[0].cpu_data().copy()
    step, sb, st = setup(kind, [X[:1], cont[:1]])
    for mine, theirs in zip(step.blobs, whole.blobs):
        mine.mutable_cpu_data()[...] = theirs.cpu_data()
    for t in range(T):
        sb[0].mutable_cpu_data()[...] = X[t:t + 1]
        sb[1].mutable_cpu_data()[...] = cont[t:t + 1]
        step.forward(sb, st)
        np.testing.assert_allclose(st[0].cpu_data()[0], want[t], rtol=1e-10, atol=1e-12)


def test_debug_info_logs_the_unrolled_layers(caplog):
    import logging

    layer = make_layer(text("RNN").replace("expose_hidden: false", "debug_info: true"))
    bottom, top = blobs([X, CONT]), empty_blobs(1)
    layer.setup(bottom, top)
    assert layer.traits.graph_safe is False  # its logging reads values on the host
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        layer.forward(bottom, top)
        top[0].mutable_cpu_diff()[...] = 1
        layer.backward(top, [True, False], bottom)
    msgs = [r.getMessage() for r in caplog.records]
    assert any("[Forward] Layer rec_o_concat, top blob o data:" in m for m in msgs)
    assert any("[Backward] Layer rec_x_transform, bottom blob x diff:" in m for m in msgs)


def test_share_with_reaches_every_time_step(tmp_path):
    """Net.share_with (how a solver's test net gets the trained weights) swaps the owners' memory;
    the copies used by later time steps follow (BVLC re-shares them in forward)."""
    (tmp_path / "chain.prototxt").write_text(CHAIN)
    caffe.set_random_seed(1)
    train = caffe.Net(str(tmp_path / "chain.prototxt"), caffe.TRAIN)
    caffe.set_random_seed(2)
    test = caffe.Net(str(tmp_path / "chain.prototxt"), caffe.TEST)
    test.share_with(train)
    train.params["lstm1"][2].data[...] = RNG.uniform(-0.5, 0.5, train.params["lstm1"][2].data.shape)
    inputs = dict(x=X.astype(np.float32), cont=np.ones((T, N), np.float32))
    np.testing.assert_array_equal(test.forward(**inputs)["out"], train.forward(**inputs)["out"])


def test_weights_embedded_in_the_layer_definition():
    from pycaffe_lite.layer import create_layer
    from pycaffe_lite.testing.layer_testing import layer_param

    param = layer_param(text("RNN"))
    values = [RNG.standard_normal(s) for s in [(D, K), (D,), (D, D), (D, D), (D,)]]
    for v in values:
        proto = param.blobs.add()
        proto.shape.dim.extend(v.shape)
        proto.double_data.extend(v.ravel().tolist())
    layer = create_layer(param, np.float64)
    layer.setup(blobs([X, CONT]), empty_blobs(1))
    for blob, v in zip(layer.blobs, values):
        np.testing.assert_array_equal(blob.cpu_data(), v)
    del param.blobs[-1]
    with pytest.raises(NetError, match="has 4 param blobs, expected 5"):
        create_layer(param, np.float64).setup(blobs([X, CONT]), empty_blobs(1))
