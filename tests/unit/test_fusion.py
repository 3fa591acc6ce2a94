"""Layer fusions give what the unfused layers give: Convolution -> BatchNorm -> Scale (-> ReLU) in
TEST phase, Convolution -> ReLU in every phase (forward and backward)."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.runtime.fusion import ConvBNScale
from pycaffe_lite.testing.nets import assert_nets_match, fused_and_plain, set_bn_statistics

NET = """
name: "f"
input: "data"
input_shape {{ dim: 2 dim: 3 dim: 9 dim: 9 }}
{force}
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 bias_term: {bias}
                            weight_filler {{ type: "gaussian" std: 0.5 }} bias_filler {{ type: "gaussian" }} }} }}
layer {{ name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" batch_norm_param {{ eps: 0.001 }} }}
{scale}
layer {{ name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }}
layer {{ name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param {{ num_output: 2 kernel_size: 1 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
"""
SCALE = """layer { name: "sc1" type: "Scale" bottom: "conv1" top: "conv1"
        scale_param { bias_term: true filler { type: "gaussian" } bias_filler { type: "gaussian" } } }"""


def _net(tmp_path, monkeypatch, fuse: bool, phase=caffe.TEST, scale=True, bias="false", force=""):
    path = tmp_path / f"f{int(fuse)}.prototxt"
    path.write_text(NET.format(force=force, bias=bias, scale=SCALE if scale else ""))
    caffe.set_random_seed(11)
    with caffe.using_config(fusion=fuse):  # fusions are found when the net is built
        net = caffe.Net(str(path), phase, dtype=np.float64)
    set_bn_statistics(net, "bn1")
    return net


@pytest.mark.parametrize(("scale", "bias"), [(True, "false"), (True, "true"), (False, "true")])
def test_fused_equals_unfused(tmp_path, monkeypatch, mode, scale, bias):
    fused = _net(tmp_path, monkeypatch, True, scale=scale, bias=bias)
    plain = _net(tmp_path, monkeypatch, False, scale=scale, bias=bias)
    assert len(fused.executor.fusions) == 1 and not plain.executor.fusions
    (chain,) = fused.executor.fusions.values()
    assert chain.relu and fused._layer_names[chain.last] == "relu1"  # the in-place ReLU is the epilogue
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 9))
    for _ in range(2):  # second pass: CUDA-graph replay on the GPU
        a, b = fused.forward(data=x), plain.forward(data=x)
        np.testing.assert_allclose(a["conv2"], b["conv2"], rtol=1e-10, atol=1e-12)
        for name in fused.blobs:
            np.testing.assert_allclose(fused.blobs[name].data, plain.blobs[name].data, rtol=1e-10, atol=1e-12)


def test_weights_changed_after_building_are_used(tmp_path, monkeypatch, mode):
    fused = _net(tmp_path, monkeypatch, True)
    plain = _net(tmp_path, monkeypatch, False)
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 9))
    fused.forward(data=x)
    fused.forward(data=x)
    for net in (fused, plain):
        net.params["conv1"][0].data[...] *= -0.5
        net.params["bn1"][2].data[...] = 0.0  # Caffe: factor 0 -> mean 0, var 0
        net.params["sc1"][1].data[...] += 1.0
    np.testing.assert_allclose(fused.forward(data=x)["conv2"], plain.forward(data=x)["conv2"], rtol=1e-10)


def _folds(net) -> list:
    return [c for c in net.executor.fusions.values() if isinstance(c, ConvBNScale)]


def test_no_fold_when_training_or_backward_is_needed(tmp_path, monkeypatch):
    assert not _folds(_net(tmp_path, monkeypatch, True, phase=caffe.TRAIN))
    assert not _folds(_net(tmp_path, monkeypatch, True, force="force_backward: true"))


CONV_RELU = """
name: "cr"
input: "data"
input_shape { dim: 3 dim: 2 dim: 8 dim: 8 }
input: "label"
input_shape { dim: 3 }
force_backward: true
layer { name: "c1" type: "Convolution" bottom: "data" top: "c1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 }
                            bias_filler { type: "gaussian" } } }
layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 3 kernel_size: 1 bias_term: false weight_filler { type: "gaussian" } } }
layer { name: "r2" type: "ReLU" bottom: "c2" top: "c2" }
layer { name: "c3" type: "Convolution" bottom: "c2" top: "c3"
        convolution_param { num_output: 2 kernel_size: 3 stride: 2 weight_filler { type: "gaussian" } } }
layer { name: "r3" type: "ReLU" bottom: "c3" top: "c3" relu_param { negative_slope: 0.1 } }
layer { name: "ip" type: "InnerProduct" bottom: "c3" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_conv_relu_fused_in_training_forward_and_backward(tmp_path, monkeypatch, mode):
    """Conv -> in-place ReLU (slope 0) runs fused in TRAIN; every blob's data and diff and every
    parameter gradient equal the unfused net's (a leaky ReLU is not fused)."""
    path = tmp_path / "cr.prototxt"
    path.write_text(CONV_RELU)
    fused, plain = nets = fused_and_plain(lambda: caffe.Net(str(path), caffe.TRAIN, dtype=np.float64), seed=3)
    names = fused._layer_names
    assert [(names[c.first], names[c.last]) for c in fused.executor.fusions.values()] == [("c1", "r1"), ("c2", "r2")]
    rng = np.random.default_rng(5)
    x, label = rng.standard_normal((3, 2, 8, 8)), np.array([0.0, 3.0, 4.0])
    for _ in range(2):  # second pass: CUDA-graph replay on the GPU
        for net in nets:
            net.clear_param_diffs()
            net.forward(data=x, label=label)
            net.backward()
        assert_nets_match(fused, plain, rtol=1e-12, atol=1e-13)
    assert (fused.blobs["c1"].data == 0).any()  # the ReLU clipped something


OUT_OF_PLACE = """
name: "oop"
input: "data"
input_shape {{ dim: 2 dim: 3 dim: 9 dim: 9 }}
{force}
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
layer {{ name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1/bn" batch_norm_param {{ eps: 0.001 }} }}
layer {{ name: "sc1" type: "Scale" bottom: "conv1/bn" top: "{scale_top}"
        scale_param {{ bias_term: true filler {{ type: "gaussian" }} bias_filler {{ type: "gaussian" }} }} }}
layer {{ name: "relu1" type: "ReLU" bottom: "{scale_top}" top: "{scale_top}" }}
layer {{ name: "conv2" type: "Convolution" bottom: "{scale_top}" top: "conv2"
        convolution_param {{ num_output: 2 kernel_size: 1 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
"""


def _oop_net(tmp_path, fuse: bool, scale_top="conv1/scale", force="", share=True):
    path = tmp_path / f"oop{int(fuse)}.prototxt"
    path.write_text(OUT_OF_PLACE.format(force=force, scale_top=scale_top))
    caffe.set_random_seed(11)
    with caffe.using_config(fusion=fuse, share_data=share):
        net = caffe.Net(str(path), caffe.TEST, dtype=np.float64)
    set_bn_statistics(net, "bn1")
    return net


@pytest.mark.parametrize("scale_top", ["conv1/scale", "conv1/bn"])  # Scale out of place (published) or in place
def test_out_of_place_chain_folds_and_skipped_blobs_read_as_caffe_leaves_them(tmp_path, mode, scale_top, caplog):
    fused, plain = _oop_net(tmp_path, True, scale_top), _oop_net(tmp_path, False, scale_top)
    (chain,) = fused.executor.fusions.values()
    names = fused._blob_names
    assert {names[b] for b in chain.skipped} == {"conv1", "conv1/bn"} - {scale_top} and chain.relu
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 9))
    for _ in range(3):  # warm-up, capture, replay on the GPU
        a, b = fused.forward(data=x), plain.forward(data=x)
        np.testing.assert_allclose(a["conv2"], b["conv2"], rtol=1e-10, atol=1e-12)
        assert fused.executor.shared_data.skipping
    with caplog.at_level("INFO", logger="pycaffe_lite"):
        for name in plain.blobs:  # the skipped blobs are recomputed when read
            np.testing.assert_allclose(fused.blobs[name].data, plain.blobs[name].data, rtol=1e-10, atol=1e-12)
    assert "folded Convolution -> BatchNorm -> Scale" in caplog.text
    x2 = x[::-1].copy()
    a, b = fused.forward(data=x2), plain.forward(data=x2)  # layer by layer from now on
    assert not fused.executor.shared_data.skipping
    np.testing.assert_allclose(fused.blobs["conv1"].data, plain.blobs["conv1"].data, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a["conv2"], b["conv2"], rtol=1e-10, atol=1e-12)


def test_out_of_place_chain_kept_blobs_and_changed_weights(tmp_path, mode):
    fused, plain = _oop_net(tmp_path, True), _oop_net(tmp_path, False)
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 9))
    for _ in range(2):
        fused.forward(data=x)
    for net in (fused, plain):  # weights written after the fold was made are folded again
        net.params["conv1"][0].data[...] *= -0.5
        net.params["sc1"][1].data[...] += 1.0
    for _ in range(2):
        np.testing.assert_allclose(fused.forward(data=x)["conv2"], plain.forward(data=x)["conv2"], rtol=1e-10)
    out = fused.forward(blobs=["conv1/bn"], data=x)  # a kept blob is written: its chain runs unfolded
    np.testing.assert_allclose(out["conv1/bn"], plain.forward(blobs=["conv1/bn"], data=x)["conv1/bn"], rtol=1e-10)


def test_out_of_place_chain_is_not_folded_with_backward_or_without_data_sharing(tmp_path, mode):
    assert not _folds(_oop_net(tmp_path, True, force="force_backward: true"))
    net = _oop_net(tmp_path, True, share=False)  # found, but run layer by layer: nothing may be skipped
    plain = _oop_net(tmp_path, False)
    x = np.random.default_rng(2).standard_normal((2, 3, 9, 9))
    with caffe.using_config(share_data=False):
        net.forward(data=x)
        assert not net.executor.shared_data.skipping
    plain.forward(data=x)
    np.testing.assert_allclose(net.blobs["conv1"].data, plain.blobs["conv1"].data, rtol=1e-10)
