"""Per-layer Net hooks on a CPU net, solver callbacks as objects, and gradient bucket planning."""

from __future__ import annotations

import numpy as np

import pycaffe_lite as caffe
from pycaffe_lite.parallel.multi_gpu import bucket_layout, plan_buckets, ready_layers
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.solvers import sgd_solvers

NET = """
  name: "mlp"
  layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
  layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "h"
          param { name: "shared_w" } inner_product_param { num_output: 3 weight_filler { type: "gaussian" } } }
  layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }
  layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "h2"
          param { name: "shared_w" } inner_product_param { num_output: 3 weight_filler { type: "gaussian" } } }
  layer { name: "ip3" type: "InnerProduct" bottom: "h2" top: "out" loss_weight: 1
          inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
"""


def solver():
    caffe.set_mode_cpu()
    param = parse_text(f'net_param {{ {NET} }} base_lr: 0.1 lr_policy: "fixed" random_seed: 1',
                       caffe_pb2.SolverParameter())  # seeded: unlucky weights can zero every ReLU
    s = sgd_solvers.SOLVERS["SGD"](param, dtype=np.float64, progress=False)
    s.net.blobs["data"].data[...] = np.random.default_rng(0).normal(size=(2, 3))
    return s


def test_hooks_run_in_layer_order_around_each_pass():
    s = solver()
    net = s.net
    events = []
    for kind in ("before_forward", "after_forward", "before_backward", "after_backward"):
        getattr(net, kind)(lambda i, kind=kind: events.append((kind, i)))
    s.add_callback(lambda: events.append(("start", -1)), lambda: events.append(("ready", -1)))
    s.step(1)
    n = len(net.layers)
    forward = [(k, i) for i in range(n) for k in ("before_forward", "after_forward")]
    backward = [(k, i) for i in reversed(range(n)) for k in ("before_backward", "after_backward")]
    assert events == [("start", -1), *forward, *backward, ("ready", -1)]


def test_after_backward_sees_the_layers_gradient():
    s = solver()
    seen = {}
    net = s.net
    ip3 = list(net._layer_names).index("ip3")
    net.after_backward(lambda i: seen.setdefault(i, net.layers[i].blobs[0].diff.copy() if net.layers[i].blobs else None))
    net.forward()
    net.backward()
    assert np.abs(seen[ip3]).sum() > 0
    np.testing.assert_array_equal(seen[ip3], net.layers[ip3].blobs[0].diff)


def test_callback_object_and_graph_safety(monkeypatch):
    s = solver()
    calls = []

    class Sync:
        def on_start(self):
            calls.append("start")

        def on_gradients_ready(self):
            calls.append("ready")

    s.add_callback(Sync())
    s.step(2)
    assert calls == ["start", "ready"] * 2
    monkeypatch.setattr(s.net.executor, "can_replay_iteration", lambda: True)
    assert not s._replayed.possible()  # a plain Python callback runs host code mid-way

    safe = solver()
    monkeypatch.setattr(safe.net.executor, "can_replay_iteration", lambda: True)

    def noop():
        pass

    noop.graph_safe = True
    safe.add_callback(noop, noop)
    assert safe._replayed.possible()


def test_hooks_keep_passes_out_of_graphs():
    s = solver()
    ex = s.net.executor
    monkeypatch_on_gpu = ex._on_gpu
    ex._on_gpu = lambda: True
    try:
        s.net.after_backward(lambda i: None)
        assert not ex._capturable(1, len(s.net.layers) - 1)
    finally:
        ex._on_gpu = monkeypatch_on_gpu


def test_ready_layers_with_shared_params():
    net = solver().net
    names = list(net._layer_names)
    ready = ready_layers(net)
    # learnable params: shared_w (ip1 & ip2), ip1 bias, ip2 bias, ip3 weight, ip3 bias
    assert len(ready) == 5
    assert ready[0] == names.index("ip1")  # the shared weight is final after ip1 (backward reaches it last)
    assert ready[3] == names.index("ip3")


def test_plan_buckets_in_backward_order_at_layer_boundaries():
    ready = [1, 1, 3, 3, 5, 5, 5]
    nbytes = [10, 1, 40, 4, 30, 30, 3]
    assert plan_buckets(ready, nbytes, cap=50) == [(5, [4, 5, 6]), (1, [2, 3, 0, 1])]
    assert plan_buckets(ready, nbytes, cap=100) == [(3, [4, 5, 6, 2, 3]), (1, [0, 1])]
    assert plan_buckets(ready, nbytes, cap=1) == [(5, [4, 5, 6]), (3, [2, 3]), (1, [0, 1])]
    assert plan_buckets(ready, nbytes, cap=10**9) == [(1, [4, 5, 6, 2, 3, 0, 1])]
    assert plan_buckets([], [], cap=1) == []
    every = sorted(p for _, ps in plan_buckets(ready, nbytes, cap=35) for p in ps)
    assert every == list(range(len(ready)))


def test_bucket_layout_aligns_every_param():
    offsets, total = bucket_layout([1, 64, 65, 0, 3], align=64)
    assert offsets == [0, 64, 128, 256, 256] and total == 320
    assert bucket_layout([], align=64) == ([], 0)
    assert bucket_layout([5, 7], align=1) == ([0, 5], 12)


def test_buckets_split_by_gradient_type():
    """A half net's buckets reduce each gradient type in its own collective: a bucket holding
    fp16 and float32 gradients becomes two, in order, each of one type."""
    from pycaffe_lite.parallel.multi_gpu import split_by_dtype
    half, full = np.dtype(np.float16), np.dtype(np.float32)
    dtypes = [half, full, half, half, full]
    assert split_by_dtype([(4, [4, 3]), (1, [2, 1, 0])], dtypes) == [(4, [4]), (4, [3]), (1, [2, 0]), (1, [1])]
    assert split_by_dtype([(-1, [0, 2, 3])], dtypes) == [(-1, [0, 2, 3])]
