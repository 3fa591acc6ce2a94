"""Data only forward passes read (forward_data.ForwardOnlyData): in a TEST net with force_backward
written the published way (Convolution -> BatchNorm -> Scale, a top per layer), the convolutions'
tops share memory; reading one after the forward recomputes it, so every blob's data and diff
read as without sharing; a changed input makes the recomputation a NetError."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.runtime.memory_plan import forward_only_blobs


def _chain(name: str, bottom: str, n: int) -> str:
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" convolution_param {{ '
            f'num_output: {n} kernel_size: 3 pad: 1 weight_filler {{ type: "gaussian" std: 0.3 }} }} }}\n'
            f'layer {{ name: "{name}/bn" type: "BatchNorm" bottom: "{name}" top: "{name}/bn" }}\n'
            f'layer {{ name: "{name}/scale" type: "Scale" bottom: "{name}/bn" top: "{name}/scale" '
            f'scale_param {{ bias_term: true filler {{ type: "gaussian" }} bias_filler {{ type: "gaussian" }} }} }}\n'
            f'layer {{ name: "{name}/relu" type: "ReLU" bottom: "{name}/scale" top: "{name}/scale" }}\n')


NET = ('name: "published" force_backward: true\n'
       'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }\n'
       + _chain("c1", "data", 4) + _chain("c2", "c1/scale", 5) + _chain("c3", "c2/scale", 4)
       + 'layer { name: "fc" type: "InnerProduct" bottom: "c3/scale" top: "fc" inner_product_param { num_output: 3 '
         'weight_filler { type: "gaussian" std: 0.1 } } }\n')


def _net(tmp_path, share: bool):
    path = tmp_path / "published.prototxt"
    path.write_text(NET)
    caffe.set_random_seed(7)
    with caffe.using_config(share_data=share):
        net = caffe.Net(str(path), caffe.TEST, dtype=np.float64)
    rng = np.random.default_rng(3)
    for name in ("c1/bn", "c2/bn", "c3/bn"):
        bn = net.params[name]
        bn[0].data[...] = rng.standard_normal(bn[0].shape)
        bn[1].data[...] = rng.random(bn[1].shape) + 0.5
        bn[2].data[...] = 1.0
    net.blobs["data"].data[...] = rng.standard_normal((2, 3, 8, 8))
    return net


def _run(net, share: bool):
    with caffe.using_config(share_data=share):
        for _ in range(3):  # warm-up, capture, replay on the GPU
            net.forward()
            net.blobs["fc"].diff[...] = np.arange(6.0).reshape(2, 3)
            net.backward()


def test_the_convolution_tops_are_the_forward_only_blobs(tmp_path):
    net = _net(tmp_path, True)
    names = net._blob_names
    assert {names[b] for b in forward_only_blobs(net.graph)} == {"c1", "c2", "c3"}


def test_values_read_as_without_sharing(tmp_path, mode, caplog):
    shared, plain = _net(tmp_path, True), _net(tmp_path, False)
    _run(shared, True)
    _run(plain, False)
    plan = shared.executor.forward_data
    assert plan.planned_bytes()[0] < plan.planned_bytes()[1] and plan.stale  # c1, c2 overwritten by c3
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        for name in reversed(list(plain.blobs)):  # diffs first, then data (stale ones recomputed)
            np.testing.assert_allclose(shared.blobs[name].diff, plain.blobs[name].diff, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(shared.blobs[name].data, plain.blobs[name].data, rtol=1e-12, atol=1e-14)
    assert "only its forward reads" in caplog.text
    for name in plain.params:
        for a, b in zip(shared.params[name], plain.params[name]):
            np.testing.assert_allclose(a.diff, b.diff, rtol=1e-12, atol=1e-14)
    _run(shared, True)  # memory of their own from now on: nothing stale
    assert not shared.executor.forward_data.stale


def test_changed_input_makes_the_recomputation_an_error(tmp_path, mode):
    net = _net(tmp_path, True)
    _run(net, True)
    net.blobs["data"].data[...] += 1.0
    with pytest.raises(NetError, match="'c1'.*changed since"):
        _ = net.blobs["c1"].data


def test_nothing_is_shared_with_sharing_off_or_in_a_net_without_backward(tmp_path):
    net = _net(tmp_path, False)
    _run(net, False)
    assert not net.executor.forward_data.stale and net.executor.forward_data.planned_bytes() == (0, 0)
    path = tmp_path / "deploy.prototxt"
    path.write_text(NET.replace("force_backward: true", ""))
    deploy = caffe.Net(str(path), caffe.TEST)
    assert not deploy.executor.forward_data.candidates  # SharedData plans that net
