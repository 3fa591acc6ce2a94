"""Shared intermediate data in nets that never run backward (shared_data.SharedData): the plan
never puts two live values in one buffer, outputs are those of the unshared net, and reading any
blob after a forward gives what pycaffe gives (stale values are recomputed, or a clear error)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.net import load_net_param
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.runtime.memory_plan import shared_data_slots, source_blobs
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.synced_memory import SyncedMemory
from pycaffe_lite.testing.nets import fill_weights

ZOO = Path(__file__).resolve().parents[2] / "examples" / "model_zoo"


def _conv(name, bottom, n, k=3, pad=1):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
            f'convolution_param {{ num_output: {n} kernel_size: {k} pad: {pad} }} }}\n')


def _relu(blob):
    return f'layer {{ name: "relu_{blob}" type: "ReLU" bottom: "{blob}" top: "{blob}" }}\n'


def _input(c, hw):
    return f'layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ dim: 2 dim: {c} dim: {hw} dim: {hw} }} }} }}\n'


VGG = (_input(3, 16) + _conv("conv1_1", "data", 8) + _relu("conv1_1") + _conv("conv1_2", "conv1_1", 8)
       + _relu("conv1_2")
       + 'layer { name: "pool1" type: "Pooling" bottom: "conv1_2" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
       + _conv("conv2_1", "pool1", 16) + _relu("conv2_1")
       + 'layer { name: "pool2" type: "Pooling" bottom: "conv2_1" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
       + 'layer { name: "fc6" type: "InnerProduct" bottom: "pool2" top: "fc6" inner_product_param { num_output: 32 } }\n'
       + _relu("fc6")
       + 'layer { name: "drop6" type: "Dropout" bottom: "fc6" top: "fc6" }\n'
       + 'layer { name: "fc7" type: "InnerProduct" bottom: "fc6" top: "fc7" inner_product_param { num_output: 32 } }\n'
       + _relu("fc7")
       + 'layer { name: "fc8" type: "InnerProduct" bottom: "fc7" top: "fc8" inner_product_param { num_output: 5 } }\n'
       + 'layer { name: "prob" type: "Softmax" bottom: "fc8" top: "prob" }\n')

# Inception-like: pool1 feeds four layers (a Split), a Concat, an in-place Conv+BatchNorm+Scale
# chain (fused), a residual Eltwise, a one-bottom Concat and a Flatten (views of their bottoms).
INCEPTION = (_input(3, 12) + _conv("conv1", "data", 8) + _relu("conv1")
             + 'layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
             + _conv("b1", "pool1", 4, 1, 0) + _conv("b2r", "pool1", 4, 1, 0) + _relu("b2r") + _conv("b2", "b2r", 6)
             + 'layer { name: "b3p" type: "Pooling" bottom: "pool1" top: "b3p" pooling_param { pool: MAX kernel_size: 3 stride: 1 pad: 1 } }\n'
             + _conv("b3", "b3p", 3, 1, 0)
             + 'layer { name: "inc" type: "Concat" bottom: "b1" bottom: "b2" bottom: "b3" top: "inc" }\n'
             + _conv("c3", "inc", 8, 1, 0)
             + 'layer { name: "bn3" type: "BatchNorm" bottom: "c3" top: "c3" }\n'
             + 'layer { name: "sc3" type: "Scale" bottom: "c3" top: "c3" scale_param { bias_term: true } }\n'
             + _relu("c3")
             + 'layer { name: "res" type: "Eltwise" bottom: "c3" bottom: "pool1" top: "res" }\n'
             + 'layer { name: "one" type: "Concat" bottom: "res" top: "one" }\n'
             + 'layer { name: "flat" type: "Flatten" bottom: "one" top: "flat" }\n'
             + 'layer { name: "fc" type: "InnerProduct" bottom: "flat" top: "fc" inner_product_param { num_output: 5 } }\n'
             + 'layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }\n')

NETS = {"vgg": VGG, "inception": INCEPTION}


def _net(text: str | caffe_pb2.NetParameter, share: bool = True) -> caffe.Net:
    """A TEST net with fixed random weights; ``share=False``: the reference that keeps every blob."""
    net = caffe.Net(parse_text(text, caffe_pb2.NetParameter()) if isinstance(text, str) else text, caffe.TEST)
    fill_weights(net)
    net.executor.shared_data.disabled = not share
    return net


def _input_values(net: caffe.Net, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(net.blobs["data"].shape).astype(np.float32)


def _count_runs(net: caffe.Net, monkeypatch) -> list[int]:
    """A list that grows by one per layer range the executor runs plainly."""
    runs: list[int] = []
    plain = net.executor._run_forward

    def counting(start, end):
        runs.append(start)
        plain(start, end)

    monkeypatch.setattr(net.executor, "_run_forward", counting)
    monkeypatch.setattr(net.executor.shared_data, "run_forward", counting)  # its re-runs
    return runs


@pytest.mark.parametrize("name", sorted(NETS))
def test_plan_shares_only_values_never_live_together(name):
    net = _net(NETS[name])
    slots = shared_data_slots(net.graph)
    span: dict[int, tuple[int, int]] = {}
    for k in range(len(net.layers)):
        for bid in net.bottom_id_vecs[k] + net.top_id_vecs[k]:
            span[bid] = (span.get(bid, (k, k))[0], k)
    planned = [bids for _, groups in slots for bids in groups]
    assert sum(len(groups) for _, groups in slots) > len(slots)  # something is shared
    by_memory: dict[int, set[int]] = {}
    for bid, blob in enumerate(net._blobs):
        by_memory.setdefault(id(blob.data_memory), set()).add(bid)
    for bids in planned:  # a group is exactly the blobs of one memory
        assert by_memory[id(net._blobs[bids[0]].data_memory)] == set(bids)
    for nbytes, groups in slots:
        lives = [(min(span[b][0] for b in g), max(span[b][1] for b in g)) for g in groups]
        assert all(net._blobs[g[0]].data_memory.nbytes <= nbytes for g in groups)
        for (_, end), (start, _) in zip(lives, lives[1:]):  # in forward order, one after the other
            assert end < start, [net._blob_names[g[0]] for g in groups]
    never = source_blobs(net.graph) | set(net.output_blob_indices)
    assert never and not never & {b for g in planned for b in g}
    if name == "inception":  # the Split of pool1 is one group; the Flatten is a view of "one"
        groups = {frozenset(net._blob_names[b] for b in g) for g in planned}
        assert any({"pool1", "pool1_pool1_0_split_0"} <= g for g in groups)
        assert any({"res", "one", "flat"} <= g for g in groups)


def test_memory_a_layer_holds_itself_is_never_shared():
    text = (_input(3, 8) + _conv("c1", "data", 4) + _conv("c2", "c1", 4)
            + 'layer { name: "spp" type: "SPP" bottom: "c2" top: "spp" spp_param { pyramid_height: 2 } }\n'
            + 'layer { name: "fc" type: "InnerProduct" bottom: "spp" top: "fc" inner_product_param { num_output: 3 } }\n')
    net = _net(text)
    planned = {net._blob_names[b] for _, groups in shared_data_slots(net.graph) for g in groups for b in g}
    assert planned == {"c1", "spp"}  # c2 is also the SPP's internal splits' memory
    shared, ref = _net(text), _net(text, share=False)
    x = _input_values(ref)
    np.testing.assert_array_equal(shared.forward(data=x)["fc"], ref.forward(data=x)["fc"])


@pytest.mark.slow
def test_vgg16_deploy_plan_needs_less_memory_than_its_blobs():
    param = load_net_param(ZOO / "vgg16_deploy.prototxt")
    param.layer[0].input_param.shape[0].dim[0] = 2
    net = caffe.Net(param, caffe.TEST)
    blobs = sum({id(b.data_memory): b.data_memory.nbytes for b in net._blobs}.values())
    slots = shared_data_slots(net.graph)
    planned = sum(net._blobs[g[0]].data_memory.nbytes for _, groups in slots for g in groups)
    assert blobs - planned + sum(n for n, _ in slots) < 0.5 * blobs


@pytest.mark.parametrize("name", sorted(NETS))
def test_outputs_equal_with_and_without_sharing(name, mode):
    shared, ref = _net(NETS[name]), _net(NETS[name], share=False)
    for seed in (1, 2, 3):  # on the GPU: a plain run, a capture, a replay
        x = _input_values(ref, seed)
        expect = {k: v.copy() for k, v in ref.forward(data=x).items()}
        got = shared.forward(data=x)
        for k in expect:
            np.testing.assert_array_equal(got[k], expect[k])
    slots, alone = shared.executor.shared_data.planned_bytes()
    assert 0 < slots < alone
    assert not ref.executor.shared_data.slots


@pytest.mark.parametrize("name", sorted(NETS))
def test_reading_a_stale_blob_reruns_the_forward(name, mode, monkeypatch, caplog):
    shared, ref = _net(NETS[name]), _net(NETS[name], share=False)
    x = _input_values(ref)
    for net in (shared, ref):
        net.forward(data=x)
        net.forward(data=x)
    sd = shared.executor.shared_data
    stale = [shared._blob_names[b] for b in sorted(sd.stale)]
    assert stale
    runs = _count_runs(shared, monkeypatch)
    np.testing.assert_array_equal(shared.blobs["prob"].data, ref.blobs["prob"].data)  # an output
    assert not runs and sd.slots  # no re-run, still sharing
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        first = shared.blobs[stale[0]].data
    assert runs and not sd.slots and sd.disabled and not sd.stale
    assert sum("memory of their own" in r.getMessage() for r in caplog.records) == 1
    np.testing.assert_array_equal(first, ref.blobs[stale[0]].data)
    for name_ in shared.blobs:  # every blob now holds what the unshared net holds
        np.testing.assert_array_equal(shared.blobs[name_].data, ref.blobs[name_].data, err_msg=name_)
    n = len(runs)
    shared.forward(data=_input_values(ref, 5))  # sharing stays off: intermediates stay readable
    ref.forward(data=_input_values(ref, 5))
    assert not sd.slots and not sd.stale
    for name_ in shared.blobs:
        np.testing.assert_array_equal(shared.blobs[name_].data, ref.blobs[name_].data, err_msg=name_)
    assert len(runs) > n


@pytest.mark.parametrize("name", ["squeezenet_v1_1", pytest.param("bvlc_googlenet", marks=pytest.mark.slow)])
def test_zoo_deploy_nets_equal_with_and_without_sharing(name, mode):
    param = load_net_param(ZOO / f"{name}_deploy.prototxt")
    param.layer[0].input_param.shape[0].dim[0] = 1
    shared, ref = _net(param), _net(param, share=False)
    x = _input_values(ref)
    for _ in range(3):
        expect = {k: v.copy() for k, v in ref.forward(data=x).items()}
        got = shared.forward(data=x)
        for k in expect:
            np.testing.assert_array_equal(got[k], expect[k])
    assert len(shared.executor.shared_data.stale) > 40
    for blob in ref.blobs:  # the first read re-runs the forward; then every value is pycaffe's
        np.testing.assert_array_equal(shared.blobs[blob].data, ref.blobs[blob].data, err_msg=blob)


def test_touching_a_current_shared_blob_unshares_without_rerun(monkeypatch):
    shared, ref = _net(VGG), _net(VGG, share=False)
    x = _input_values(ref)
    shared.forward(data=x)
    ref.forward(data=x)
    sd = shared.executor.shared_data
    current = [shared._blob_names[b] for b in sorted(sd._planned - sd.stale)]
    runs = _count_runs(shared, monkeypatch)
    shared.blobs[current[0]].data[...] = 7.0  # the user's write survives a later re-run
    assert not runs and sd.disabled and sd.stale
    stale = shared._blob_names[min(sd.stale)]
    np.testing.assert_array_equal(shared.blobs[stale].data, ref.blobs[stale].data)
    assert runs
    assert (shared.blobs[current[0]].data == 7.0).all()
    np.testing.assert_array_equal(shared.blobs["prob"].data, ref.blobs["prob"].data)


def test_changed_input_then_stale_read_is_a_clear_error():
    net = _net(VGG)
    net.forward(data=_input_values(net))
    stale = net._blob_names[min(net.executor.shared_data.stale)]
    net.blobs["data"].data[...] = 0.0
    with pytest.raises(NetError, match=rf"blob '{stale}'.*'data' changed since.*forward\(blobs=.*PYCAFFE_LITE_SHARE_DATA=0"):
        _ = net.blobs[stale].data
    net.forward()  # a new forward makes every value current again
    np.testing.assert_array_equal(net.blobs[stale].data, _rerun_reference(VGG, np.zeros_like(_input_values(net)))[stale])


def test_input_written_through_a_kept_array_is_noticed():
    net = _net(VGG)
    data = net.blobs["data"].data  # kept from before the forward, as feeding loops do
    data[...] = _input_values(net)
    net.forward()
    data[...] = 0.0
    with pytest.raises(NetError, match="'data' changed since"):
        _ = net.blobs[net._blob_names[min(net.executor.shared_data.stale)]].data


@pytest.mark.slow
def test_weights_changed_through_params_then_stale_read_is_an_error():
    net = _net(VGG)
    net.forward(data=_input_values(net))
    stale = net._blob_names[min(net.executor.shared_data.stale)]
    assert net.params["conv1_1"][0].data.any()  # a read: the re-run may still happen
    np.testing.assert_array_equal(net.blobs[stale].data, _rerun_reference(VGG, _input_values(net))[stale])
    net = _net(VGG)
    net.forward(data=_input_values(net))
    net.params["conv1_1"][0].data[...] *= 2
    with pytest.raises(NetError, match=r"the weights of layer 'conv1_1' \(param 0\) changed since"):
        _ = net.blobs[stale].data


def test_nets_that_cannot_rerun_do_not_share():
    power = 'layer { name: "scale" type: "Power" bottom: "data" top: "data" power_param { scale: 2 } }\n'
    net = _net(VGG.replace(_input(3, 16), _input(3, 16) + power, 1))  # a re-run would scale again
    net.forward(data=_input_values(net))
    assert not net.executor.shared_data.slots


def test_a_failed_forward_leaves_shared_values_stale(monkeypatch):
    net = _net(VGG)
    net.forward(data=_input_values(net))
    plain = net.executor._run_forward

    def failing(start, end):
        plain(start, end)
        raise RuntimeError("layer failed")

    monkeypatch.setattr(net.executor, "_run_forward", failing)
    monkeypatch.setattr(net.executor.shared_data, "run_forward", failing)  # its re-runs
    with pytest.raises(RuntimeError):
        net.forward(data=_input_values(net))
    sd = net.executor.shared_data
    assert sd._planned and sd._planned <= sd.stale
    with pytest.raises(RuntimeError, match="layer failed"):  # a read re-runs, and fails the same way
        _ = net.blobs["fc7"].data


def _rerun_reference(text: str, x: np.ndarray) -> dict[str, np.ndarray]:
    ref = _net(text, share=False)
    ref.forward(data=x)
    return {k: b.data.copy() for k, b in ref.blobs.items()}


def test_reading_the_input_alone_keeps_the_rerun_possible(monkeypatch):
    net = _net(VGG)
    x = _input_values(net)
    net.forward(data=x)
    assert net.blobs["data"].data.sum() == x.sum()  # read, not changed
    stale = net._blob_names[min(net.executor.shared_data.stale)]
    np.testing.assert_array_equal(net.blobs[stale].data, _rerun_reference(VGG, x)[stale])


@pytest.mark.parametrize("name", sorted(NETS))
@pytest.mark.slow
def test_forward_blobs_are_kept_and_read_without_rerun(name, mode, monkeypatch):
    shared = _net(NETS[name])
    x = _input_values(shared)
    shared.forward(data=x)
    wanted = sorted(shared._blob_names[b] for b in shared.executor.shared_data.stale)[:2]
    expect = _rerun_reference(NETS[name], x)
    for _ in range(3):
        out = shared.forward(blobs=wanted, data=x)
    runs = _count_runs(shared, monkeypatch)
    for blob in wanted:
        np.testing.assert_array_equal(out[blob], expect[blob])
        np.testing.assert_array_equal(shared.blobs[blob].data, expect[blob])
    sd = shared.executor.shared_data
    assert not runs and sd.slots and not sd.disabled
    assert not {shared._blob_name_to_idx[b] for b in wanted} & sd._planned
    everything = shared.forward_all(blobs=wanted, data=np.concatenate([x, x]))
    np.testing.assert_array_equal(everything[wanted[0]], np.concatenate([expect[wanted[0]]] * 2))
    assert sd.slots


def test_ranges_turn_sharing_off_and_read_what_pycaffe_gives():
    shared, ref = _net(VGG), _net(VGG, share=False)
    x = _input_values(ref)
    for net in (shared, ref):
        net.forward(data=x)
        net.forward(start="conv2_1")  # reads pool1, stale in the shared net: re-run first
    sd = shared.executor.shared_data
    assert sd.disabled and not sd.slots and not sd.stale
    for name in ref.blobs:
        np.testing.assert_array_equal(shared.blobs[name].data, ref.blobs[name].data, err_msg=name)


def test_range_from_the_start_leaves_later_values_stale():
    net = _net(VGG)
    x = _input_values(net)
    net.forward(data=x)
    y = _input_values(net, 9)
    net.blobs["data"].data[...] = y
    out = net.forward(end="pool1")
    np.testing.assert_array_equal(out["pool1"], _rerun_reference(VGG, y)["pool1"])
    assert net.executor.shared_data.disabled
    with pytest.raises(NetError, match="'data' changed since"):
        _ = net.blobs["fc6"].data  # computed by the full forward from x, overwritten since


def test_reshape_replans(mode):
    shared, ref = _net(INCEPTION), _net(INCEPTION, share=False)
    for batch in (2, 3, 1):
        for net in (shared, ref):
            net.blobs["data"].reshape(batch, 3, 12, 12)
            net.reshape()
        x = np.random.default_rng(batch).standard_normal((batch, 3, 12, 12)).astype(np.float32)
        for _ in range(2):
            np.testing.assert_array_equal(shared.forward(data=x)["prob"], ref.forward(data=x)["prob"])
        assert shared.executor.shared_data.slots


def test_switch_off_by_environment_and_for_nets_that_run_backward(monkeypatch):
    with caffe.using_config(share_data=False):
        net = _net(VGG)
        net.forward(data=_input_values(net))
    assert not net.executor.shared_data.slots and not net.executor.shared_data.stale
    net.forward(data=_input_values(net))
    assert net.executor.shared_data.slots
    with caffe.using_config(share_data=False):  # turned off between forwards: own memory again
        net.forward(data=_input_values(net))
    assert not net.executor.shared_data.slots and not net.executor.shared_data.stale
    param = parse_text(VGG, caffe_pb2.NetParameter())
    param.force_backward = True
    forced = caffe.Net(param, caffe.TEST)
    forced.forward(data=_input_values(forced))
    assert not forced.executor.shared_data.slots


def test_synced_memory_shared_storage_round_trip():
    slot = np.zeros(6, np.float32)
    a, b = SyncedMemory(4, np.float32), SyncedMemory(6, np.float32)
    a.use_storage(host=slot[:4])
    b.use_storage(host=slot)
    a.mutable_cpu()[...] = 1.0
    assert slot[:4].sum() == 4 and b.cpu()[:4].sum() == 4  # one buffer
    a.own_storage()
    b.mutable_cpu()[...] = 2.0
    assert a.cpu().sum() == 4 and not a.shared
    a.use_storage()  # memory of its own again, values dropped
    assert a.cpu().sum() == 0 and not a.shared
