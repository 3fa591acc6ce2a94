"""Shared gradient buffers: the plan never puts two live diffs in one buffer, and training with
shared diffs gives exactly the weights of training without."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.runtime.memory_plan import shared_diff_slots
from pycaffe_lite.schema import caffe_pb2

NET = """
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 3 dim: 8 dim: 8 } shape { dim: 4 }
                     data_filler { type: "gaussian" } data_filler { type: "constant" value: 1 } } }
layer { name: "c1" type: "Convolution" bottom: "data" top: "c1"
        convolution_param { num_output: 6 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 6 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "r2" type: "ReLU" bottom: "c2" top: "c2" }
layer { name: "sum" type: "Eltwise" bottom: "c1" bottom: "c2" top: "sum" }
layer { name: "pool" type: "Pooling" bottom: "sum" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def _net_param() -> caffe_pb2.NetParameter:
    return parse_text(NET, caffe_pb2.NetParameter())


def test_no_two_live_diffs_share_a_slot():
    net = caffe.Net(_net_param(), caffe.TRAIN)
    slots = [(nbytes, [b for group in groups for b in group]) for nbytes, groups in shared_diff_slots(net.graph)]
    assert slots and sum(len(m) for _, m in slots) > len(slots)  # some sharing happens
    layers = len(net.layers)
    span = {}
    for k in range(layers):
        for bid in net.bottom_id_vecs[k] + net.top_id_vecs[k]:
            lo, hi = span.get(bid, (k, k))
            span[bid] = (min(lo, k), max(hi, k))
    for nbytes, members in slots:
        assert all(net._blobs[b].count * net._blobs[b].dtype.itemsize <= nbytes for b in members)
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                (alo, ahi), (blo, bhi) = span[a], span[b]
                assert ahi < blo or bhi < alo, (net._blob_names[a], net._blob_names[b])
    kept = {net._blob_names[b] for _, m in slots for b in m}
    assert "loss" not in kept and "data" not in kept and "label" not in kept


@pytest.mark.gpu
def test_training_with_shared_diffs_equals_without(monkeypatch, gpu_mode):
    weights = {}
    for share in ("1", "0"):
        with caffe.using_config(share_diffs=share == "1"):
            sp = caffe_pb2.SolverParameter(base_lr=0.05, lr_policy="fixed", momentum=0.9, max_iter=100, display=0,
                                           random_seed=5, type="SGD")
            sp.net_param.CopyFrom(_net_param())
            solver = caffe.get_solver(sp, progress=False)
            solver.step(8)
            assert solver.net.executor.replays >= 5
            assert bool(solver.net.executor.shared_diffs.slots) == (share == "1")
        weights[share] = {n: [b.data.copy() for b in bs] for n, bs in solver.net.params.items()}
    for name, blobs in weights["1"].items():
        for a, b in zip(blobs, weights["0"][name]):
            np.testing.assert_array_equal(a, b)
