"""BatchNorm -> Scale (-> ReLU) as one pass each way (runtime/fusion.py's NormChain) gives what the
layers give one by one: every blob's data and diff, every param gradient and the running
statistics, in TRAIN (batch statistics) and TEST with backward (global statistics), in place and
with a top per layer, for whole and partial ranges. On the CPU the chain is found but the layers
run as written (it is a GPU pass)."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.runtime.fusion import NormChain
from pycaffe_lite.testing.nets import assert_nets_match, fused_and_plain, set_bn_statistics

NET = """
name: "nc"
input: "data"
input_shape {{ dim: 3 dim: 2 dim: 6 dim: 8 }}
force_backward: true
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param {{ num_output: 5 kernel_size: 3 pad: 1 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
layer {{ name: "bn1" type: "BatchNorm" bottom: "conv1" top: "{bn_top}" batch_norm_param {{ eps: 0.001 {stats} }} }}
layer {{ name: "sc1" type: "Scale" bottom: "{bn_top}" top: "{sc_top}" {frozen}
        scale_param {{ bias_term: {bias} filler {{ type: "gaussian" }} bias_filler {{ type: "gaussian" }} }} }}
{relu}
layer {{ name: "conv2" type: "Convolution" bottom: "{sc_top}" top: "conv2"
        convolution_param {{ num_output: 3 kernel_size: 1 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
"""
RELU = 'layer {{ name: "relu1" type: "ReLU" bottom: "{sc_top}" top: "{sc_top}" }}'


def _text(in_place: bool, relu: bool, bias: bool, stats: str = "", frozen: str = "") -> str:
    bn_top, sc_top = ("conv1", "conv1") if in_place else ("conv1/bn", "conv1/scale")
    return NET.format(bn_top=bn_top, sc_top=sc_top, stats=stats, frozen=frozen, bias=str(bias).lower(),
                      relu=RELU.format(sc_top=sc_top) if relu else "")


def _nets(tmp_path, text: str, phase) -> tuple[caffe.Net, caffe.Net]:
    path = tmp_path / "nc.prototxt"
    path.write_text(text)
    nets = fused_and_plain(lambda: caffe.Net(str(path), phase, dtype=np.float64), seed=7)
    for net in nets:
        set_bn_statistics(net, "bn1")
    return nets


def _same(fused: caffe.Net, plain: caffe.Net) -> None:
    assert_nets_match(fused, plain, rtol=1e-9, atol=1e-11, params_data=True)


def _chain(net: caffe.Net) -> NormChain:
    chains = [c for c in net.executor.fusions.values() if isinstance(c, NormChain)]
    assert len(chains) == 1
    return chains[0]


@pytest.mark.parametrize("phase", [caffe.TRAIN, caffe.TEST])
@pytest.mark.parametrize(("in_place", "relu", "bias"),
                         [(True, True, True), (True, False, True), (True, True, False), (False, True, True)])
def test_chain_equals_layers(tmp_path, mode, phase, in_place, relu, bias):
    fused, plain = _nets(tmp_path, _text(in_place, relu, bias), phase)
    chain = _chain(fused)
    names = fused._layer_names
    assert (names[chain.first], names[chain.last], chain.relu, chain.in_place) == (
        "bn1", "relu1" if relu else "sc1", relu, in_place)
    assert not any(isinstance(c, NormChain) for c in plain.executor.fusions.values())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 6, 8))
    g = rng.standard_normal((3, 3, 6, 8))
    for _ in range(3):  # warm-up, capture, replay on the GPU; param diffs accumulate (pycaffe)
        for net in (fused, plain):
            net.forward(data=x)
            net.backward(conv2=g)
        _same(fused, plain)
    clipped = fused.blobs["conv1" if in_place else "conv1/scale"].data
    assert (clipped == 0).any() == relu and (clipped != 0).any()


@pytest.mark.parametrize("phase", [caffe.TRAIN, caffe.TEST])
def test_partial_ranges_run_the_layers_from_the_chains_state(tmp_path, mode, phase):
    """A backward that starts inside the chain, or a forward that stops inside it, runs the layers
    one by one; they read what the chain's forward left (the normalized values)."""
    fused, plain = _nets(tmp_path, _text(True, True, True), phase)
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal((3, 2, 6, 8)), rng.standard_normal((3, 5, 6, 8))
    for net in (fused, plain):
        net.forward(data=x)
        net.blobs["conv1"].diff[...] = g
        net.backward(start="sc1")  # below the ReLU: the Scale and BatchNorm alone
    _same(fused, plain)
    for net in (fused, plain):  # the chain in two forward ranges: the layers one by one
        net.forward(data=x, end="bn1")
        net.forward(start="sc1")
        net.backward(conv2=np.ones((3, 3, 6, 8)))
    _same(fused, plain)


def test_frozen_scale_and_global_stats_in_train(tmp_path, mode):
    """Fine-tuning style: statistics frozen (use_global_stats) and the Scale's params at lr_mult 0."""
    frozen = "param { lr_mult: 0 } param { lr_mult: 0 }"
    text = _text(True, True, True, "use_global_stats: true", frozen).replace("force_backward: true", "").replace(
        'top: "conv2"', 'top: "conv2" loss_weight: 1')
    fused, plain = _nets(tmp_path, text, caffe.TRAIN)  # conv1 learns: the chain runs backward
    assert fused.layer_dict["sc1"].param_propagate_down == [False, False]
    x = np.random.default_rng(2).standard_normal((3, 2, 6, 8))
    for _ in range(2):
        for net in (fused, plain):
            net.forward(data=x)
            net.backward(conv2=np.full((3, 3, 6, 8), 0.5))
        _same(fused, plain)
    assert not fused.params["sc1"][0].diff.any() and fused.params["conv1"][0].diff.any()


def test_scale_on_a_normalized_top_in_place_is_no_chain(tmp_path):
    """BatchNorm out of place with the Scale in place on its top (the recomputed-input case) and a
    Scale of two bottoms are left to the layers."""
    text = _text(False, True, True).replace('top: "conv1/scale"', 'top: "conv1/bn"').replace(
        'bottom: "conv1/scale"', 'bottom: "conv1/bn"')
    fused, _ = _nets(tmp_path, text, caffe.TRAIN)
    assert not any(isinstance(c, NormChain) for c in fused.executor.fusions.values())


def test_a_user_backward_hook_sees_each_layer(tmp_path, mode):
    """With a per-layer hook of the user's, backward runs the layers one by one: the hook sees the
    blob's diff after the ReLU's backward (masked), before the Scale's."""
    fused, plain = _nets(tmp_path, _text(True, True, True), caffe.TRAIN)
    x = np.random.default_rng(3).standard_normal((3, 2, 6, 8))
    seen = {}
    for net in (fused, plain):
        relu = list(net._layer_names).index("relu1")

        def hook(i, net=net, relu=relu):
            if i == relu:
                seen[id(net)] = net.blobs["conv1"].diff.copy()

        net.after_backward(hook)
        net.forward(data=x)
        net.backward(conv2=np.ones((3, 3, 6, 8)))
    np.testing.assert_array_equal(seen[id(fused)], seen[id(plain)])
    assert (seen[id(fused)] == 0).any() and seen[id(fused)].any()
    _same(fused, plain)
