"""``pycaffe-lite time``: the (de)convolution FLOP/byte model against brute-force multiply-add
counts and hand-counted traffic, the bandwidth-bound layers' byte counts, and the per-layer
TFLOP/s, GB/s, convolution-share and (GPU) peak-memory lines."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite import common
from pycaffe_lite.commands import cli
from pycaffe_lite.commands.time import (
    ConvCost,
    bandwidth_suffix,
    conv_cost,
    conv_macs,
    layer_bytes,
    rate_suffix,
)
from pycaffe_lite.layer import layer_class, layer_type_list
from pycaffe_lite.net import Net
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

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


def _setup(text: str, shapes, ntop: int = 1, dtype=np.float32):
    layer = make_layer(text, dtype)
    bottom = blobs([RNG.standard_normal(sh) for sh in shapes], dtype)
    top = empty_blobs(ntop, dtype)
    layer.setup(bottom, top)
    return layer, bottom, top


def test_inner_product_flops_either_layout():
    for transpose in ("false", "true"):
        layer, bottom, top = _setup(f'type: "InnerProduct" inner_product_param {{ num_output: 7 transpose: {transpose} '
                                    'weight_filler { type: "gaussian" } }', [(3, 2, 5)])
        m, n, k = 3, 7, 10
        cost = conv_cost(layer, bottom, top, [True])
        assert cost.fwd_flops == 2.0 * m * n * k and cost.bwd_flops == 4.0 * m * n * k
        assert cost.fwd_bytes == 4 * (m * k + n * k + n + m * n)
    assert layer_bytes(layer, bottom, top) is None


def test_bandwidth_bytes_hand_counted():
    n, c = 2 * 3 * 4 * 4, 3
    f = 4  # float32
    relu, b, t = _setup('type: "ReLU"', [(2, 3, 4, 4)])
    assert layer_bytes(relu, b, t) == (f * 2 * n, f * 3 * n)  # bwd: top diff, bottom data, bottom diff
    assert layer_bytes(relu, b, t, [False]) == (f * 2 * n, f * 2 * n)
    sig, b, t = _setup('type: "Sigmoid"', [(2, 3, 4, 4)])
    assert layer_bytes(sig, b, t) == (f * 2 * n, f * 3 * n)  # bwd reads the top data
    bn, b, t = _setup('type: "BatchNorm"', [(2, 3, 4, 4)])
    stats = 2 * c + 1
    assert layer_bytes(bn, b, t) == (f * (2 * n + stats), f * (3 * n + stats))  # stats not learned
    sc, b, t = _setup('type: "Scale" scale_param { bias_term: true }', [(2, 3, 4, 4)])
    assert layer_bytes(sc, b, t) == (f * (2 * n + 2 * c), f * (3 * n + 2 * c + 2 * 2 * c))
    add, b, t = _setup('type: "Eltwise"', [(2, 3, 4, 4)] * 2)
    assert layer_bytes(add, b, t) == (f * 3 * n, f * 3 * n)  # SUM: top diff, two bottom diffs
    prod, b, t = _setup('type: "Eltwise" eltwise_param { operation: PROD }', [(2, 3, 4, 4)] * 2)
    assert layer_bytes(prod, b, t)[1] == f * (n + 2 * n + n + 2 * n)
    cat, b, t = _setup('type: "Concat"', [(2, 3, 4, 4), (2, 1, 4, 4)])
    m = 2 * 4 * 4
    assert layer_bytes(cat, b, t, [True, False]) == (f * 2 * (n + m), f * (n + m + n))
    split, b, t = _setup('type: "Split"', [(2, 3, 4, 4)], ntop=2)
    assert layer_bytes(split, b, t) == (0.0, f * 3 * n)  # forward shares; backward sums two diffs
    po = 2 * 3 * 2 * 2
    mx, b, t = _setup('type: "Pooling" pooling_param { pool: MAX kernel_size: 2 stride: 2 }', [(2, 3, 4, 4)])
    assert layer_bytes(mx, b, t) == (f * (n + po), f * (po + po + n))  # argmax mask read
    ave, b, t = _setup('type: "Pooling" pooling_param { pool: AVE kernel_size: 2 stride: 2 }', [(2, 3, 4, 4)])
    assert layer_bytes(ave, b, t) == (f * (n + po), f * (po + n))
    loss, b, t = _setup('type: "SoftmaxWithLoss"', [(4, 10), (4,)])
    loss_b = [b[0], blobs([np.array([1, 2, 3, 4])], np.float32)[0]]
    assert layer_bytes(loss, loss_b, t, [True, False]) == (f * (40 + 4 + 1), f * (1 + 40 + 4 + 40))
    conv, b, t = _setup(conv_param("num_output: 2 kernel_size: 1"), [(1, 3, 4, 4)])
    assert layer_bytes(conv, b, t) is None
    assert {"BatchNorm", "Scale", "Bias", "Eltwise", "ReLU", "Clip", "Concat", "Split", "Pooling", "Softmax",
            "LRN", "Dropout", "SoftmaxWithLoss", "EuclideanLoss", "TanH", "ELU"} <= _declaring_backward_reads()
    perm, b, t = _setup('type: "Permute" permute_param { order: 0 order: 2 order: 3 order: 1 }', [(2, 3, 4, 4)])
    assert layer_bytes(perm, b, t) == (f * 2 * n, f * 2 * n)  # a pure data movement either way
    norm, b, t = _setup('type: "Normalize" norm_param { across_spatial: false channel_shared: false }',
                        [(2, 3, 4, 4)])
    # forward: x, the per-channel scale, top; backward: dy, x, the scale, dx, the scale's diff read + written
    assert layer_bytes(norm, b, t) == (f * (2 * n + c), f * (3 * n + c + 2 * c))
    assert {"Normalize", "Permute", "Reverse", "Transpose", "Interp", "Upsample", "ReLU6", "ShuffleChannel",
            "Axpy", "BN"} <= _declaring_backward_reads()
    assert bandwidth_suffix(2e9, 0.5) == " (4 GB/s)" and bandwidth_suffix(0.0, 1.0) == ""


def _declaring_backward_reads() -> set[str]:
    """The layer types whose traits say what their backward reads (they get a GB/s in ``time``)."""
    return {t for t in layer_type_list() if layer_class(t).traits.backward_reads is not None}


BW_NET = """name: "bw"
layer { name: "data" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } shape { dim: 2 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "scale" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "conv2" type: "Convolution" bottom: "c" top: "c2"
  convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "sum" type: "Eltwise" bottom: "c" bottom: "c2" top: "s" }
layer { name: "pool" type: "Pooling" bottom: "s" top: "p" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "p" top: "ip"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
BW_LAYERS = ("bn", "scale", "relu", "sum", "pool", "loss")
GBS = re.compile(r": ([0-9.e+-]+) ms\. \(([0-9.e+-]+) GB/s\)$")


def _time_lines(out: str) -> dict:
    return {tuple(line.strip().split("\t")[:1]) + (line.split("\t")[1].split(":")[0],): line
            for line in out.splitlines() if "\t" in line}


def test_cli_prints_bandwidth_of_bandwidth_bound_layers(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("bw.prototxt").write_text(BW_NET)
    assert cli.main(["time", "--model", "bw.prototxt", "--iterations", "2"]) == 0
    out = capsys.readouterr().out
    lines = _time_lines(out)
    net = Net("bw.prototxt", common.TRAIN)
    index = list(net.layer_dict)
    for name in BW_LAYERS:
        i = index.index(name)
        nbytes = layer_bytes(net.layers[i], net.bottom_vecs[i], net.top_vecs[i], net.bottom_need_backward[i])
        for direction, expect in zip(("forward", "backward"), nbytes):
            match = GBS.search(lines[(name, direction)])
            assert match, lines[(name, direction)]
            ms, gbs = (float(v) for v in match.groups())
            assert gbs > 0 and expect > 0
            assert gbs == pytest.approx(expect / (ms * 1e-3) / 1e9, rel=1e-2)
    assert "TFLOP/s" in lines[("ip", "forward")] and "TFLOP/s" in lines[("ip", "backward")]
    assert "GB/s" not in lines[("data", "forward")]
    assert "Peak device memory" not in out  # GPU mode only
    share = re.search(r"Convolution/Deconvolution layers: ([0-9.e+-]+) ms", out)
    ms = {key: float(re.search(r": ([0-9.e+-]+) ms\.", line).group(1)) for key, line in lines.items()}
    assert float(share.group(1)) == pytest.approx(sum(v for (n, _), v in ms.items() if n in ("conv", "conv2")),
                                                  rel=1e-3, abs=1e-6)


@pytest.mark.gpu
def test_cli_gpu_prints_peak_device_memory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("bw.prototxt").write_text(BW_NET)
    try:
        assert cli.main(["time", "--model", "bw.prototxt", "--iterations", "2", "--gpu", "0"]) == 0
    finally:
        common.set_mode_cpu()
    out = capsys.readouterr().out
    lines = _time_lines(out)
    for name in BW_LAYERS:
        assert float(GBS.search(lines[(name, "forward")]).group(2)) > 0
    mem = re.search(r"Peak device memory: ([0-9.]+) MiB held by the process \(memory pool ([0-9.]+) MiB, "
                    r"([0-9.]+) MiB in use\)\.", out)
    assert mem, out
    held, pool, active = (float(v) for v in mem.groups())
    assert held > 0 and 0 < pool <= held + 0.1 and active <= pool
    assert out.rstrip().endswith("*** Benchmark ends ***")


def test_time_lists_every_layer_of_a_net_with_duplicate_names(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("dup.prototxt").write_text(
        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }\n'
        'layer { name: "act" type: "ReLU" bottom: "data" top: "a" }\n'
        'layer { name: "act" type: "TanH" bottom: "a" top: "b" }\n')
    assert cli.main(["time", "--model", "dup.prototxt", "--iterations", "1"]) == 0
    out = capsys.readouterr().out
    names = [line.split("\t")[0].strip() for line in out.splitlines() if "\tforward:" in line]
    assert names == ["data", "act", "act"]


FORK_NET = """name: "forks"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 6 dim: 4 dim: 4 } } }
layer { name: "norm" type: "Normalize" bottom: "data" top: "n" norm_param { across_spatial: false } }
layer { name: "relu6" type: "ReLU6" bottom: "n" top: "r" }
layer { name: "shuffle" type: "ShuffleChannel" bottom: "r" top: "s" shuffle_channel_param { group: 2 } }
layer { name: "interp" type: "Interp" bottom: "s" top: "i" interp_param { zoom_factor: 2 } }
layer { name: "rev" type: "Reverse" bottom: "i" top: "v" reverse_param { axis: 1 } }
layer { name: "perm" type: "Permute" bottom: "v" top: "p" permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "p" top: "loss" }
"""


def test_cli_prints_bandwidth_of_fork_layers(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("forks.prototxt").write_text(FORK_NET)
    assert cli.main(["time", "--model", "forks.prototxt", "--iterations", "1"]) == 0
    lines = _time_lines(capsys.readouterr().out)
    for name in ("norm", "relu6", "shuffle", "interp", "rev", "perm"):
        for direction in ("forward", "backward"):
            assert GBS.search(lines[(name, direction)]), lines[(name, direction)]


def test_cli_prints_the_data_layer_rate_and_wait(tmp_path, monkeypatch, capsys):
    pytest.importorskip("lmdb")
    from pycaffe_lite.data.db import LMDBWriter
    from pycaffe_lite.proto import caffe_pb2

    monkeypatch.chdir(tmp_path)
    with LMDBWriter(tmp_path / "db") as w:
        for i in range(6):
            w.put(b"%02d" % i, caffe_pb2.Datum(channels=1, height=4, width=4, data=bytes(range(16)),
                                               label=i % 2).SerializeToString())
    Path("d.prototxt").write_text(f"""
layer {{ name: "data" type: "Data" top: "data" top: "label" data_param {{ source: "{tmp_path / 'db'}"
        batch_size: 3 backend: LMDB }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param {{ num_output: 2 }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
""")
    assert cli.main(["time", "--model", "d.prototxt", "--iterations", "4"]) == 0
    line = _time_lines(capsys.readouterr().out)[("data", "forward")]
    m = re.search(r": ([0-9.e+-]+) ms\. \(([0-9.e+-]+) img/s, waited ([0-9.e+-]+) ms per batch for data\)", line)
    assert m, line
    ms, rate, waited = (float(v) for v in m.groups())
    assert rate == pytest.approx(3 / (ms * 1e-3), rel=2e-2)
    assert 0 <= waited <= ms
