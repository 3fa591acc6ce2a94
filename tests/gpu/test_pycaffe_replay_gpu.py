"""On the device: pycaffe-driven loops (forward(data=...), backward(out=...), user edits of blob data,
params and diffs between calls) replay CUDA graphs and give the plain (graphs off) results."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe

pytestmark = pytest.mark.gpu

NET = """
name: 'replay_gpu' force_backward: true
layer { name: 'data' type: 'Input' top: 'data' input_param { shape { dim: 4 dim: 3 dim: 8 dim: 8 } } }
layer { name: 'conv' type: 'Convolution' bottom: 'data' top: 'conv'
        convolution_param { num_output: 6 kernel_size: 3 pad: 1 weight_filler { type: 'gaussian' std: 0.3 } } }
layer { name: 'bn' type: 'BatchNorm' bottom: 'conv' top: 'bn' batch_norm_param { use_global_stats: true } }
layer { name: 'scale' type: 'Scale' bottom: 'bn' top: 'sc' scale_param { bias_term: true } }
layer { name: 'relu' type: 'ReLU' bottom: 'sc' top: 'sc' }
layer { name: 'ip' type: 'InnerProduct' bottom: 'sc' top: 'out'
        inner_product_param { num_output: 5 weight_filler { type: 'gaussian' std: 0.1 } } }
"""


def _pair(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    rng = np.random.default_rng(3)
    graphed = caffe.Net(str(path), caffe.TEST)
    with caffe.using_config(cuda_graphs=False, fusion=False, share_data=False, share_diffs=False):
        plain = caffe.Net(str(path), caffe.TEST)
    plain.executor.use_graphs = False
    for name in graphed.params:
        for p, q in zip(graphed.params[name], plain.params[name]):
            p.data[...] = rng.uniform(0.5, 1.5, p.data.shape) if name == "bn" else p.data
            q.data[...] = p.data
    return graphed, plain


def _step(net, x, g):
    out = net.forward(data=x)["out"].copy()
    grads = net.backward(out=g)["data"].copy()
    return out, grads, net.params["conv"][0].diff.copy(), net.blobs["sc"].data.copy()


def test_pycaffe_loop_replays_and_matches_plain(tmp_path, gpu_mode):
    graphed, plain = _pair(tmp_path)
    rng = np.random.default_rng(0)
    for step in range(6):
        x = rng.standard_normal((4, 3, 8, 8))
        g = rng.standard_normal((4, 5))
        a = _step(graphed, x, g)
        with caffe.using_config(cuda_graphs=False, fusion=False, share_data=False, share_diffs=False):
            b = _step(plain, x, g)
        for u, v in zip(a, b):
            np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-5)
        if step == 3:  # net surgery and a diff written by hand between passes
            for net in (graphed, plain):
                net.params["ip"][1].data[...] += 0.25
                net.params["conv"][0].diff[...] = 7.0  # the next backward accumulates onto it
    assert graphed.executor.replays >= 4, graphed.executor.fallbacks
    assert graphed.executor.fallbacks == []
    assert plain.executor.replays == 0


def test_replay_is_deterministic_bit_for_bit(tmp_path, gpu_mode):
    graphed, _ = _pair(tmp_path)
    x = np.random.default_rng(1).standard_normal((4, 3, 8, 8))
    g = np.random.default_rng(2).standard_normal((4, 5))
    runs = []
    for _ in range(5):
        graphed.clear_param_diffs()
        runs.append(_step(graphed, x, g))
    assert graphed.executor.replays >= 4
    for u, v in zip(runs[-1], runs[-2]):  # two replays of the same inputs
        np.testing.assert_array_equal(u, v)
    graphed.blobs["data"].data[...] = 0  # a host write the next replay must use
    graphed.forward()
    np.testing.assert_allclose(graphed.blobs["out"].data,
                               np.broadcast_to(graphed.blobs["out"].data[0], (4, 5)), rtol=1e-6)


def test_forward_backward_all_replays(tmp_path, gpu_mode):
    graphed, plain = _pair(tmp_path)
    x = np.random.default_rng(5).standard_normal((12, 3, 8, 8)).astype(np.float32)
    for _ in range(3):
        blobs, diffs = graphed.forward_backward_all(blobs=["sc"], diffs=["conv"], data=x)
    with caffe.using_config(cuda_graphs=False, fusion=False, share_data=False, share_diffs=False):
        ref_blobs, ref_diffs = plain.forward_backward_all(blobs=["sc"], diffs=["conv"], data=x)
    for name in ("out", "sc"):
        np.testing.assert_allclose(blobs[name], ref_blobs[name], rtol=1e-4, atol=1e-5)
    for name in ("data", "conv"):
        np.testing.assert_allclose(diffs[name], ref_diffs[name], rtol=1e-4, atol=1e-5)
    assert graphed.executor.replays >= 1 and graphed.executor.fallbacks == []


def test_input_diff_returned_to_the_host_is_not_uploaded_before_the_next_backward(tmp_path, gpu_mode, monkeypatch):
    """``net.backward()`` returns the data diff as a host array; the next backward's replay assigns
    that diff whole (the convolution's data gradient) before reading it, so it does not upload the
    host copy first (a user's write into it is overwritten, as Caffe's backward overwrites it)."""
    from pycaffe_lite.synced_memory import SyncedMemory

    graphed, plain = _pair(tmp_path)
    rng = np.random.default_rng(6)
    x, g = rng.standard_normal((4, 3, 8, 8)), rng.standard_normal((4, 5))
    diff_memory = graphed.blobs["data"].diff_memory
    uploads = []
    gpu = SyncedMemory.gpu

    def counted(self):
        if self is diff_memory and self.host_is_newer():
            uploads.append(1)
        return gpu(self)

    monkeypatch.setattr(SyncedMemory, "gpu", counted)
    graphed.forward(data=x)
    for _ in range(4):  # warm-up, capture, replays
        returned = graphed.backward(out=g)["data"]
        returned[...] = 1e6  # written by hand: the next backward overwrites it
    assert graphed.executor.replays > 0
    uploads.clear()
    got = graphed.backward(out=g)["data"].copy()
    assert not uploads
    with caffe.using_config(cuda_graphs=False, fusion=False, share_data=False, share_diffs=False):
        plain.forward(data=x)
        want = plain.backward(out=g)["data"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
