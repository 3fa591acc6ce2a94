"""pycaffe-driven passes (``net.forward()``, ``net.backward()``, ``forward_backward_all``) go through
the executor's graph path: warm-up, capture, replay of the whole device range, with host writes made
between calls uploaded before a replay. CPU tests emulate the capture (a fake graph whose launch re-runs
the captured work); GPU-marked tests compare replayed and plain results bit for bit."""

from __future__ import annotations

import contextlib
import sys
import types

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.runtime import executor as ex_mod

NET = """
name: 'replay' force_backward: true
layer { name: 'data' type: 'Input' top: 'data' input_param { shape { dim: 3 dim: 5 } } }
layer { name: 'ip1' type: 'InnerProduct' bottom: 'data' top: 'ip1'
        inner_product_param { num_output: 4 weight_filler { type: 'gaussian' std: 0.5 } } }
layer { name: 'relu' type: 'ReLU' bottom: 'ip1' top: 'r1' }
layer { name: 'ip2' type: 'InnerProduct' bottom: 'r1' top: 'out'
        inner_product_param { num_output: 2 weight_filler { type: 'gaussian' std: 0.5 } } }
"""


def _net(tmp_path) -> caffe.Net:
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    return caffe.Net(str(path), caffe.TEST)


# -- the decisions of _Graphs.run, with fake memories and a fake capture --------------------------
class _Mem:
    def __init__(self, host_newer: bool = False) -> None:
        self.host_newer, self.uploads, self.device_newest, self.head = host_newer, 0, 0, "host"

    def host_is_newer(self) -> bool:
        return self.host_newer

    def gpu(self) -> None:
        self.uploads += 1
        self.host_newer = False

    def has_gpu(self) -> bool:
        return True

    def mark_device_newest(self) -> None:
        self.device_newest += 1


TOUCHED: list = []  # the memories the fake-captured work takes device pointers of


@contextlib.contextmanager
def _fake_capture(recording, fail: bool = False):
    yield recording
    recording.touched.update(TOUCHED)
    recording.graph = types.SimpleNamespace(launches=0)
    recording.graph.launch = lambda: setattr(recording.graph, "launches", recording.graph.launches + 1)


@pytest.fixture
def fake_graphs(monkeypatch):
    monkeypatch.setattr(ex_mod.cuda_graph, "capture", _fake_capture)
    monkeypatch.setattr(ex_mod.conv_engines, "graph_timing", contextlib.nullcontext)


def test_warm_up_then_capture_then_replay_uploading_host_writes(fake_graphs, monkeypatch):
    mems = [_Mem(), _Mem(), _Mem()]
    monkeypatch.setattr(sys.modules[__name__], "TOUCHED", mems[:2])  # the work uses 0 and 1, not 2
    graphs = ex_mod._Graphs(lambda: iter(mems), host_newer=lambda: [m for m in mems if m.host_newer])
    calls = []
    graphs.run("k", lambda: calls.append("run"))  # warm-up: plain
    assert calls == ["run"] and graphs.captures == 0 and graphs.replays == 0
    graphs.run("k", lambda: calls.append("run"))  # capture (work recorded) + first launch
    assert calls == ["run", "run"] and graphs.captures == 1 and graphs.replays == 1
    mems[1].host_newer = mems[2].host_newer = True  # the user wrote blob.data between calls
    graphs.run("k", lambda: calls.append("run"))
    assert calls == ["run", "run"], "a replay must not re-run the Python work"
    assert graphs.replays == 2 and mems[1].uploads == 1 and mems[0].uploads == 0
    assert mems[2].uploads == 0 and mems[2].host_newer  # not the graph's: left for whoever needs it
    graphs.run("other", lambda: calls.append("other"))  # a new key warms up on its own
    assert calls[-1] == "other" and graphs.captures == 1


def test_failed_capture_falls_back_once_and_restores_heads(monkeypatch):
    @contextlib.contextmanager
    def failing(recording):
        yield recording

    monkeypatch.setattr(ex_mod.cuda_graph, "capture", failing)
    monkeypatch.setattr(ex_mod.conv_engines, "graph_timing", contextlib.nullcontext)
    mem = _Mem()
    graphs = ex_mod._Graphs(lambda: iter([mem]))
    calls: list[int] = []

    def work() -> None:
        calls.append(1)
        if len(calls) == 2:
            mem.head = "device"
            raise RuntimeError("host read during capture")

    graphs.run("k", work)
    graphs.run("k", work)  # capture raises: heads restored, plain run
    assert mem.head == "host" and len(graphs.fallbacks) == 1 and "host read" in graphs.fallbacks[0]
    graphs.run("k", work)
    graphs.run("k", work)
    assert len(calls) == 5 and graphs.replays == 0 and len(graphs.fallbacks) == 1


# -- net.forward / net.backward from Python reach the graph path ----------------------------------
@pytest.fixture
def emulated_capture(monkeypatch):
    """CPU emulation: every range counts as capturable while graphs are on; a captured graph re-runs its Python work."""
    monkeypatch.setattr(ex_mod.Executor, "_capturable", lambda self, s, e, safe_hooks=False: self.use_graphs)
    monkeypatch.setattr(ex_mod.conv_engines, "graph_timing", contextlib.nullcontext)
    monkeypatch.setattr(ex_mod.Executor, "_key", lambda self, tag: (tag, ex_mod.shape_generation()))
    # no device here: count the host-newer memories a replay would upload instead of uploading
    uploads: list[int] = []
    monkeypatch.setattr(ex_mod._Graphs, "_upload_host_writes",
                        lambda self, skip=(), only=None: uploads.append(sum(m.host_is_newer() for m in self._memories())))
    keys: list = []
    orig = ex_mod._Graphs._capture

    def capture(self, key, work):
        @contextlib.contextmanager
        def cap(recording):
            yield recording
            recording.graph = types.SimpleNamespace(launch=work)

        monkeypatch.setattr(ex_mod.cuda_graph, "capture", cap)
        keys.append(key[0])
        return orig(self, key, work)

    monkeypatch.setattr(ex_mod._Graphs, "_capture", capture)
    return types.SimpleNamespace(keys=keys, uploads=uploads)


def test_pycaffe_loop_captures_forward_and_backward_ranges(tmp_path, emulated_capture):
    rng = np.random.default_rng(0)
    net = _net(tmp_path)
    ref = _net(tmp_path)
    for name in net.params:
        for p, q in zip(net.params[name], ref.params[name]):
            q.data[...] = p.data
    for _ in range(5):
        x = rng.standard_normal((3, 5))
        g = rng.standard_normal((3, 2))
        out = net.forward(data=x)["out"].copy()
        grads = net.backward(out=g)["data"].copy()
        with caffe.using_config(cuda_graphs=False, fusion=False):
            ref.executor.use_graphs = False
            ref_out = ref.forward(data=x)["out"].copy()
            ref_grads = ref.backward(out=g)["data"].copy()
        # independent numpy reference of the net
        w1, b1 = ref.params["ip1"][0].data, ref.params["ip1"][1].data
        w2, b2 = ref.params["ip2"][0].data, ref.params["ip2"][1].data
        h = x @ w1.T + b1
        np.testing.assert_allclose(out, np.maximum(h, 0) @ w2.T + b2, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(grads, ((g @ w2) * (h > 0)) @ w1, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out, ref_out)
        np.testing.assert_array_equal(grads, ref_grads)
    assert emulated_capture.keys == [("forward", 0, 3), ("backward", 3, 0)], emulated_capture.keys
    assert emulated_capture.uploads and min(emulated_capture.uploads) > 0  # new inputs / top diffs
    assert net.executor.captures == 2 and net.executor.replays == 8 and net.executor.fallbacks == []
    assert ref.executor.replays == 0


def test_user_edits_between_replays_are_used(tmp_path, emulated_capture):
    net = _net(tmp_path)
    x = np.ones((3, 5))
    for _ in range(3):
        net.forward(data=x)
    before = net.blobs["out"].data.copy()
    net.params["ip2"][1].data[...] += 1.0  # net surgery between passes
    net.forward(data=x)
    np.testing.assert_allclose(net.blobs["out"].data, before + 1.0, rtol=1e-6)
    assert net.executor.replays >= 2
