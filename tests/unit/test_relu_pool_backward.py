"""ReLU (in place) -> MAX pooling runs its backward as one on the GPU (runtime/fusion.py's
ReLUMaxPool): every blob's data and diff and every param gradient equal the layers' own, with
overlapping windows (3x3 stride 2, several windows choosing one input) and without (2x2 stride 2)."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.runtime.fusion import ReLUMaxPool, find_backward_fusions
from pycaffe_lite.testing.nets import assert_nets_match, fused_and_plain

NET = """
name: "rp"
input: "data"
input_shape {{ dim: 2 dim: 3 dim: 11 dim: 13 }}
force_backward: true
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 weight_filler {{ type: "gaussian" std: 0.5 }}
                             bias_filler {{ type: "gaussian" }} }} }}
layer {{ name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }}
layer {{ name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param {{ pool: MAX kernel_size: {k} stride: 2 }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "pool1" top: "ip"
        inner_product_param {{ num_output: 3 weight_filler {{ type: "gaussian" }} }} }}
"""


@pytest.mark.parametrize("k", [2, 3])
def test_relu_pool_backward_equals_layers(tmp_path, mode, k):
    path = tmp_path / "rp.prototxt"
    path.write_text(NET.format(k=k))
    fused, plain = nets = fused_and_plain(lambda: caffe.Net(str(path), caffe.TRAIN, dtype=np.float64), seed=5)
    chains = find_backward_fusions(fused.executor.net)
    assert [(type(c), fused._layer_names[c.first], fused._layer_names[c.last]) for c in chains] == [
        (ReLUMaxPool, "relu1", "pool1")]
    rng = np.random.default_rng(2)
    x, g = rng.standard_normal((2, 3, 11, 13)), rng.standard_normal((2, 3))
    for _ in range(3):  # warm-up, capture, replay on the GPU
        for net in nets:
            net.clear_param_diffs()
            net.forward(data=x)
            net.backward(ip=g)
        assert_nets_match(fused, plain, rtol=1e-12, atol=1e-14)
    assert (fused.blobs["conv1"].data == 0).any() and fused.blobs["conv1"].diff.any()
