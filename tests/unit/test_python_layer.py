"""Python layers (type "Python") inside nets: param_str, phase, reshape, forward/backward,
param blobs via blobs.add_blob, loss_weight, errors naming the module/class, and a solver run."""

import sys
import textwrap

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.net import Net
from pycaffe_lite.python_layer import BlobVec
from pycaffe_lite.python_layer import Layer as PyLayer

USER_MODULE = textwrap.dedent(
    """
    import numpy as np
    from pycaffe_lite.python_layer import Layer


    class ScaleByParamStr(Layer):
        '''top = bottom * float(param_str); records the calls it gets.'''

        def setup(self, bottom, top):
            self.factor = float(self.param_str) if self.param_str else 10.0
            self.calls = []
            self.seen_phase = self.phase

        def reshape(self, bottom, top):
            self.calls.append("reshape")
            top[0].reshape(*bottom[0].data.shape)

        def forward(self, bottom, top):
            self.calls.append("forward")
            top[0].data[...] = self.factor * bottom[0].data

        def backward(self, top, propagate_down, bottom):
            self.calls.append(("backward", list(propagate_down)))
            if propagate_down[0]:
                bottom[0].diff[...] = self.factor * top[0].diff

        def custom(self):
            return "custom:" + self.param_str


    class Affine(Layer):
        '''top = bottom * w + b with learnable scalars added through blobs.add_blob.'''

        def setup(self, bottom, top):
            self.blobs.add_blob(1)
            self.blobs.add_blob(1)
            self.blobs[0].data[...] = 2.0
            self.blobs[1].data[...] = 0.5

        def reshape(self, bottom, top):
            top[0].reshape(*bottom[0].data.shape)

        def forward(self, bottom, top):
            top[0].data[...] = bottom[0].data * self.blobs[0].data[0] + self.blobs[1].data[0]

        def backward(self, top, propagate_down, bottom):
            self.blobs[0].diff[...] += np.sum(top[0].diff * bottom[0].data)
            self.blobs[1].diff[...] += np.sum(top[0].diff)
            if propagate_down[0]:
                bottom[0].diff[...] = top[0].diff * self.blobs[0].data[0]


    class SquaredSum(Layer):
        '''loss = sum(x^2) / 2 (a Python loss layer, given loss_weight in the prototxt).'''

        def reshape(self, bottom, top):
            top[0].reshape(1)

        def forward(self, bottom, top):
            top[0].data[...] = 0.5 * np.sum(bottom[0].data ** 2)

        def backward(self, top, propagate_down, bottom):
            if propagate_down[0]:
                bottom[0].diff[...] = top[0].diff[0] * bottom[0].data


    class Raiser(Layer):
        def setup(self, bottom, top):
            raise RuntimeError("raised by user setup")


    class NotALayer:
        pass
    """
)


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    d = tmp_path_factory.mktemp("pymod")
    (d / "pl_user_layers.py").write_text(USER_MODULE)
    sys.path.insert(0, str(d))
    yield "pl_user_layers"
    sys.path.remove(str(d))
    sys.modules.pop("pl_user_layers", None)


def _net_text(layer_class, param_str="", extra="", shape=(2, 3)):
    dims = " ".join(f"dim: {d}" for d in shape)
    return f"""
    name: "pynet"
    force_backward: true
    layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dims} }} }} }}
    layer {{ name: "py" type: "Python" bottom: "data" top: "out" {extra}
             python_param {{ module: "pl_user_layers" layer: "{layer_class}" param_str: "{param_str}" }} }}
    """


def _write(tmp_path, text, name="net.prototxt"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_forward_backward_with_param_str(mode, user_module, tmp_path):
    net = Net(_write(tmp_path, _net_text("ScaleByParamStr", "3.5")), caffe.TRAIN)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    out = net.forward(data=x)
    np.testing.assert_allclose(out["out"], 3.5 * x)
    top_diff = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    grads = net.backward(out=top_diff)
    np.testing.assert_allclose(grads["data"], 3.5 * top_diff, rtol=1e-6)
    layer = net.layers[1]
    assert layer.type == "Python"
    assert layer.seen_phase == caffe.TRAIN
    assert layer.custom() == "custom:3.5"  # user methods reachable through net.layers
    assert layer.calls[-1] == ("backward", [True])
    assert "forward" in layer.calls and layer.calls.index("reshape") < layer.calls.index("forward")


def test_phase_and_default_param_str(user_module, tmp_path):
    net = Net(_write(tmp_path, _net_text("ScaleByParamStr")), caffe.TEST)
    assert net.layers[1].seen_phase == caffe.TEST
    assert net.layers[1].param_str == ""
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(net.forward(data=x)["out"], 10 * x)


def test_reshape_follows_input(user_module, tmp_path):
    net = Net(_write(tmp_path, _net_text("ScaleByParamStr", "2")), caffe.TEST)
    net.blobs["data"].reshape(4, 5, 2)
    net.reshape()
    assert net.blobs["out"].shape == (4, 5, 2)
    x = np.random.default_rng(0).standard_normal((4, 5, 2)).astype(np.float32)
    np.testing.assert_allclose(net.forward(data=x)["out"], 2 * x, rtol=1e-6)


def test_param_blobs_added_by_user(mode, user_module, tmp_path):
    net = Net(_write(tmp_path, _net_text("Affine")), caffe.TRAIN)
    assert list(net.params) == ["py"]
    w, b = net.params["py"]
    assert w.shape == (1,) and b.shape == (1,)
    assert isinstance(net.layers[1].blobs, BlobVec)
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    np.testing.assert_allclose(net.forward(data=x)["out"], 2 * x + 0.5)
    net.clear_param_diffs()
    g = np.full((2, 3), 0.5, np.float32)
    net.backward(out=g)
    np.testing.assert_allclose(w.diff, [np.sum(g * x)], rtol=1e-6)
    np.testing.assert_allclose(b.diff, [np.sum(g)], rtol=1e-6)
    np.testing.assert_allclose(net.blobs["data"].diff, 2 * g)


def test_user_params_saved_and_loaded(user_module, tmp_path):
    path = _write(tmp_path, _net_text("Affine"))
    net = Net(path, caffe.TEST)
    net.params["py"][0].data[...] = -3.0
    net.params["py"][1].data[...] = 7.0
    weights = str(tmp_path / "affine.caffemodel")
    net.save(weights)
    loaded = Net(path, weights, caffe.TEST)
    assert loaded.params["py"][0].data[0] == -3.0
    assert loaded.params["py"][1].data[0] == 7.0
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(loaded.forward(data=x)["out"], -3 * x + 7)


def test_python_loss_layer_with_loss_weight(mode, user_module, tmp_path):
    text = _net_text("SquaredSum", extra="loss_weight: 2")
    net = Net(_write(tmp_path, text), caffe.TRAIN)
    assert net.blob_loss_weights["out"] == 2.0
    x = np.array([[1, -2, 3], [0.5, 0, -1]], np.float32)
    net.blobs["data"].data[...] = x
    loss = net.forward_from_to(0, len(net.layers) - 1)
    assert loss == pytest.approx(2 * 0.5 * np.sum(x**2), rel=1e-6)
    net.backward()
    np.testing.assert_allclose(net.blobs["data"].diff, 2 * x, rtol=1e-6)


def test_without_loss_weight_no_loss(user_module, tmp_path):
    net = Net(_write(tmp_path, _net_text("SquaredSum")), caffe.TRAIN)
    net.blobs["data"].data[...] = 1
    assert net.forward_from_to(0, len(net.layers) - 1) == 0.0


def test_missing_module_is_named(tmp_path):
    text = _net_text("X").replace("pl_user_layers", "pl_no_such_module_xyz")
    with pytest.raises(NetError, match="pl_no_such_module_xyz"):
        Net(_write(tmp_path, text), caffe.TEST)


def test_missing_class_is_named(user_module, tmp_path):
    with pytest.raises(NetError, match="no class 'NoSuchLayer'"):
        Net(_write(tmp_path, _net_text("NoSuchLayer")), caffe.TEST)


def test_class_without_hooks_rejected(user_module, tmp_path):
    with pytest.raises(NetError, match="NotALayer"):
        Net(_write(tmp_path, _net_text("NotALayer")), caffe.TEST)


def test_missing_python_param_fields(tmp_path):
    text = """
    layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 } } }
    layer { name: "py" type: "Python" bottom: "data" top: "out" python_param { module: "m" } }
    """
    with pytest.raises(NetError, match="'py'.*'layer'"):
        Net(_write(tmp_path, text), caffe.TEST)


def test_user_exception_propagates(user_module, tmp_path):
    with pytest.raises(RuntimeError, match="raised by user setup"):
        Net(_write(tmp_path, _net_text("Raiser")), caffe.TEST)


def test_base_layer_defaults_and_blobvec():
    layer = PyLayer()
    assert layer.param_str == "" and layer.phase == 0 and layer.type == "Python"
    layer.setup([], [])
    layer.reshape([], [])
    layer.forward([], [])
    layer.backward([], [], [])
    blob = layer.blobs.add_blob(2, 3)
    assert blob.shape == (2, 3) and layer.blobs[0] is blob
    assert np.all(blob.data == 0)
    assert layer.blobs.add_blob().shape == ()
    assert caffe.layer_type_list().count("Python") == 1


def test_python_layer_in_solver(user_module, tmp_path):
    solver_mod = pytest.importorskip("pycaffe_lite.solvers.sgd_solvers", reason="pycaffe_lite solvers not written yet")
    net_text = """
    name: "pysolve"
    layer { name: "data" type: "DummyData" top: "data"
            dummy_data_param { shape { dim: 4 dim: 3 } data_filler { type: "constant" value: 1 } } }
    layer { name: "py" type: "Python" bottom: "data" top: "out"
            python_param { module: "pl_user_layers" layer: "Affine" } }
    layer { name: "loss" type: "Python" bottom: "out" top: "loss" loss_weight: 1
            python_param { module: "pl_user_layers" layer: "SquaredSum" } }
    """
    net_path = _write(tmp_path, net_text, "train.prototxt")
    solver_path = _write(
        tmp_path,
        f'net: "{net_path}"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\n'
        f'display: 0\nsnapshot_after_train: false\nsolver_mode: CPU\n',
        "solver.prototxt",
    )
    solver = solver_mod.SGDSolver(solver_path, progress=False)
    w, b = solver.net.params["py"]
    assert w.data[0] == 2.0 and b.data[0] == 0.5
    solver.step(1)
    # loss = sum((w*1 + b)^2)/2 over 12 items: dL/dw = dL/db = 12 * (w + b) = 30.
    np.testing.assert_allclose(w.data, [2.0 - 0.01 * 30], rtol=1e-5)
    np.testing.assert_allclose(b.data, [0.5 - 0.01 * 30], rtol=1e-5)


@pytest.mark.parametrize("body,kind", [("def broken(:\n    pass\n", "SyntaxError"),
                                       ("import math\nVALUE = 1 / 0\n", "ZeroDivisionError")])
def test_module_failing_at_import_is_named(tmp_path, monkeypatch, body, kind):
    d = tmp_path / "mods"
    d.mkdir()
    (d / "pl_broken_mod.py").write_text(body)
    monkeypatch.syspath_prepend(str(d))
    text = _net_text("X").replace("pl_user_layers", "pl_broken_mod")
    with pytest.raises(NetError, match=rf"module 'pl_broken_mod' named in python_param failed while being imported "
                                       rf"\(.*pl_broken_mod.py:[12]\): {kind}"):
        Net(_write(tmp_path, text), caffe.TEST)
    sys.modules.pop("pl_broken_mod", None)
