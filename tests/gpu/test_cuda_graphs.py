"""CUDA graph replay of net ranges gives exactly what eager execution gives."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe

pytestmark = pytest.mark.gpu

NET = """
name: "g"
input: "data"
input_shape { dim: 4 dim: 6 }
force_backward: true
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" loss_weight: 1
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
"""


@pytest.fixture
def nets(tmp_path, gpu_mode):
    path = tmp_path / "g.prototxt"
    path.write_text(NET)
    caffe.set_random_seed(3)
    graphed = caffe.Net(str(path), caffe.TRAIN)
    eager = caffe.Net(str(path), caffe.TRAIN)
    eager.executor.use_graphs = False
    for name, blobs in graphed.params.items():
        for a, b in zip(blobs, eager.params[name]):
            b.data[...] = a.data
    return graphed, eager


def run(net, x):
    net.blobs["data"].data[...] = x
    loss = net.forward_from_to(0, len(net.layers) - 1)
    net.clear_param_diffs()
    net.backward_from_to(len(net.layers) - 1, 0)
    return loss, net.blobs["ip2"].data.copy(), net.blobs["data"].diff.copy(), net.params["ip1"][0].diff.copy()


def test_replay_matches_eager_and_follows_new_inputs(nets):
    graphed, eager = nets
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.standard_normal((4, 6)).astype(np.float32)
        got, want = run(graphed, x), run(eager, x)
        assert got[0] == pytest.approx(want[0], rel=1e-5)
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert eager.executor.replays == 0
    # Once warm (first calls allocate, which retires earlier keys), every call is two replays.
    before = graphed.executor.replays
    assert before > 0
    for _ in range(3):
        x = rng.standard_normal((4, 6)).astype(np.float32)
        got, want = run(graphed, x), run(eager, x)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    assert graphed.executor.fallbacks == []
    assert graphed.executor.replays == before + 6, graphed.executor.captures


def test_reshape_and_weight_change_are_seen(nets):
    graphed, eager = nets
    rng = np.random.default_rng(1)
    for batch in (4, 4, 4, 7, 7, 7, 4, 4):
        for net in (graphed, eager):
            net.blobs["data"].reshape(batch, 6)
        x = rng.standard_normal((batch, 6)).astype(np.float32)
        graphed.params["ip2"][0].data[...] *= 1.01  # host-side weight edits reach the replay
        eager.params["ip2"][0].data[...] *= 1.01
        got, want = run(graphed, x), run(eager, x)
        assert got[1].shape == (batch, 3)
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_host_side_layers_are_not_captured(tmp_path, gpu_mode):
    """A layer that computes on the host in GPU mode (DummyData refills on the host) runs every call."""
    path = tmp_path / "d.prototxt"
    path.write_text(
        'layer { name: "d" type: "DummyData" top: "x" dummy_data_param { shape { dim: 3 dim: 4 } '
        'data_filler { type: "gaussian" } } }\n'
        'layer { name: "r" type: "ReLU" bottom: "x" top: "y" }\n'
    )
    net = caffe.Net(str(path), caffe.TEST)
    outs = [net.forward()["y"].copy() for _ in range(5)]
    assert all(not np.array_equal(outs[i], outs[i + 1]) for i in range(4))
    np.testing.assert_array_equal(outs[-1], np.maximum(net.blobs["x"].data, 0))
