"""``engine: CAFFE`` as published MobileNet files write it on every convolution means "not cuDNN": the
layers hand the autotune exactly the inputs (problem, bias, candidate engines) of the same file without
the field, so the GPU picks the same engines (issue 26). CPU-side: the autotune's ``choose`` is
replaced by a recorder, so no GPU is needed."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.net_spec import NetSpec
from pycaffe_lite.net_spec import layers as L
from pycaffe_lite.net_spec import params as P

# (output channels, stride) of the depthwise-separable blocks: a MobileNet v1 in miniature
BLOCKS = ((16, 1), (32, 2), (32, 1), (64, 2))


def _conv_bn_relu(n: NetSpec, bottom, name: str, nout: int, ks: int, stride: int, group: int, engine) -> object:
    """Convolution (no bias) -> BatchNorm with its own top -> Scale in place -> ReLU in place, as the
    published Caffe MobileNets write them."""
    kw = dict(num_output=nout, kernel_size=ks, pad=(ks - 1) // 2, stride=stride, bias_term=False,
              weight_filler=dict(type="msra"))
    if group > 1:
        kw["group"] = group
    if engine is not None:
        kw["engine"] = engine
    n[name] = L.Convolution(bottom, **kw)
    n[name + "/bn"] = L.BatchNorm(n[name], use_global_stats=True)
    n[name + "/scale"] = L.Scale(n[name + "/bn"], bias_term=True, in_place=True)
    n[name + "/relu"] = L.ReLU(n[name + "/scale"], in_place=True)
    return n[name + "/relu"]


def mobilenet(engine, batch: int = 2) -> str:
    """A small MobileNet v1 (3x3 stem, depthwise 3x3 + pointwise 1x1 blocks, global pooling, a 1x1
    classifier with bias); ``engine`` on every convolution (None: the field left out)."""
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[batch, 3, 32, 32]))
    x = _conv_bn_relu(n, n.data, "conv1", 8, 3, 2, 1, engine)
    channels = 8
    for i, (nout, stride) in enumerate(BLOCKS, start=2):
        x = _conv_bn_relu(n, x, f"conv{i}/dw", channels, 3, stride, channels, engine)
        x = _conv_bn_relu(n, x, f"conv{i}/sep", nout, 1, 1, 1, engine)
        channels = nout
    n.pool = L.Pooling(x, pool=P.Pooling.AVE, global_pooling=True)
    kw = dict(num_output=10, kernel_size=1, weight_filler=dict(type="msra"))
    if engine is not None:
        kw["engine"] = engine
    n.fc = L.Convolution(n.pool, **kw)
    return str(n.to_proto())


def _autotune_inputs(tmp_path, name: str, text: str, monkeypatch) -> dict[str, tuple]:
    """Per convolution layer: the (problem, bias, candidates) its GPU engine choice asks the
    autotune for."""
    asked: dict[str, tuple] = {}
    current = {"layer": ""}

    def record(prob, has_bias, candidates, passes=conv_engines.PASSES, *, operands=None):
        asked[current["layer"]] = (prob, has_bias, candidates)
        return conv_engines.Choice("gemm", "gemm", "gemm")

    monkeypatch.setattr(conv_engines, "choose", record)
    path = tmp_path / f"{name}.prototxt"
    path.write_text(text)
    net = caffe.Net(str(path), caffe.TEST)
    net.forward(data=np.zeros(net.blobs["data"].shape, np.float32))  # the CPU path: shapes, problems
    for layer_name, layer in zip(net._layer_names, net.layers):
        if layer.type == "Convolution":
            current["layer"] = layer_name
            layer.engines()
    return asked


@pytest.mark.parametrize("field", ["CAFFE", "CUDNN"])
@pytest.mark.slow
def test_published_engine_field_asks_the_autotune_what_the_plain_file_asks(tmp_path, monkeypatch, caplog, field):
    monkeypatch.setattr(conv_engines, "_noted_fields", set())
    plain = _autotune_inputs(tmp_path, "plain", mobilenet(None), monkeypatch)
    value = getattr(P.Convolution, field)
    published_text = mobilenet(value)
    assert published_text.count(f"engine: {field}") == 2 + 2 * len(BLOCKS)  # every convolution
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        published = _autotune_inputs(tmp_path, "published", published_text, monkeypatch)
    assert list(published) == list(plain) and len(plain) == 2 + 2 * len(BLOCKS)
    for layer, want in plain.items():
        assert published[layer] == want, layer
    depthwise = [layer for layer in plain if layer.endswith("/dw")]
    for layer in depthwise:  # the depthwise engine stays a candidate (Caffe's path alone was the old reading)
        prob, _, candidates = published[layer]
        assert "depthwise" in candidates and conv_engines.ENGINES["depthwise"].supports(prob)
        assert len(candidates) > 1
    said = [r.getMessage() for r in caplog.records if f"engine: {field}" in r.getMessage()]
    assert len(said) == 1  # once, not per layer


def test_gemm_value_forces_caffes_path(tmp_path, monkeypatch):
    asked = _autotune_inputs(tmp_path, "gemm", mobilenet(P.Convolution.GEMM), monkeypatch)
    assert {candidates for _, _, candidates in asked.values()} == {("gemm",)}
