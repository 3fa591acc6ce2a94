"""The check's layer-by-layer recheck (pycaffe_lite/onnx/local.py) and the statistics the command
measures for nets without weights (pycaffe_lite/onnx/fill.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_testing import make_net

from pycaffe_lite.onnx import CONVERTERS, export_net, load_converters
from pycaffe_lite.onnx.fill import fill_statistics

INPUT = 'name: "t"\nlayer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dims} }} }} }}\n'

# A convolution whose outputs are sums of terms near 1000 (rounding differences of about 1e-4 in
# absolute terms, 1e-7 of its range), then Clip(0, 6): the values the clip keeps carry those 1e-4,
# about 2e-5 of the clipped range of 6.
CLIPPED = INPUT.format(dims="dim: 2 dim: 16 dim: 12 dim: 12") + '''
layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 16 kernel_size: 3 pad: 1 } }
layer { name: "r6" type: "ReLU6" bottom: "c" top: "c" }
layer { name: "c2" type: "Convolution" bottom: "c" top: "c2" convolution_param { num_output: 4 kernel_size: 1 } }
'''


def _clipped_net():
    net = make_net(CLIPPED, seed=4)
    x = np.random.default_rng(5).standard_normal((2, 16, 12, 12)).astype(np.float32) * 2000
    return net, {"data": x}


def _rows(report):
    return {r.row.layer: r for r in report.checks[0].rows}


def test_carried_rounding_passes_layer_by_layer():
    net, feeds = _clipped_net()
    strict = export_net(net, None, check_inputs=[feeds], random_check=False, raise_on_mismatch=False,
                        layer_recheck=False)
    rows = _rows(strict)
    assert rows["c"].verdict == "ok" and rows["r6"].verdict == "MISMATCH", strict.checks[0].table()
    assert rows["r6"].rel > 1e-5 and rows["c"].rel < 1e-5
    report = export_net(net, None, check_inputs=[feeds], random_check=False)
    rows = _rows(report)
    assert rows["r6"].verdict == "ok (layer)" and rows["r6"].detail == "layer alone 0"  # Clip is exact
    assert rows["r6"].rel == strict.checks[0].rows[2].rel  # the end-to-end numbers are kept
    table = report.checks[0].table()
    assert "more agree within it layer by layer" in table and report.checks[0].ok


def test_a_wrong_converter_still_fails(monkeypatch):
    """A ReLU6 exported as Clip(0, 5.99) differs on our own inputs too: MISMATCH, with its layer
    alone's difference in the row."""
    def wrong(ctx):
        return [ctx.op("Clip", [ctx.bottoms[0], ctx.const("min", 0.0), ctx.const("max", 5.99)], ctx.out(0))]

    load_converters()
    monkeypatch.setitem(CONVERTERS, "ReLU6", wrong)
    net, feeds = _clipped_net()
    report = export_net(net, None, check_inputs=[feeds], random_check=False, raise_on_mismatch=False)
    row = _rows(report)["r6"]
    assert row.verdict == "MISMATCH" and row.detail.startswith("layer alone ")
    assert float(row.detail.split()[-1]) == pytest.approx(0.01 / 6, rel=1e-2)
    assert report.checks[0].status == "FAIL"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the fused conv + BatchNorm of eps 0 before the fill
def test_fill_statistics_normalizes_each_channel():
    """Untouched BatchNorm statistics are measured on a random input, layer after layer: on that
    input each normalized channel has mean 0 and variance 1; a constant channel gets 0 and 1."""
    net = make_net(INPUT.format(dims="dim: 2 dim: 3 dim: 8 dim: 8") + '''
    layer { name: "c" type: "Convolution" bottom: "data" top: "c"
            convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
    layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" batch_norm_param { eps: 0 } }
    layer { name: "c2" type: "Convolution" bottom: "c" top: "c2"
            convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "xavier" } } }
    layer { name: "bn2" type: "BatchNorm" bottom: "c2" top: "c2" }
    ''', random=False)
    net.params["c"][0].data[1] = 0  # channel 1 is constant (its bias): variance 0
    notes = fill_statistics(net, seed=3)
    assert len(notes) == 2 and "1 of 4 channels constant" in notes[0]
    bn = net.layer_dict["bn"]
    assert bn.blobs[2].data[0] == 1 and bn.blobs[0].data[1] == 0 and bn.blobs[1].data[1] == 1
    from pycaffe_lite.onnx.check import random_feeds

    net.blobs["data"].data[...] = random_feeds(net, {"data": (2, 3, 8, 8)}, 3)["data"]
    net.forward()
    y = net.blobs["c2"].data
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(y.var(axis=(0, 2, 3)), 1, rtol=1e-3)
    assert fill_statistics(net) == []  # set statistics are left alone
    assert export_net(net, None).checks[0].ok


def test_mask_near_ties_pass_layer_by_layer(monkeypatch):
    """A difference upstream within the tolerance (an AbsVal exported with 2.4e-7 added to the
    first cell of every 2x2 window) flips each window's near tie (1 and the next float32): the
    mask differs end to end by whole cells, yet MaxPool on our own input picks the same cells."""
    load_converters()
    bump = np.zeros((1, 1, 4, 4), np.float32)
    bump[..., ::2, ::2] = 2.4e-7

    def bumped(ctx):
        return [ctx.op("Add", [ctx.op("Abs", [ctx.bottoms[0]]), ctx.const("bump", bump)], ctx.out(0))]

    monkeypatch.setitem(CONVERTERS, "AbsVal", bumped)
    net = make_net(INPUT.format(dims="dim: 1 dim: 1 dim: 4 dim: 4") + '''
    layer { name: "abs" type: "AbsVal" bottom: "data" top: "a" }
    layer { name: "pool" type: "Pooling" bottom: "a" top: "p" top: "mask" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
    ''')
    x = np.full((1, 1, 4, 4), 1.0, np.float32)
    x[..., 1::2, 1::2] = np.nextafter(np.float32(1), np.float32(2))  # the last cell of each window wins, barely
    strict = export_net(net, None, check_inputs=[{"data": x}], random_check=False, raise_on_mismatch=False,
                        layer_recheck=False).checks[0]
    verdicts = {(r.row.layer, r.row.top): r.verdict for r in strict.rows}
    assert verdicts[("abs", "a")] == "ok" and verdicts[("pool", "mask")] == "MISMATCH", strict.table()
    assert np.all(net.blobs["mask"].data == [[[[5, 7], [13, 15]]]])
    result = export_net(net, None, check_inputs=[{"data": x}], random_check=False).checks[0]
    mask = [r for r in result.rows if r.row.top == "mask"][0]
    assert mask.verdict == "ok (layer)" and mask.detail == "layer alone 0" and result.ok


def test_relu6_swish_sigmoid_alone():
    """On inputs from -60 to 60 (ties at 0 and 6 included): ReLU6's Clip is exact, Sigmoid and
    Swish (ONNX Runtime's Sigmoid against our 0.5·tanh(0.5·x) + 0.5) within 2e-7 of their range."""
    body = "".join(f'layer {{ name: "{t.lower()}" type: "{t}" bottom: "data" top: "{t.lower()}" }}\n'
                   for t in ("ReLU6", "Sigmoid", "Swish"))
    body += 'layer { name: "swish2" type: "Swish" bottom: "data" top: "swish2" swish_param { beta: 2.5 } }\n'
    net = make_net(INPUT.format(dims="dim: 1 dim: 1 dim: 201 dim: 601") + body)
    x = np.linspace(-60, 60, 201 * 601, dtype=np.float32).reshape(1, 1, 201, 601)
    x[0, 0, 0, :4] = [0, 6, -0.0, 6]
    result = export_net(net, None, check_inputs=[{"data": x}], random_check=False, layer_recheck=False).checks[0]
    rel = {r.row.layer: r.rel for r in result.rows}
    assert rel["relu6"] == 0 and all(rel[k] < 2e-7 for k in ("sigmoid", "swish", "swish2")), result.table()
