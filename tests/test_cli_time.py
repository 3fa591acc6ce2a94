"""``pycaffe-lite time``: the (de)convolution FLOP/byte model against brute-force multiply-add
counts and hand-counted traffic, and the per-layer TFLOP/s, GB/s and convolution-share lines."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite import cli, common
from pycaffe_lite.commands.time import ConvCost, conv_cost, conv_macs, rate_suffix
from pycaffe_lite.layer_testing import blobs, empty_blobs, make_layer
from pycaffe_lite.net import Net

RNG = np.random.default_rng(7)


def conv_param(body: str, type_: str = "Convolution") -> str:
    return f'name: "c" type: "{type_}" convolution_param {{ {body} }}'


def brute_conv(x, w, b, stride, pad, dil, group):
    """Naive direct convolution; returns (y, in-bounds multiply-adds, all multiply-adds incl. padding)."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    mg = m // group
    ho = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    wo = (wd + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    y = np.zeros((n, m, ho, wo))
    inside = dense = 0
    for i in range(n):
        for o in range(m):
            g = o // mg
            for p in range(ho):
                for q in range(wo):
                    acc = b[o]
                    for ci in range(cg):
                        for r in range(kh):
                            for s in range(kw):
                                dense += 1
                                hh, ww = p * stride - pad + r * dil, q * stride - pad + s * dil
                                if 0 <= hh < h and 0 <= ww < wd:
                                    acc += x[i, g * cg + ci, hh, ww] * w[o, ci, r, s]
                                    inside += 1
                    y[i, o, p, q] = acc
    return y, inside, dense


def brute_deconv(x, w, b, stride, pad, dil, group):
    """Naive scatter deconvolution (weights (C, M/G, kh, kw)); same return triple as brute_conv."""
    n, c, h, wd = x.shape
    _, mg, kh, kw = w.shape
    cg = c // group
    ho = stride * (h - 1) + dil * (kh - 1) + 1 - 2 * pad
    wo = stride * (wd - 1) + dil * (kw - 1) + 1 - 2 * pad
    y = np.zeros((n, mg * group, ho, wo)) + b[:, None, None]
    inside = dense = 0
    for i in range(n):
        for ch in range(c):
            g = ch // cg
            for p in range(h):
                for q in range(wd):
                    for oc in range(mg):
                        for r in range(kh):
                            for s in range(kw):
                                dense += 1
                                hh, ww = p * stride - pad + r * dil, q * stride - pad + s * dil
                                if 0 <= hh < ho and 0 <= ww < wo:
                                    y[i, g * mg + oc, hh, ww] += x[i, ch, p, q] * w[ch, oc, r, s]
                                    inside += 1
    return y, inside, dense


CASES = [  # (channels, num_output, kernel, stride, pad, dilation, group, input hw)
    (3, 4, 3, 1, 0, 1, 1, 6),
    (4, 6, 3, 2, 0, 1, 2, 7),
    (2, 2, 2, 1, 0, 2, 1, 5),
    (4, 2, 3, 2, 1, 1, 2, 5),
]


@pytest.mark.parametrize("layer_type,brute", [("Convolution", brute_conv), ("Deconvolution", brute_deconv)])
@pytest.mark.parametrize("c,m,k,stride,pad,dil,group,hw", CASES)
def test_macs_match_brute_force(layer_type, brute, c, m, k, stride, pad, dil, group, hw):
    layer = make_layer(conv_param(
        f"num_output: {m} kernel_size: {k} stride: {stride} pad: {pad} dilation: {dil} group: {group} "
        "weight_filler { type: 'gaussian' std: 0.3 } bias_filler { type: 'gaussian' std: 0.3 }", layer_type))
    bottom, top = blobs([RNG.standard_normal((2, c, hw, hw))]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    w, b = layer.blobs[0].cpu_data(), layer.blobs[1].cpu_data()
    y, inside, dense = brute(bottom[0].cpu_data(), w, b, stride, pad, dil, group)
    np.testing.assert_allclose(top[0].cpu_data(), y, rtol=1e-10, atol=1e-12)  # the loop is the layer
    macs = conv_macs(layer_type, layer.blobs[0].shape, bottom[0].count, top[0].count)
    assert macs == dense  # the GEMM's work, padded taps included
    if pad == 0:
        assert macs == inside
    else:
        assert macs > inside
    cost = conv_cost(layer, bottom, top)
    assert cost.fwd_flops == 2 * dense
    assert cost.bwd_flops == 2 * 2 * dense  # weight gradient + input gradient


def test_traffic_and_backward_flops_by_what_is_propagated():
    layer = make_layer(conv_param("num_output: 5 kernel_size: 3 pad: 1 weight_filler { type: 'gaussian' }"),
                       np.float32)
    bottom = blobs([RNG.standard_normal((2, 3, 6, 6))], np.float32)
    top = empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    x, w, bias, y = 2 * 3 * 36, 5 * 3 * 9, 5, 2 * 5 * 36
    macs = y * 27
    f = 4  # float32
    full = conv_cost(layer, bottom, top, [True])
    assert full == ConvCost(2.0 * macs, 4.0 * macs, f * (x + w + bias + y),
                            f * (y + x + 2 * w + w + x + 2 * bias))
    no_dx = conv_cost(layer, bottom, top, [False])
    assert no_dx.bwd_flops == 2.0 * macs
    assert no_dx.bwd_bytes == f * (y + x + 2 * w + 2 * bias)
    layer.param_propagate_down = [False, False]
    only_dx = conv_cost(layer, bottom, top, [True])
    assert only_dx.bwd_flops == 2.0 * macs and only_dx.bwd_bytes == f * (y + w + x)
    assert conv_cost(layer, bottom, top, [False])[1:4:2] == (0.0, 0.0)
    assert rate_suffix(0.0, 0.0, 1.0) == ""


def test_cost_sums_over_bottom_top_pairs_and_skips_other_layers():
    layer = make_layer(conv_param("num_output: 2 kernel_size: 1 bias_term: false"))
    bottom = blobs([RNG.standard_normal((1, 3, 4, 4)), RNG.standard_normal((1, 3, 4, 4))])
    top = empty_blobs(2)
    layer.setup(bottom, top)
    cost = conv_cost(layer, bottom, top, [True, False])
    one = 2 * 16 * 3
    assert cost.fwd_flops == 2.0 * 2 * one
    assert cost.bwd_flops == 2.0 * (2 * one + one)  # weights for both pairs, input grad for bottom 0
    assert cost.fwd_bytes == 8 * (2 * 48 + 6 + 2 * 32)
    assert cost.bwd_bytes == 8 * (2 * 32 + 2 * 48 + 2 * 6 + 6 + 48)
    relu = make_layer('name: "r" type: "ReLU"')
    assert conv_cost(relu, bottom[:1], top[:1]) is None
    with pytest.raises(ValueError, match="Pooling"):
        conv_macs("Pooling", (1, 1, 1, 1), 1, 1)
    assert rate_suffix(2e12, 3e9, 0.5) == " (4 TFLOP/s, 6 GB/s)"
    assert rate_suffix(1e14, 5e11, 0.5) == " (200 TFLOP/s, 1000 GB/s)"


NET = """name: "cd"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "up" type: "Deconvolution" bottom: "c" top: "u" loss_weight: 1
  convolution_param { num_output: 2 kernel_size: 4 stride: 2 pad: 1 group: 2
                      weight_filler { type: "gaussian" std: 0.1 } } }
"""


def test_net_costs_follow_backward_needs(tmp_path):
    path = tmp_path / "cd.prototxt"
    path.write_text(NET)
    net = Net(str(path), common.TRAIN)
    costs = {name: conv_cost(layer, net.bottom_vecs[i], net.top_vecs[i], net.bottom_need_backward[i])
             for i, (name, layer) in enumerate(zip(net.layer_dict, net.layers))}
    assert costs["data"] is None and costs["relu"] is None
    conv_macs_ = 2 * 4 * 8 * 8 * (3 * 9)
    assert costs["conv"].fwd_flops == 2.0 * conv_macs_
    assert costs["conv"].bwd_flops == 2.0 * conv_macs_  # the Input needs no gradient
    up_macs = (2 * 4 * 8 * 8) * (1 * 16)  # bottom count x (num_output/group · kh · kw)
    assert net.blobs["u"].shape == (2, 2, 16, 16)
    assert costs["up"].fwd_flops == 2.0 * up_macs
    assert costs["up"].bwd_flops == 4.0 * up_macs


def test_cli_prints_rates_and_convolution_share(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("cd.prototxt").write_text(NET)
    assert cli.main(["time", "--model", "cd.prototxt", "--iterations", "2"]) == 0
    out = capsys.readouterr().out
    lines = {tuple(line.strip().split("\t")[:1]) + (line.split("\t")[1].split(":")[0],): line
             for line in out.splitlines() if "\t" in line}
    net = Net("cd.prototxt", common.TRAIN)
    index = list(net.layer_dict)
    rate = re.compile(r": ([0-9.e+-]+) ms\. \(([0-9.e+-]+) TFLOP/s, ([0-9.e+-]+) GB/s\)$")
    for name in ("conv", "up"):
        i = index.index(name)
        cost = conv_cost(net.layers[i], net.bottom_vecs[i], net.top_vecs[i], net.bottom_need_backward[i])
        for direction, flops, nbytes in (("forward", cost.fwd_flops, cost.fwd_bytes),
                                         ("backward", cost.bwd_flops, cost.bwd_bytes)):
            match = rate.search(lines[(name, direction)])
            assert match, lines[(name, direction)]
            ms, tflops, gbs = (float(v) for v in match.groups())
            assert tflops == pytest.approx(flops / (ms * 1e-3) / 1e12, rel=1e-2)
            assert gbs == pytest.approx(nbytes / (ms * 1e-3) / 1e9, rel=1e-2)
    for name in ("data", "relu"):
        assert "TFLOP/s" not in lines[(name, "forward")]
    assert "TFLOP/s" not in lines[("relu", "backward")]
    share = re.search(r"Convolution/Deconvolution layers: ([0-9.e+-]+) ms \(([0-9.]+)% of layer time\); "
                      r"other layers: ([0-9.e+-]+) ms\.", out)
    assert share, out
    ms = {key: float(re.search(r": ([0-9.e+-]+) ms\.", line).group(1)) for key, line in lines.items()}
    conv_ms = sum(v for (name, _), v in ms.items() if name in ("conv", "up"))
    other_ms = sum(v for (name, _), v in ms.items() if name not in ("conv", "up"))
    assert float(share.group(1)) == pytest.approx(conv_ms, rel=1e-3, abs=1e-6)
    assert float(share.group(3)) == pytest.approx(other_ms, rel=1e-3, abs=1e-6)
    assert float(share.group(2)) == pytest.approx(100 * conv_ms / (conv_ms + other_ms), abs=0.1)
    assert out.rstrip().endswith("*** Benchmark ends ***")
