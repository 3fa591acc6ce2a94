"""draw: pydot graphs of NetParameters (nodes, edges, labels, phase filter, lr mults) and
rendering with Graphviz (skipped only when the `dot` program is missing)."""

import shutil
import sys
from pathlib import Path

import pytest

from pycaffe_lite import draw
from pycaffe_lite.net_spec import NetSpec
from pycaffe_lite.net_spec import layers as L
from pycaffe_lite.net_spec import params as P
from pycaffe_lite.proto import protoio
from pycaffe_lite.schema import caffe_pb2

pydot = pytest.importorskip("pydot")
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' not installed")

TRAIN_TEST = """
name: "tt"
layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        data_param { source: "x" batch_size: 64 } }
layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TEST }
        data_param { source: "y" batch_size: 100 } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        param { lr_mult: 1 decay_mult: 0.5 } param { lr_mult: 2 }
        convolution_param { num_output: 20 kernel_size: 5 stride: 2 pad: 1 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }
layer { name: "inception/1x1" type: "InnerProduct" bottom: "pool1" top: "inception/1x1"
        inner_product_param { num_output: 10 } }
layer { name: "accuracy" type: "Accuracy" bottom: "inception/1x1" bottom: "label" top: "accuracy"
        include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "inception/1x1" bottom: "label" top: "loss" }
"""


def _net(text=TRAIN_TEST):
    return protoio.parse_text(text, caffe_pb2.NetParameter())


def _labels(graph):
    return {n.get_name().strip('"'): (n.get("label") or "").strip('"') for n in graph.get_nodes()}


def test_graph_nodes_edges_and_labels():
    graph = draw.get_pydot_graph(_net(), "LR")
    labels = _labels(graph)
    assert labels["conv1_Convolution"] == "conv1\\n(Convolution)\\nkernel size: 5\\nstride: 2\\npad: 1"
    assert labels["pool1_Pooling"] == "pool1\\n(AVE Pooling)\\nkernel size: 2\\nstride: 2\\npad: 0"
    assert labels["relu1_ReLU"] == "relu1\\n(ReLU)"
    assert labels["data_blob"] == "data"
    nodes = {n.get_name().strip('"'): n for n in graph.get_nodes()}
    assert nodes["relu1_ReLU"].get("fillcolor") == "#90EE90"  # in-place neuron layer
    assert nodes["conv1_Convolution"].get("fillcolor") == "#FF5050"
    assert nodes["pool1_Pooling"].get("fillcolor") == "#FF9900"
    assert nodes["data_blob"].get("shape") == "octagon"
    edges = {(e.get_source().strip('"'), e.get_destination().strip('"')): e.get("label") for e in graph.get_edges()}
    assert edges[("data_blob", "conv1_Convolution")] == '""'
    assert edges[("conv1_Convolution", "conv1_blob")] == "20"
    assert edges[("mnist_Data", "data_blob")] == "Batch 100"  # last of the same-named layers wins
    assert ("inception/1x1_InnerProduct", "inception/1x1_blob") in edges
    assert ("pool1_blob", "relu1_ReLU") in edges and ("relu1_ReLU", "pool1_blob") in edges


def test_vertical_separator_phase_and_lr_mult():
    graph = draw.get_pydot_graph(_net(), "TB", phase=caffe_pb2.TRAIN, display_lrm=True)
    labels = _labels(graph)
    assert "accuracy_Accuracy" not in labels
    assert labels["conv1_Convolution"].startswith("conv1 (Convolution) kernel size: 5")
    assert labels["conv1_Convolution"].endswith("lr mult: 1 decay mult: 0.5")
    assert labels["relu1_ReLU"] == "relu1 (ReLU) lr mult: 1 decay mult: 1"
    edges = {(e.get_source().strip('"'), e.get_destination().strip('"')): e.get("label") for e in graph.get_edges()}
    assert edges[("mnist_Data", "data_blob")] == "Batch 64"
    test_labels = _labels(draw.get_pydot_graph(_net(), "TB", phase=caffe_pb2.TEST))
    assert "accuracy_Accuracy" in test_labels


def test_include_and_exclude_rejected_with_phase():
    net = _net('layer { name: "x" type: "ReLU" bottom: "a" top: "a" include { phase: TRAIN } exclude { phase: TEST } }')
    with pytest.raises(ValueError, match="'x' has both include and exclude"):
        draw.get_pydot_graph(net, "LR", phase=caffe_pb2.TRAIN)
    assert len(draw.get_pydot_graph(net, "LR").get_nodes()) == 2


def test_raw_is_dot_source():
    src = draw.draw_net(_net(), "LR", ext="raw").decode()
    assert src.startswith("digraph") and "conv1_Convolution" in src and "rankdir=LR" in src


@needs_dot
@pytest.mark.parametrize("ext,magic", [("png", b"\x89PNG"), ("svg", b"<?xml"), ("pdf", b"%PDF")])
def test_render_formats(ext, magic):
    data = draw.draw_net(_net(), "LR", ext=ext)
    assert data.startswith(magic)


@needs_dot
def test_draw_example_prototxts_to_file(caffe_fixtures, tmp_path):
    net = protoio.read_text(caffe_fixtures / "lenet.prototxt", caffe_pb2.NetParameter())
    out = tmp_path / "lenet.png"
    draw.draw_net_to_file(net, str(out), "BT")
    assert out.read_bytes().startswith(b"\x89PNG")
    svg = tmp_path / "lenet.svg"
    draw.draw_net_to_file(net, str(svg), phase=caffe_pb2.TEST, display_lrm=True)
    text = svg.read_text()
    for name in ("conv1", "pool2", "ip2", "prob"):
        assert name in text


EXAMPLE_PROTOTXTS = sorted(
    p for p in (Path(__file__).resolve().parents[2] / "examples").glob("**/*.prototxt") if "solver" not in p.name
)
# Graphviz lays out nets of a hundred layers and more in seconds: those run in the slow step.
LARGE = 60


def _example(path: Path):
    layers = len(protoio.read_text(path, caffe_pb2.NetParameter()).layer)
    return pytest.param(path, id=path.name, marks=[pytest.mark.slow] if layers > LARGE else [])


@needs_dot
@pytest.mark.parametrize("path", [_example(p) for p in EXAMPLE_PROTOTXTS])
def test_draw_repo_examples(path, tmp_path):
    net = protoio.read_text(path, caffe_pb2.NetParameter())
    assert net.layer, f"{path.name} has no layers"
    out = tmp_path / "net.png"
    draw.draw_net_to_file(net, str(out), "TB", phase=caffe_pb2.TRAIN)
    assert out.read_bytes().startswith(b"\x89PNG")


@needs_dot
def test_draw_netspec_net(tmp_path):
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 8, 8]))
    n.conv = L.Convolution(n.data, kernel_size=3, num_output=4)
    n.pool = L.Pooling(n.conv, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    out = tmp_path / "spec.svg"
    draw.draw_net_to_file(n.to_proto(), str(out))
    assert "MAX Pooling" in out.read_text()


def test_missing_dot_message(monkeypatch):
    monkeypatch.setattr(draw.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="Graphviz 'dot'"):
        draw.draw_net(_net(), "LR", ext="png")


def test_missing_pydot_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydot", None)
    with pytest.raises(ImportError, match="pip install pydot"):
        draw.get_pydot_graph(_net(), "LR")
