"""Eltwise SUM -> ReLU (in place) (-> Split) runs as one pass each way on the GPU (runtime/fusion.py's
SumReLU): every blob's data and diff and every param gradient equal the layers' own, with and
without the Split (the summed blob read once or twice), with coefficients, and with a bottom that
needs no gradient. On the CPU the chain is found and the layers run as written."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.runtime.fusion import SumReLU
from pycaffe_lite.testing.nets import assert_nets_match, fused_and_plain

NET = """
name: "sr"
input: "data"
input_shape {{ dim: 2 dim: 3 dim: 7 dim: 9 }}
input: "side"
input_shape {{ dim: 2 dim: 4 dim: 7 dim: 9 }}
layer {{ name: "a" type: "Convolution" bottom: "data" top: "a"
        convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
layer {{ name: "b" type: "Convolution" bottom: "data" top: "b"
        convolution_param {{ num_output: 4 kernel_size: 1 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
layer {{ name: "sum" type: "Eltwise" bottom: "a" bottom: "{second}" top: "sum" eltwise_param {{ {coeff} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "sum" top: "sum" }}
layer {{ name: "c" type: "Convolution" bottom: "sum" top: "c" loss_weight: 1
        convolution_param {{ num_output: 2 kernel_size: 1 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
{twice}
"""
TWICE = """layer { name: "d" type: "Convolution" bottom: "sum" top: "d" loss_weight: 0.5
        convolution_param { num_output: 3 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 } } }"""


@pytest.mark.parametrize(("second", "coeff", "twice"), [
    ("b", "", True), ("b", "coeff: 0.5 coeff: -2", True), ("b", "", False), ("side", "", True)])
def test_sum_relu_equals_layers(tmp_path, mode, second, coeff, twice):
    path = tmp_path / "sr.prototxt"
    path.write_text(NET.format(second=second, coeff=coeff, twice=TWICE if twice else ""))
    fused, plain = nets = fused_and_plain(lambda: caffe.Net(str(path), caffe.TRAIN, dtype=np.float64), seed=9)
    chains = [c for c in fused.executor.fusions.values() if isinstance(c, SumReLU)]
    assert len(chains) == 1 and chains[0].split == twice
    assert fused._layer_names[chains[0].first] == "sum"
    rng = np.random.default_rng(3)
    x, side = rng.standard_normal((2, 3, 7, 9)), rng.standard_normal((2, 4, 7, 9))
    for _ in range(3):  # warm-up, capture, replay on the GPU
        for net in nets:
            net.clear_param_diffs()
            net.forward(data=x, side=side)
            net.backward()
        assert_nets_match(fused, plain, rtol=1e-12, atol=1e-14)
        for name in ("sum", "a", "b"):  # what the chain writes: bit for bit
            np.testing.assert_array_equal(fused.blobs[name].data, plain.blobs[name].data, err_msg=name)
            np.testing.assert_array_equal(fused.blobs[name].diff, plain.blobs[name].diff, err_msg=name)
    assert (fused.blobs["sum"].data == 0).any() and fused.blobs["a"].diff.any()
