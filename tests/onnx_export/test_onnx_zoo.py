"""ONNX export of whole nets, each proven by the built-in check (every blob within 1e-5 of its
range in ONNX Runtime): the model zoo (fast variants at small inputs, and with the two wide
fully-connected layers narrowed, where the published net needs a large input or 100M weights; the
published nets marked slow), LeNet with BVLC's trained weights and with weights trained here by our
solver, legacy and V1 files, data and loss layers, dynamic batch, fp16 weights, and the command."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_testing import export_and_check, make_net, randomize

from pycaffe_lite import common
from pycaffe_lite.commands.cli import main
from pycaffe_lite.net import Net
from pycaffe_lite.schema import caffe_pb2

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "model_zoo"))
import model_zoo  # noqa: E402

LENET = REPO / "examples" / "mnist" / "lenet.prototxt"


def zoo_net(name: str, size: int, narrow_fc: int | None = None, global_last_pool: str | None = None,
            batch: int = 1, width_div: int = 1) -> Net:
    """A model-zoo net at input size x size (random weights); ``narrow_fc``: fc6/fc7 outputs;
    ``global_last_pool``: that fixed-size pooling made global, for inputs smaller than 224;
    ``width_div``: every ungrouped convolution's outputs divided by it (the weights' size dominates
    the export's time)."""
    param = getattr(model_zoo, name)()
    shape = (batch, 3, size, size)
    if param.input_dim:
        del param.input_dim[:]
        param.input_dim.extend(shape)
    else:
        first = next(lp for lp in param.layer if lp.type == "Input")
        del first.input_param.shape[0].dim[:]
        first.input_param.shape[0].dim.extend(shape)
    for lp in param.layer:
        if narrow_fc and lp.name in ("fc6", "fc7"):
            p = lp.inner_product_param if lp.type == "InnerProduct" else lp.convolution_param
            p.num_output = narrow_fc
        if lp.type == "Convolution" and width_div > 1 and lp.convolution_param.group <= 1:
            lp.convolution_param.num_output = max(1, lp.convolution_param.num_output // width_div)
        if lp.name == global_last_pool:
            pp = lp.pooling_param
            pp.ClearField("kernel_size")
            pp.ClearField("stride")
            pp.global_pooling = True
    common.set_mode_cpu()
    net = Net(param, phase=common.TEST)
    randomize(net)
    return net


FAST = {
    "alexnet": dict(size=67, narrow_fc=64),
    "caffenet": dict(size=67, narrow_fc=64),
    "vgg16": dict(size=32, narrow_fc=64, width_div=4),
    "googlenet": dict(size=32, global_last_pool="pool5/7x7_s1"),
    "resnet50": dict(size=32, global_last_pool="pool5", width_div=8),
    "squeezenet_v1_1": dict(size=64),
    "mobilenet_v1": dict(size=64),
    "mobilenet_v2": dict(size=64),
}
PUBLISHED = {  # the nets as published (weights as large as the real ones), at their input size or the least they take
    "alexnet": 227, "caffenet": 227, "vgg16": 224, "googlenet": 224, "resnet50": 224, "squeezenet_v1_1": 227,
    "mobilenet_v1": 224, "mobilenet_v2": 224, "fcn32s": 64,
}


@pytest.mark.parametrize("name", sorted(FAST))
@pytest.mark.slow
def test_zoo_fast(name):
    net = zoo_net(name, **FAST[name])
    report = export_and_check(net)
    checked = [r for r in report.checks[0].rows if r.verdict == "ok"]
    assert len(checked) > 10
    assert report.exported.outputs == net.outputs


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_zoo_published(name, tmp_path):
    net = zoo_net(name, PUBLISHED[name])
    export_and_check(net, tmp_path / f"{name}.onnx")
    assert onnx.load(str(tmp_path / f"{name}.onnx")).graph.output[0].name in net.outputs


def test_fcn_structure_fast():
    """FCN-32s's tricks at a small size: conv1 pad 100, fc6/fc7 as convolutions, score, the bilinear
    Deconvolution (group 21, lr 0) and the Crop at offset 19, on a narrowed copy of the net."""
    param = model_zoo.fcn32s(batch=1, size=20)
    keep = {"data", "conv1_1", "relu1_1", "pool1", "fc6", "relu6", "drop6", "score_fr", "upscore", "score"}
    kept = [lp for lp in param.layer if lp.name in keep]
    del param.layer[:]
    param.layer.extend(kept)
    names = {lp.name: lp for lp in param.layer}
    names["conv1_1"].convolution_param.num_output = 4
    names["pool1"].bottom[0] = "conv1_1"
    names["fc6"].bottom[0] = "pool1"
    names["fc6"].convolution_param.num_output = 8
    names["fc6"].convolution_param.kernel_size[0] = 7
    names["score_fr"].bottom[0] = "fc6"
    names["upscore"].convolution_param.stride[0] = 2
    names["upscore"].convolution_param.kernel_size[0] = 4
    common.set_mode_cpu()
    net = Net(param, phase=common.TEST)
    randomize(net)
    up = net.params["upscore"][0]
    f = np.array([0.25, 0.75, 0.75, 0.25])
    up.data[...] = 0
    for c in range(up.shape[0]):
        up.data[c, 0] = np.outer(f, f)  # bilinear x2
    export_and_check(net)


def test_lenet_bvlc_weights(caffe_fixtures, tmp_path):
    weights = caffe_fixtures / "lenet_iter_10000.caffemodel"
    if not weights.exists():
        pytest.skip(f"{weights} not found")
    net = Net(str(LENET), phase=common.TEST, weights=str(weights))
    out = tmp_path / "lenet.onnx"
    report = export_and_check(net, out, input_shapes={"data": (4, 1, 28, 28)})
    assert tuple(net.blobs["data"].shape) == (64, 1, 28, 28)  # restored after the export
    # a digit-like input: the ONNX model and the net agree on the class
    x = np.zeros((4, 1, 28, 28), np.float32)
    x[:, 0, 4:24, 13:16] = 1.0  # a vertical bar: a "1"
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (prob,) = sess.run(["prob"], {"data": x})
    net.blobs["data"].reshape(4, 1, 28, 28)
    net.reshape()
    ref = net.forward(data=x)["prob"]
    np.testing.assert_allclose(prob, ref, atol=1e-5)
    assert report.exported.inputs == {"data": (4, 1, 28, 28)}


def _lenet_train_text() -> str:
    deploy = LENET.read_text()
    body = deploy[deploy.index("layer", deploy.index('type: "Input"')):]  # everything after the Input layer
    body = body[:body.rindex("layer")]  # without the final Softmax
    return ('name: "LeNet"\nlayer { name: "data" type: "DummyData" top: "data" top: "label" dummy_data_param { '
            'shape { dim: 8 dim: 1 dim: 28 dim: 28 } shape { dim: 8 } data_filler { type: "uniform" } '
            'data_filler { type: "constant" value: 3 } } }\n' + body +
            'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }\n'
            'layer { name: "acc" type: "Accuracy" bottom: "ip2" bottom: "label" top: "acc" }\n')


def test_lenet_trained_by_our_solver(tmp_path):
    from google.protobuf import text_format

    from pycaffe_lite.solvers import sgd_solvers

    sp = caffe_pb2.SolverParameter(base_lr=0.01, lr_policy="fixed", momentum=0.9, max_iter=3, random_seed=2,
                                   display=0)
    text_format.Parse(_lenet_train_text(), sp.net_param)
    solver = sgd_solvers.SOLVERS["SGD"](sp, dtype=np.float32, progress=False)
    solver.step(3)
    weights = tmp_path / "lenet_iter_3.caffemodel"
    solver.net.save(str(weights))
    net = Net(str(LENET), phase=common.TEST, weights=str(weights))
    report = export_and_check(net, input_shapes={"data": (2, 1, 28, 28)})
    assert report.checks[0].rows[-1].row.top == "prob"
    # the train net itself: DummyData's tops become inputs (label unused, dropped), loss and
    # accuracy are left out, ip2 (what they read) is the output
    train = make_net(_lenet_train_text(), random=False)
    train.copy_from(str(weights))
    report = export_and_check(train)
    assert list(report.exported.inputs) == ["data"] and report.exported.outputs == ["ip2"]
    notes = " ".join(report.exported.notes)
    assert "'loss' (SoftmaxWithLoss) left out" in notes and "'acc' (Accuracy) left out" in notes


def test_legacy_input_dim_and_v1_layers(tmp_path):
    v1 = tmp_path / "v1.prototxt"
    v1.write_text('''name: "old"
input: "data"
input_dim: 2 input_dim: 3 input_dim: 8 input_dim: 8
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv"
         convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
layers { name: "pool" type: POOLING bottom: "conv" top: "pool" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layers { name: "norm" type: LRN bottom: "pool" top: "norm" lrn_param { local_size: 3 alpha: 0.1 beta: 0.75 } }
''')
    common.set_mode_cpu()
    net = Net(str(v1), phase=common.TEST)
    randomize(net)
    report = export_and_check(net)
    assert report.exported.inputs == {"data": (2, 3, 8, 8)}


@pytest.mark.slow
def test_dynamic_batch():
    net = zoo_net("mobilenet_v1", 32, batch=2)
    report = export_and_check(net, dynamic_batch=True)
    model = report.exported.model
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    x = np.random.default_rng(3).standard_normal((3, 3, 32, 32)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(["fc7"], {"data": x})
    net.blobs["data"].reshape(3, 3, 32, 32)
    net.reshape()
    ref = net.forward(data=x)["fc7"]
    assert y.shape == ref.shape == (3, 1000, 1, 1)
    np.testing.assert_allclose(y, ref, atol=1e-5 * np.abs(ref).max())


def test_dynamic_batch_reshape_and_flatten():
    body = '''name: "t"
    layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } } }
    layer { name: "r" type: "Reshape" bottom: "data" top: "r" reshape_param { shape { dim: 0 dim: -1 dim: 8 } } }
    layer { name: "f" type: "Flatten" bottom: "r" top: "f" }
    layer { name: "ip" type: "InnerProduct" bottom: "f" top: "ip" inner_product_param { num_output: 5 } }
    '''
    net = make_net(body)
    report = export_and_check(net, dynamic_batch=True)
    x = np.random.default_rng(0).standard_normal((5, 3, 4, 4)).astype(np.float32)
    sess = ort.InferenceSession(report.exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(["ip"], {"data": x})
    w, b = (np.array(p.data, np.float64) for p in net.params["ip"])
    np.testing.assert_allclose(y, x.reshape(5, -1) @ w.T + b, rtol=1e-5, atol=1e-5)


def test_fp16_weights(tmp_path):
    net = zoo_net("squeezenet_v1_1", 64)
    before = np.array(net.params["conv1"][0].data, copy=True)
    report = export_and_check(net, tmp_path / "sq16.onnx", fp16=True)
    model = onnx.load(str(tmp_path / "sq16.onnx"))
    kinds = {len(t.dims): t.data_type for t in model.graph.initializer}
    assert kinds[4] == onnx.TensorProto.FLOAT16 and kinds[1] == onnx.TensorProto.FLOAT  # kernels half, biases not
    assert report.checks[0].tol == 1e-5  # our forward on the rounded weights: the same arithmetic
    assert np.array_equal(before, net.params["conv1"][0].data)  # the check restored the weights


@pytest.mark.slow
def test_fp16_with_folded_batchnorm():
    net = zoo_net("mobilenet_v2", 32)
    report = export_and_check(net, fp16=True, fold_bn=True)
    assert report.checks[0].tol == 2e-3  # folded kernels are rounded after folding
    assert not any(n.op_type == "BatchNormalization" for n in report.exported.model.graph.node)


def test_command(tmp_path, capsys):
    x = np.random.default_rng(0).random((1, 1, 28, 28)).astype(np.float32)
    npy = tmp_path / "x.npy"
    np.save(npy, x)
    out = tmp_path / "lenet.onnx"
    code = main(["export_onnx", "--model", str(LENET), "--output", str(out), "--input-shape", "2,1,28,28",
                 "--check-input", str(npy), "--opset", "15"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert out.exists() and onnx.load(str(out)).opset_import[0].version == 15
    assert text.count("PASS: 9 blobs agree") == 2  # random input and the .npy
    assert "check on random input" in text and f"check on {npy}" in text
    assert any(line.split()[:4] == ["conv1", "Convolution", "conv1", "conv1"] for line in text.splitlines())
    code = main(["export_onnx", "-model", str(LENET), "-output", str(tmp_path / "b.onnx"), "--no-check",
                 "--dynamic-batch", "--fold-bn", "--fp16"])
    text = capsys.readouterr().out
    assert code == 0 and "PASS" not in text and (tmp_path / "b.onnx").exists()


def test_command_image_input(tmp_path, capsys):
    from PIL import Image

    img = tmp_path / "digit.png"
    Image.fromarray((np.random.default_rng(1).random((20, 24)) * 255).astype(np.uint8)).save(img)
    code = main(["export_onnx", "--model", str(LENET), "--output", str(tmp_path / "l.onnx"),
                 "--check-input", str(img), "--input-shape", "data=1,1,28,28"])
    assert code == 0
    assert capsys.readouterr().out.count("PASS") == 2


def test_command_errors(tmp_path, capsys):
    bad = tmp_path / "bad.prototxt"
    bad.write_text('name: "b" layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 } } }\n'
                   'layer { name: "py" type: "Python" bottom: "data" top: "y" python_param { module: "os" layer: "x" } }\n')
    code = main(["export_onnx", "--model", str(bad), "--output", str(tmp_path / "x.onnx")])
    err = capsys.readouterr().err
    assert code == 1
    assert "layer 'py' (Python)" in err or "py" in err
    code = main(["export_onnx", "--model", str(LENET), "--output", str(tmp_path / "x.onnx"), "--input-shape", "nope=1,2"])
    assert code == 1 and "'nope' is not an input" in capsys.readouterr().err


def test_net_in_either_mode(mode):
    """A net built and run in GPU mode exports too (weights read back from the device); the check's
    reference runs on the CPU and the mode is restored."""
    from google.protobuf import text_format

    text = '''name: "m"
    layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
    layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 } }
    layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
    layer { name: "sc" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
    layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
    layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
    '''
    net = Net(text_format.Parse(text, caffe_pb2.NetParameter()), phase=common.TEST)
    randomize(net)
    net.forward(data=np.ones((2, 3, 8, 8), np.float32))
    export_and_check(net)
    assert common.mode() is (common.Mode.GPU if mode == "gpu" else common.Mode.CPU)


def test_missing_onnx_names_the_extra(monkeypatch):
    from pycaffe_lite.errors import MissingDependencyError

    net = make_net('name: "x" layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 } } }')
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingDependencyError, match=r"pycaffe-lite\[onnx\]"):
        net.to_onnx(None)


@pytest.mark.slow
def test_cli_does_not_import_onnx():
    import subprocess

    code = ("import sys; from pycaffe_lite.commands import cli; p = cli.build_parser(); "
            "assert 'export_onnx' in p._subparsers._group_actions[0].choices; "
            "assert 'onnx' not in sys.modules and 'onnxruntime' not in sys.modules, 'imported'")
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO)


def test_v0_file_with_padding_layer(tmp_path):
    v0 = tmp_path / "v0.prototxt"
    v0.write_text('''name: "v0"
input: "img"
input_dim: 2 input_dim: 3 input_dim: 7 input_dim: 7
layers { layer { name: "padder" type: "padding" pad: 1 } bottom: "img" top: "padded" }
layers { layer { name: "c" type: "conv" num_output: 5 kernelsize: 3 stride: 2 } bottom: "padded" top: "c" }
layers { layer { name: "p" type: "pool" pool: MAX kernelsize: 3 stride: 2 } bottom: "c" top: "p" }
layers { layer { name: "s" type: "softmax" } bottom: "p" top: "s" }
''')
    common.set_mode_cpu()
    net = Net(str(v0), phase=common.TEST)
    randomize(net)
    report = export_and_check(net)
    assert report.exported.outputs == ["s"] and list(report.exported.inputs) == ["img"]


def test_every_layer_type_is_accounted_for():
    """Each registered layer type has a converter, is a data layer (its tops become inputs) or is
    left out of deploy graphs (losses, Accuracy, Silence, HDF5Output): a new layer type without a
    converter shows up here."""
    from pycaffe_lite.layer import create_layer, layer_class, layer_type_list
    from pycaffe_lite.onnx.registry import DATA_LAYERS, DROPPED, load_converters

    converters = load_converters()
    missing = []
    for t in layer_type_list():
        if not layer_class(t).__module__.startswith("pycaffe_lite.layers."):
            continue  # a type some other test registered for itself
        if t in converters or t in DROPPED or t in DATA_LAYERS or t == "Input":
            continue
        layer = create_layer(caffe_pb2.LayerParameter(name="x", type=t), np.float32)
        if not getattr(layer, "is_loss", False):
            missing.append(t)
    assert not missing, f"layer types without an ONNX converter: {missing}"


@pytest.mark.parametrize("opset", [13, pytest.param(21, marks=pytest.mark.slow)])
def test_zoo_opsets(opset):
    report = export_and_check(zoo_net("mobilenet_v2", 32), opset=opset)
    assert report.exported.model.opset_import[0].version == opset


def test_cifar10_quick_and_the_all_zero_warning():
    path = str(REPO / "examples" / "cifar10" / "cifar10_quick.prototxt")
    common.set_mode_cpu()
    net = Net(path, phase=common.TEST)  # the deploy file has no fillers: every weight 0
    report = export_and_check(net)
    table = report.checks[0].table()
    assert "ok (all 0)" in table and "WARNING: 11 blobs are all 0" in table
    randomize(net)
    table = export_and_check(net).checks[0].table()
    assert "WARNING" not in table and "PASS: 13 blobs agree" in table
