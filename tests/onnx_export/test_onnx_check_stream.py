"""The export check itself: it streams (ONNX Runtime values fetched in chunks, each compared right
after its layer's forward), writes and runs large models through external data files, reports a
non-finite reference as inconclusive, feeds MemoryData nets through their graph input, and the
command fills normalization statistics so that a net without weights has a finite reference."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_testing import export_and_check, make_net

from pycaffe_lite.commands.cli import main
from pycaffe_lite.onnx import CheckError, InconclusiveCheck, export_net, verify
from pycaffe_lite.onnx.fill import unit_statistics

CHECK = sys.modules["pycaffe_lite.onnx.check"]
RUNS = sys.modules["pycaffe_lite.onnx.runs"]

INPUT = 'name: "t"\nlayer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dims} }} }} }}\n'


def net_text(shape, body: str) -> str:
    return INPUT.format(dims=" ".join(f"dim: {d}" for d in shape)) + body


CONV_NET = net_text((2, 3, 9, 9), '''
layer { name: "c1" type: "Convolution" bottom: "data" top: "c1" convolution_param { num_output: 8 kernel_size: 3 } }
layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "p1" type: "Pooling" bottom: "c1" top: "p1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "c2" type: "Convolution" bottom: "p1" top: "c2" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "s" type: "Softmax" bottom: "c2" top: "s" }
''')


def _rows(result):
    return [(r.row.layer, r.row.top, r.verdict, r.max_abs) for r in result.rows]


def test_chunks_give_the_same_table_with_one_value_per_run(monkeypatch):
    """A chunk budget of 1 byte: one ONNX Runtime run per value (never more than one output), and
    the table equals the one-chunk table."""
    net = make_net(CONV_NET)
    whole = export_net(net, None).checks[0]
    runs: list[list[str]] = []
    run = CHECK.OrtRunner.run

    def counting(self, names, feeds):
        runs.append(list(names))
        return run(self, names, feeds)

    monkeypatch.setattr(CHECK.OrtRunner, "run", counting)
    monkeypatch.setattr(CHECK, "CHUNK_BYTES", 1)
    chunked = export_net(net, None).checks[0]
    assert all(len(names) == 1 for names in runs) and len(runs) == 5, runs  # c1/c1, c1, p1, c2, s
    assert _rows(chunked) == _rows(whole) and chunked.ok
    runs.clear()
    monkeypatch.setattr(CHECK, "CHUNK_BYTES", 2 * 8 * 7 * 7 * 4)  # c1 (2, 8, 7, 7): one chunk per value of it
    assert _rows(export_net(net, None).checks[0]) == _rows(whole)
    assert [len(names) for names in runs] == [1, 1, 3], runs


def test_external_data_file_and_temporary_names(monkeypatch, tmp_path):
    """Weights over the inline limit go to ``<name>.data`` beside the model (written under a
    temporary folder, then renamed); the check runs ONNX Runtime from those files, and the
    report's model holds its weights again afterwards."""
    monkeypatch.setattr(RUNS, "INLINE_BYTES", 0)
    net = make_net(CONV_NET)
    out = tmp_path / "net.onnx"
    report = export_and_check(net, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.onnx", "net.onnx.data"]  # no temporary left
    stored = onnx.load(str(out), load_external_data=False)
    external = {t.name for t in stored.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    inline = report.exported.model.graph.initializer
    assert all(t.data_location != onnx.TensorProto.EXTERNAL and t.raw_data for t in inline)
    assert external and external == {t.name for t in inline if len(t.raw_data) >= 1024}  # tensors of 1 KiB on
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 9)).astype(np.float32)
    (got,) = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(["s"], {"data": x})
    net.blobs["data"].data[...] = x
    net.forward()
    np.testing.assert_allclose(got, net.blobs["s"].data, atol=1e-6)
    # no path: the check moves the weights to a temporary folder and back
    report = export_and_check(net, None)
    assert all(t.raw_data for t in report.exported.model.graph.initializer)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the layer's own 0 / 0
def test_non_finite_reference_is_inconclusive():
    """eps 0 and zero statistics: 0 / 0 everywhere. The blob was printed as 'ok (all 0)' (NaN in
    both runtimes); now it is inconclusive and so is the check (InconclusiveCheck, not a pass)."""
    net = make_net(net_text((2, 3, 4, 4), '''
    layer { name: "zero" type: "Power" bottom: "data" top: "z" power_param { scale: 0 } }
    layer { name: "bn" type: "BatchNorm" bottom: "z" top: "bn" batch_norm_param { eps: 0 use_global_stats: true } }
    layer { name: "relu" type: "ReLU" bottom: "bn" top: "r" }
    '''), random=False)
    report = export_net(net, None, raise_on_mismatch=False)
    result = report.checks[0]
    verdicts = {r.row.layer: r.verdict for r in result.rows}
    assert verdicts["bn"] == "inconclusive" and verdicts["zero"] == "ok (all 0)"
    assert result.status == "INCONCLUSIVE" and not result.ok and not result.failures
    table = result.table()
    assert "inconclusive (96 NaN in the reference)" in table and "INCONCLUSIVE:" in table and "PASS" not in table
    with pytest.raises(InconclusiveCheck, match=r"layer 'bn' \(BatchNorm\), top 'bn' \(96 NaN"):
        verify(result)
    assert issubclass(InconclusiveCheck, CheckError)
    assert unit_statistics(net)  # mean 0, variance 1, factor 1: finite, the check passes
    assert export_net(net, None).checks[0].ok


def test_mismatch_before_a_non_finite_blob_fails():
    """The first blob that is not ok decides: a mismatch before the non-finite blob is a FAIL."""
    net = make_net(CONV_NET)
    result = export_net(net, None).checks[0]
    result.rows[1].verdict = "MISMATCH"
    result.rows[3].verdict = "inconclusive"
    assert result.status == "FAIL"
    result.rows[1].verdict, result.rows[3].verdict = "inconclusive", "MISMATCH"
    assert result.status == "INCONCLUSIVE"


def test_memory_data_is_a_graph_input():
    net = make_net('''name: "m"
    layer { name: "mem" type: "MemoryData" top: "data" top: "label"
            memory_data_param { batch_size: 2 channels: 3 height: 5 width: 5 } }
    layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 4 kernel_size: 3 } }
    layer { name: "ip" type: "InnerProduct" bottom: "c" top: "ip" inner_product_param { num_output: 3 } }
    ''')
    for dynamic in (False, True):
        report = export_and_check(net, dynamic_batch=dynamic)
        assert list(report.exported.inputs) == ["data"] and report.exported.inputs["data"] == (2, 3, 5, 5)
        assert any("'label' dropped" in n for n in report.exported.notes)
    layer = net.layers[0]
    assert layer._data is None  # the layer's own (absent) arrays restored: no data until Reset
    data = np.ones((4, 3, 5, 5), np.float32)
    net.set_input_arrays(data, np.zeros(4, np.float32))
    export_and_check(net)
    assert layer._data is not None and layer.pos == 0 and layer.n == 4


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # log of negative inputs
def test_command_fills_statistics_and_exits_3_when_inconclusive(tmp_path, capsys):
    """Without --weights: BatchNorm statistics set to unit variance (a deep stack of eps 0
    BatchNorms would divide by 0); a net whose own forward is NaN anyway (log of negative inputs)
    exits with status 3, 'inconclusive'."""
    layers = "".join(f'layer {{ name: "c{i}" type: "Convolution" bottom: "{"data" if i == 0 else f"c{i - 1}"}" '
                     f'top: "c{i}" convolution_param {{ num_output: 4 kernel_size: 1 weight_filler {{ type: "xavier" }} }} }}\n'
                     f'layer {{ name: "bn{i}" type: "BatchNorm" bottom: "c{i}" top: "c{i}" batch_norm_param {{ eps: 0 }} }}\n'
                     for i in range(4))
    deploy = tmp_path / "bn.prototxt"
    deploy.write_text(net_text((1, 4, 3, 3), layers))
    code = main(["export_onnx", "--model", str(deploy), "--output", str(tmp_path / "bn.onnx")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "layer 'bn0' (BatchNorm): no weights given; statistics measured on a random input" in out
    assert "PASS: 9 blobs agree" in out
    log = tmp_path / "log.prototxt"
    log.write_text(net_text((1, 2, 3, 3), 'layer { name: "log" type: "Log" bottom: "data" top: "y" }\n'))
    code = main(["export_onnx", "--model", str(log), "--output", str(tmp_path / "log.onnx")])
    captured = capsys.readouterr()
    assert code == 3, captured.out
    assert "INCONCLUSIVE" in captured.out and "inconclusive: pycaffe-lite's own forward is not finite" in captured.err


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_v2_deploy", "mobilenet_v1_deploy"])
def test_command_example_without_weights(name, tmp_path, capsys):
    """The shipped MobileNet deploy files without weights, batch dynamic. Before the statistics
    were filled, v2's first ReLU6 (a Clip(0, 6)) differed by 2.3e-5 of its range (rounding carried
    from a BatchNorm that multiplied its input by 316) and v1's BatchNorms overflowed to inf."""
    from pathlib import Path

    deploy = Path(__file__).resolve().parents[2] / "examples" / "model_zoo" / f"{name}.prototxt"
    code = main(["export_onnx", "--model", str(deploy), "--output", str(tmp_path / "m.onnx"), "--dynamic-batch"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "PASS:" in out and "WARNING" not in out
    if name == "mobilenet_v2_deploy":
        relu1 = [line for line in out.splitlines() if line.startswith("relu1 ")]
        assert relu1 and relu1[0].split()[1] == "Clip" and relu1[0].endswith(" ok")


def test_unwritable_output_is_a_clear_error(tmp_path, monkeypatch):
    from pycaffe_lite.onnx import ExportError

    net = make_net(CONV_NET)
    for inline in (True, False):
        if not inline:
            monkeypatch.setattr(RUNS, "INLINE_BYTES", 0)
        with pytest.raises(ExportError, match=r"cannot write .*missing/net.onnx"):
            export_net(net, tmp_path / "missing" / "net.onnx")
    assert list(tmp_path.iterdir()) == []
