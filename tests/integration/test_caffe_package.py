"""``import caffe``: BVLC's module names resolve to pycaffe-lite's objects; _caffe's vector classes;
pycaffe's low-level names (_forward/_backward/_top_ids/_bottom_ids, Net(network_file=...), SGDSolver.lr,
Blob._gpu_*_ptr); Python layers that ``import caffe`` under ``pycaffe-lite train``; the net_spec TypeError;
Detector.detect_selective_search without its external module."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import caffe
import pycaffe_lite
from pycaffe_lite.errors import MissingDependencyError

REPO = Path(__file__).resolve().parents[2]

NET = """
name: "tiny"
force_backward: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "constant" value: 0.2 } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
"""


@pytest.fixture
def net_path(tmp_path):
    p = tmp_path / "tiny.prototxt"
    p.write_text(NET)
    return str(p)


def test_modules_are_pycaffe_lite():
    import caffe.classifier
    import caffe.coord_map
    import caffe.detector
    import caffe.draw
    import caffe.io
    import caffe.net_spec
    import caffe.proto.caffe_pb2
    from caffe.proto import caffe_pb2

    assert caffe.io is pycaffe_lite.io and caffe.draw is pycaffe_lite.draw
    assert caffe.net_spec is pycaffe_lite.net_spec and caffe.coord_map is pycaffe_lite.coord_map
    assert caffe.classifier is pycaffe_lite.classifier and caffe.detector is pycaffe_lite.detector
    assert caffe_pb2 is pycaffe_lite.proto.caffe_pb2 and caffe.proto.caffe_pb2 is caffe_pb2
    for name in ("Net", "Layer", "SGDSolver", "AdamSolver", "NCCL", "Timer", "Classifier", "Detector",
                 "NetSpec", "to_proto", "layers", "params", "get_solver", "set_mode_cpu", "layer_type_list",
                 "init_log", "log", "has_nccl", "set_random_seed", "__version__"):
        assert getattr(caffe, name) is getattr(pycaffe_lite, name), name
    assert caffe.TRAIN == caffe_pb2.TRAIN == 0 and caffe.TEST == caffe_pb2.TEST == 1
    assert caffe.pycaffe.Net is caffe.Net and caffe.pycaffe.SGDSolver is caffe.SGDSolver
    assert caffe._caffe.Net is caffe.Net and caffe._caffe.Layer is caffe.Layer
    from caffe import layers as L
    from caffe import params as P
    assert L.Convolution(L.Input(shape=dict(dim=[1, 1, 4, 4])), num_output=2, kernel_size=3).fn.type_name \
        == "Convolution"
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX


def test_vector_classes(net_path):
    from caffe import _caffe

    net = caffe.Net(net_path, caffe.TEST)
    for name, blobs in net.params.items():
        assert type(blobs) is _caffe.BlobVec, name  # what merge_bn.py tests
        assert blobs[0] is net.layer_dict[name].blobs[0]  # the layer's own blobs, not copies
    assert list(net.params) == ["ip1", "ip2"]
    for cls in (_caffe.BlobVec, _caffe.RawBlobVec, _caffe.LayerVec, _caffe.StringVec, _caffe.IntVec,
                _caffe.DtypeVec, _caffe.NetVec, _caffe.BoolVec):
        v = cls([1, 2])
        v.append(3)
        v.extend([4])
        assert len(v) == 4 and list(v[1:3]) == [2, 3] and isinstance(v, list)
    bv = _caffe.BlobVec()
    b = bv.add_blob(2, 3)
    assert bv[0] is b and b.shape == (2, 3) and not b.data.any()


def test_low_level_forward_backward_and_ids(net_path):
    net = caffe.Net(network_file=net_path, phase=caffe.TEST)
    assert net.phase == caffe.TEST
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    net.blobs["data"].data[...] = x
    names = net._layer_names
    ip1, relu, ip2 = (names.index(n) for n in ("ip1", "relu", "ip2"))
    assert net._forward(0, relu) == 0.0  # no loss layer
    w1, b1 = (p.data for p in net.params["ip1"])
    h = np.maximum(x @ w1.T + b1, 0)
    np.testing.assert_allclose(net.blobs["ip1"].data, h, rtol=1e-5, atol=1e-6)
    net._forward(ip2, ip2)
    w2, b2 = (p.data for p in net.params["ip2"])
    np.testing.assert_allclose(net.blobs["ip2"].data, h @ w2.T + b2, rtol=1e-5, atol=1e-6)
    # backward of the last layer only: d(ip1) = d(ip2) @ W2
    g = np.ones((2, 2), np.float32)
    net.blobs["ip2"].diff[...] = g
    net._backward(ip2, ip2)
    np.testing.assert_allclose(net.blobs["ip1"].diff, g @ w2, rtol=1e-5, atol=1e-6)
    blob_names = net._blob_names
    assert [blob_names[i] for i in net._bottom_ids(ip1)] == ["data"]
    assert [blob_names[i] for i in net._top_ids(ip1)] == ["ip1"]
    assert [blob_names[i] for i in net._top_ids(relu)] == ["ip1"]  # in place
    assert net._bottom_ids(0) == []
    assert type(net._top_ids(ip2)) is caffe._caffe.IntVec


def test_net_keyword_form_with_weights(net_path, tmp_path):
    net = caffe.Net(net_path, caffe.TEST)
    weights = str(tmp_path / "w.caffemodel")
    net.save(weights)
    again = caffe.Net(network_file=net_path, phase=caffe.TEST, weights=weights)
    np.testing.assert_array_equal(again.params["ip1"][0].data, net.params["ip1"][0].data)
    with pytest.raises(TypeError, match="not both"):
        caffe.Net(net_path, network_file=net_path, phase=caffe.TEST)
    with pytest.raises(TypeError, match="missing"):
        caffe.Net(phase=caffe.TEST)


def test_sgd_solver_lr(tmp_path, net_path):
    (tmp_path / "train.prototxt").write_text(NET.replace('name: "tiny"', 'name: "tiny"\n') + """
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 2 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
""")
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "train.prototxt"\nbase_lr: 0.5\nlr_policy: "step"\ngamma: 0.1\nstepsize: 2\n'
                      'max_iter: 10\nsnapshot_after_train: false\n')
    s = caffe.SGDSolver(str(solver))
    assert s.lr == pytest.approx(0.5)
    s.step(2)
    assert s.iter == 2 and s.lr == pytest.approx(0.05)  # 0.5 * 0.1 ** floor(2 / 2)
    s.step(2)
    assert s.lr == pytest.approx(0.005)


def test_blob_gpu_pointer_names_exist():
    # the device path runs in the GPU suite; on the CPU the names exist as BVLC's properties
    assert isinstance(caffe.Blob.__dict__["_gpu_data_ptr"], property)
    assert isinstance(caffe.Blob.__dict__["_gpu_diff_ptr"], property)


@pytest.mark.gpu
def test_blob_gpu_pointers():
    from pycaffe_lite.gpu import backend

    caffe.set_mode_gpu()
    try:
        b = caffe.Blob((3, 4))
        b.data[...] = 7
        ptr = b._gpu_data_ptr
        assert isinstance(ptr, int) and ptr == b.gpu_data()
        host = np.empty(12, np.float32)
        backend.memcpy_dtoh(host, ptr)
        assert (host == 7).all()
        assert isinstance(b._gpu_diff_ptr, int) and b._gpu_diff_ptr != ptr
    finally:
        caffe.set_mode_cpu()


def test_net_spec_type_error_wording():
    from caffe import layers as L

    data = L.DummyData(ntop=2)
    with pytest.raises(TypeError, match=r"^Silence input 0 is not a Top \(type is <class 'tuple'>\)$"):
        L.Silence(data, ntop=0)
    L.Silence(*data, ntop=0)


def test_detect_selective_search_names_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "selective_search_ijcv_with_python", None)  # import fails
    det = object.__new__(caffe.Detector)
    with pytest.raises(MissingDependencyError, match="selective_search_ijcv_with_python.*MATLAB"):
        det.detect_selective_search(["a.jpg"])


def test_detect_selective_search_uses_the_module(monkeypatch, tmp_path):
    calls = {}

    class FakeSS:
        @staticmethod
        def get_windows(files, cmd):
            calls["files"], calls["cmd"] = files, cmd
            return [np.array([[0, 0, 2, 2]])]

    monkeypatch.setitem(sys.modules, "selective_search_ijcv_with_python", FakeSS)
    det = object.__new__(caffe.Detector)
    monkeypatch.setattr(caffe.Detector, "detect_windows", lambda self, pairs: list(pairs))
    out = det.detect_selective_search(["x.jpg"])
    assert calls["cmd"] == "selective_search_rcnn" and Path(calls["files"][0]).is_absolute()
    assert out[0][0] == calls["files"][0] and (out[0][1] == [0, 0, 2, 2]).all()


TWICE = textwrap.dedent("""
        import caffe

        class Twice(caffe.Layer):
            def setup(self, bottom, top):
                assert isinstance(self, caffe.Layer)
            def reshape(self, bottom, top):
                top[0].reshape(*bottom[0].data.shape)
            def forward(self, bottom, top):
                top[0].data[...] = 2 * bottom[0].data
            def backward(self, top, propagate_down, bottom):
                bottom[0].diff[...] = 2 * top[0].diff
    """)
TWICE_NET = """
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 }
                           data_filler { type: "gaussian" } data_filler { type: "constant" } } }
layer { name: "twice" type: "Python" bottom: "data" top: "twice"
        python_param { module: "twice_layer" layer: "Twice" } }
layer { name: "ip" type: "InnerProduct" bottom: "twice" top: "ip"
        inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_python_layer_importing_caffe(tmp_path, monkeypatch):
    """A user's Python layer module starts with ``import caffe`` (BVLC's examples do)."""
    (tmp_path / "twice_layer.py").write_text(TWICE)
    monkeypatch.syspath_prepend(str(tmp_path))
    net = caffe.Net(_write(tmp_path / "net.prototxt", "force_backward: true\n" + TWICE_NET), caffe.TRAIN)
    net.forward()
    np.testing.assert_allclose(net.blobs["twice"].data, 2 * net.blobs["data"].data)
    net.blobs["twice"].diff[...] = 1
    net.backward(start="twice", end="twice")
    np.testing.assert_allclose(net.blobs["data"].diff, 2)


def _write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.slow
def test_python_layer_importing_caffe_trains(tmp_path):
    """... and runs under ``pycaffe-lite train`` and ``caffe train``."""
    (tmp_path / "twice_layer.py").write_text(TWICE)
    (tmp_path / "net.prototxt").write_text(TWICE_NET)
    (tmp_path / "solver.prototxt").write_text('net: "net.prototxt"\nbase_lr: 0.1\nlr_policy: "fixed"\n'
                                              'max_iter: 2\ndisplay: 1\nsnapshot_after_train: false\n')
    env = {"PYTHONPATH": f"{REPO}:{tmp_path}", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    for cmd in (["-m", "pycaffe_lite", "train", "--solver", "solver.prototxt"],
                ["-m", "pycaffe_lite.commands.caffe_cli", "train", "-solver", "solver.prototxt"]):
        r = subprocess.run([sys.executable, *cmd], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "Iteration 1" in r.stderr and "Optimization Done" in r.stderr
