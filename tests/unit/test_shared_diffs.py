"""Shared gradient buffers in pycaffe-driven backward passes (shared_diffs.SharedDiffs): TEST-phase
nets with ``force_backward`` give, for every blob diff read in any order after ``net.backward()``,
what the same net gives with sharing off; param diffs accumulate as without sharing; stale diffs
whose recomputation lost its inputs raise a NetError; ranges, ``backward(diffs=...)`` and
``forward_backward_all`` keep pycaffe's results. ``mode`` runs each test on the CPU and, marked
``gpu``, on the GPU (where pycaffe ranges replay CUDA graphs)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import common
from pycaffe_lite.errors import NetError
from pycaffe_lite.gpu import backend
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.runtime.memory_plan import BackwardRange, shared_diff_slots
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.nets import fill_weights


def _cbs(name, bottom, n, k=1, stride=1, group=1, relu=True):
    """Convolution -> BatchNorm (own top, as MobileNet writes it) -> Scale in place -> ReLU in place."""
    pad = k // 2
    text = (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" convolution_param {{ '
            f'num_output: {n} kernel_size: {k} stride: {stride} pad: {pad} group: {group} bias_term: false }} }}\n'
            f'layer {{ name: "{name}/bn" type: "BatchNorm" bottom: "{name}" top: "{name}/bn" }}\n'
            f'layer {{ name: "{name}/scale" type: "Scale" bottom: "{name}/bn" top: "{name}/bn" '
            f'scale_param {{ bias_term: true }} }}\n')
    if relu:
        text += f'layer {{ name: "{name}/relu" type: "ReLU" bottom: "{name}/bn" top: "{name}/bn" }}\n'
    return text


def _block(name, bottom, c_in, c_out, stride):
    """An inverted residual block: expand 1x1, depthwise 3x3, project 1x1 (linear), sum when it fits."""
    text = (_cbs(f"{name}/expand", bottom, 2 * c_in) + _cbs(f"{name}/dw", f"{name}/expand/bn", 2 * c_in, 3, stride, 2 * c_in)
            + _cbs(f"{name}/project", f"{name}/dw/bn", c_out, relu=False))
    if stride == 1 and c_in == c_out:
        text += (f'layer {{ name: "{name}/sum" type: "Eltwise" bottom: "{bottom}" bottom: "{name}/project/bn" '
                 f'top: "{name}/sum" }}\n')
        return text, f"{name}/sum"
    return text, f"{name}/project/bn"


def _mobilenet() -> str:
    text = ('name: "mobile" force_backward: true\n'
            'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 16 dim: 16 } } }\n'
            + _cbs("conv1", "data", 8, 3, 2))
    top = "conv1/bn"
    for name, c_in, c_out, stride in (("b1", 8, 8, 1), ("b2", 8, 12, 2), ("b3", 12, 12, 1)):
        block, top = _block(name, top, c_in, c_out, stride)
        text += block
    return text + (f'layer {{ name: "pool" type: "Pooling" bottom: "{top}" top: "pool" '
                   'pooling_param { pool: AVE global_pooling: true } }\n'
                   'layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc" inner_product_param { num_output: 5 } }\n'
                   'layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }\n')


def _cbs_inplace(name, bottom, n, k=1, stride=1, relu=True):
    """ResNet's way: Convolution, then BatchNorm, Scale and ReLU all in place on its top."""
    text = (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" convolution_param {{ '
            f'num_output: {n} kernel_size: {k} stride: {stride} pad: {k // 2} bias_term: false }} }}\n'
            f'layer {{ name: "bn_{name}" type: "BatchNorm" bottom: "{name}" top: "{name}" }}\n'
            f'layer {{ name: "scale_{name}" type: "Scale" bottom: "{name}" top: "{name}" scale_param {{ bias_term: true }} }}\n')
    if relu:
        text += f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{name}" top: "{name}" }}\n'
    return text


def _resnet() -> str:
    text = ('name: "res" force_backward: true\n'
            'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 12 dim: 12 } } }\n'
            + _cbs_inplace("conv1", "data", 8, 3)
            + 'layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n')
    bottom = "pool1"
    for name, n, stride in (("res2a", 8, 1), ("res3a", 12, 2)):
        if stride != 1 or name == "res3a":
            text += _cbs_inplace(f"{name}_branch1", bottom, n, 1, stride, relu=False)
            shortcut = f"{name}_branch1"
        else:
            shortcut = bottom
        text += (_cbs_inplace(f"{name}_branch2a", bottom, n, 1, stride) + _cbs_inplace(f"{name}_branch2b", f"{name}_branch2a", n, 3)
                 + _cbs_inplace(f"{name}_branch2c", f"{name}_branch2b", n, 1, relu=False)
                 + f'layer {{ name: "{name}" type: "Eltwise" bottom: "{shortcut}" bottom: "{name}_branch2c" top: "{name}" }}\n'
                 + f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{name}" top: "{name}" }}\n')
        bottom = name
    return text + (f'layer {{ name: "pool5" type: "Pooling" bottom: "{bottom}" top: "pool5" '
                   'pooling_param { pool: AVE kernel_size: 3 stride: 1 } }\n'
                   'layer { name: "flat" type: "Flatten" bottom: "pool5" top: "flat" }\n'
                   'layer { name: "fc" type: "InnerProduct" bottom: "flat" top: "fc" inner_product_param { num_output: 5 } }\n')


NETS = {"mobilenet": _mobilenet(), "resnet": _resnet()}


def _net(text: str) -> caffe.Net:
    """A TEST net with fixed random weights (BatchNorm on positive variances, factor 1)."""
    net = caffe.Net(parse_text(text, caffe_pb2.NetParameter()), caffe.TEST)
    fill_weights(net)
    return net


def _pair(name: str) -> tuple[caffe.Net, caffe.Net]:
    """(net sharing diffs, reference net): the same weights; call the reference under _plain()."""
    return _net(NETS[name]), _net(NETS[name])


def _plain():
    return caffe.using_config(share_diffs=False)


def _inputs(net: caffe.Net, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = net.blobs[net.outputs[0]]
    return (rng.standard_normal(net.blobs["data"].shape).astype(np.float32),
            rng.standard_normal(out.shape).astype(np.float32))


def _pass(net: caffe.Net, x: np.ndarray, g: np.ndarray) -> None:
    net.forward(data=x)
    net.backward(**{net.outputs[0]: g})


def _assert_diffs_equal(net: caffe.Net, ref: caffe.Net, order) -> None:
    for name in order:
        np.testing.assert_allclose(net.blobs[name].diff, ref.blobs[name].diff, rtol=1e-5, atol=1e-6, err_msg=name)


def _assert_param_diffs_equal(net: caffe.Net, ref: caffe.Net) -> None:
    for name, blobs in net.params.items():
        for i, (a, b) in enumerate(zip(blobs, ref.params[name])):
            np.testing.assert_allclose(a.diff, b.diff, rtol=1e-5, atol=1e-6, err_msg=f"{name}[{i}]")


@pytest.mark.parametrize("name", sorted(NETS))
@pytest.mark.slow
def test_plan_shares_only_diffs_never_live_together(name):
    net = _net(NETS[name])
    last = len(net.layers) - 1
    rng = BackwardRange(net.graph, last, 0)
    slots = shared_diff_slots(net.graph)
    assert sum(len(groups) for _, groups in slots) > len(slots)  # something is shared
    planned = {b for _, groups in slots for group in groups for b in group}
    assert not planned & {net._blob_names.index(n) for n in ("data", net.outputs[0])}
    for nbytes, groups in slots:
        spans = [rng.touched[id(net._blobs[g[0]].diff_memory)] for g in groups]
        assert all(net._blobs[g[0]].diff_memory.nbytes <= nbytes for g in groups)
        for i, (a0, a1) in enumerate(spans):  # in their order of use, each ends before the next starts
            for b0, b1 in spans[i + 1:]:
                assert a1 < b0 or b1 < a0
    for group in (g for _, groups in slots for g in groups):  # a Flatten's top and bottom: one group
        assert len({id(net._blobs[b].diff_memory) for b in group}) == 1
        assert all(id(net._blobs[b].diff_memory) not in rng.seeds for b in group)


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
@pytest.mark.parametrize("name", sorted(NETS))
@pytest.mark.slow
def test_every_diff_after_backward_equals_unshared(name, order, mode):
    net, ref = _pair(name)
    for seed in (1, 2, 3):  # on the GPU: warm-up, capture, replay
        x, g = _inputs(net, seed)
        _pass(net, x, g)
        with _plain():
            _pass(ref, x, g)
    shared = net.executor.shared_diffs
    assert shared.slots and shared.stale  # the pass shared buffers and left stale diffs
    names = list(net.blobs)
    names = {"forward": names, "reverse": names[::-1],
             "shuffled": list(np.random.default_rng(4).permutation(names))}[order]
    _assert_diffs_equal(net, ref, names)
    _assert_diffs_equal(net, ref, names)  # and again, un-shared now
    _assert_param_diffs_equal(net, ref)
    assert shared.disabled and not shared.slots and not shared.stale


@pytest.mark.slow
def test_unsharing_logs_one_line_naming_the_blob(caplog):
    net, _ = _pair("mobilenet")
    _pass(net, *_inputs(net))
    stale = net._blob_names[min(net.executor.shared_diffs.stale)]
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        _ = net.blobs[stale].diff
        _ = net.blobs[net._blob_names[max(net.executor.shared_diffs.stale or {0})]].diff
    lines = [r.getMessage() for r in caplog.records if "diff memory of their own" in r.getMessage()]
    assert len(lines) == 1 and f"blob '{stale}'" in lines[0] and "PYCAFFE_LITE_SHARE_DIFFS=0" in lines[0]


@pytest.mark.parametrize("name", sorted(NETS))
@pytest.mark.slow
def test_param_diffs_accumulate_as_without_sharing(name, mode):
    net, ref = _pair(name)
    for seed in (1, 2, 3):  # no clearing in between: param diffs accumulate, as in pycaffe
        x, g = _inputs(net, seed)
        _pass(net, x, g)
        with _plain():
            _pass(ref, x, g)
        _assert_param_diffs_equal(net, ref)
    stale = net._blob_names[min(net.executor.shared_diffs.stale)]
    _assert_diffs_equal(net, ref, [stale])  # the re-run must not accumulate again
    _assert_param_diffs_equal(net, ref)
    x, g = _inputs(net, 4)
    _pass(net, x, g)
    with _plain():
        _pass(ref, x, g)
    _assert_param_diffs_equal(net, ref)
    _assert_diffs_equal(net, ref, list(net.blobs))


@pytest.mark.slow
def test_reading_params_and_data_keeps_stale_diffs_recomputable(mode):
    net, ref = _pair("resnet")
    x, g = _inputs(net)
    _pass(net, x, g)
    with _plain():
        _pass(ref, x, g)
    _ = net.blobs["data"].data.sum() + net.blobs["fc"].data.sum() + net.params["conv1"][0].data.sum()
    net.blobs["data"].data[...] = x  # written with the same values
    _assert_diffs_equal(net, ref, list(net.blobs))


@pytest.mark.parametrize("change", ["input", "forward", "weights", "kept array"])
@pytest.mark.slow
def test_stale_diff_after_its_inputs_changed_raises(change, mode):
    net, _ = _pair("mobilenet")
    x, g = _inputs(net)
    kept = net.blobs["data"].data
    _pass(net, x, g)
    stale = net._blob_names[min(net.executor.shared_diffs.stale)]
    if change == "input":
        net.blobs["data"].data[...] = x + 1
    elif change == "forward":
        net.forward(data=x + 1)
    elif change == "weights":
        net.params["conv1"][0].data[...] *= 2
    else:  # an array kept from an earlier access, written without asking
        kept[...] = x + 1
        _ = net.blobs["data"].data  # (on the GPU the write reaches the device only through an access)
    with pytest.raises(NetError, match="PYCAFFE_LITE_SHARE_DIFFS=0") as err:
        _ = net.blobs[stale].diff
    assert "backward(diffs=" in str(err.value)
    if change != "forward":
        assert ("weights of layer 'conv1'" if change == "weights" else "blob 'data'") in str(err.value)
    # a new backward gives every diff again
    x, g = _inputs(net, 5)
    _pass(net, x, g)
    ref = _net(NETS["mobilenet"])
    for name, blobs in net.params.items():
        for a, b in zip(blobs, ref.params[name]):
            b.data[...] = a.data
    with _plain():
        _pass(ref, x, g)
    _assert_diffs_equal(net, ref, list(net.blobs))


@pytest.mark.slow
def test_output_diff_written_after_backward_does_not_change_the_recomputed_diffs(mode):
    net, ref = _pair("mobilenet")
    x, g = _inputs(net)
    _pass(net, x, g)
    with _plain():
        _pass(ref, x, g)
    net.blobs["prob"].diff[...] = 7  # the seed of the last backward, changed afterwards
    np.testing.assert_array_equal(net.blobs["prob"].diff, 7)
    _assert_diffs_equal(net, ref, [b for b in net.blobs if b != "prob"])


@pytest.mark.slow
def test_backward_diffs_returns_and_keeps_the_named_diffs(mode):
    net, ref = _pair("resnet")
    wanted = ["conv1", "res2a_branch2a", "pool5"]
    for seed in (1, 2, 3):
        x, g = _inputs(net, seed)
        net.forward(data=x)
        got = net.backward(diffs=wanted, fc=g)
        with _plain():
            ref.forward(data=x)
            want = ref.backward(diffs=wanted, fc=g)
        assert set(got) == set(want) == {"data", *wanted}
        for n in got:
            np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-6, err_msg=n)
    shared = net.executor.shared_diffs
    ids = {net._blob_names.index(n) for n in wanted}
    assert shared.slots and not ids & set(shared._planned) and not ids & shared.stale
    assert not shared.disabled  # nothing stale was read


@pytest.mark.slow
def test_forward_backward_all_equals_unshared(mode):
    net, ref = _pair("mobilenet")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 3, 16, 16)).astype(np.float32)
    g = rng.standard_normal((5, 5)).astype(np.float32)
    for _ in range(3):
        outs, diffs = net.forward_backward_all(blobs=["pool"], diffs=["b2/project/bn"], data=x, prob=g)
    with _plain():
        ref_outs, ref_diffs = ref.forward_backward_all(blobs=["pool"], diffs=["b2/project/bn"], data=x, prob=g)
    for n in ref_outs:
        np.testing.assert_allclose(outs[n], ref_outs[n], rtol=1e-5, atol=1e-6)
    for n in ref_diffs:
        np.testing.assert_allclose(diffs[n], ref_diffs[n], rtol=1e-5, atol=1e-6)
    assert net.executor.shared_diffs.slots


@pytest.mark.parametrize("name,layer", [("mobilenet", "b2/dw/relu"), ("resnet", "res2a_relu")])
@pytest.mark.slow
def test_deep_dream_ranges(name, layer, mode):
    """forward(end=L); blobs[L].diff = g; backward(start=L); the data diff, then every diff."""
    net, ref = _pair(name)
    top = net.top_names[layer][0]
    for seed in (1, 2, 3):
        x, _ = _inputs(net, seed)
        g = np.random.default_rng(seed).standard_normal(net.blobs[top].shape).astype(np.float32)
        for n, run in ((net, False), (ref, True)):
            with caffe.using_config(share_diffs=not run):
                n.forward(data=x, end=layer)
                n.blobs[top].diff[...] = g
                n.backward(start=layer)
        np.testing.assert_allclose(net.blobs["data"].diff, ref.blobs["data"].diff, rtol=1e-5, atol=1e-6)
    assert net.executor.shared_diffs.slots
    _assert_diffs_equal(net, ref, list(net.blobs)[::-1])
    _assert_param_diffs_equal(net, ref)


@pytest.mark.slow
def test_ranges_mixed_with_full_passes(mode):
    """A full backward, then one from a middle layer: diffs it does not write keep their values."""
    net, ref = _pair("resnet")
    x, g = _inputs(net)
    layer = "res3a_relu"
    top = net.top_names[layer][0]
    h = np.random.default_rng(9).standard_normal(net.blobs[top].shape).astype(np.float32)
    for n, run in ((net, False), (ref, True)):
        with caffe.using_config(share_diffs=not run):
            _pass(n, x, g)
            n.blobs[top].diff[...] = h
            n.backward(start=layer, end="res3a_branch2a")
    _assert_diffs_equal(net, ref, list(net.blobs))
    _assert_param_diffs_equal(net, ref)


@pytest.mark.slow
def test_planned_diff_bytes_drop_for_a_mobilenet():
    net = _net(NETS["mobilenet"])
    net.blobs["data"].reshape(16, 3, 32, 32)
    net.reshape()
    _pass(net, *_inputs(net))
    slots, alone = net.executor.shared_diffs.planned_bytes()
    every = sum(b.diff_memory.nbytes for b in {id(b.diff_memory): b for b in net._blobs}.values())
    assert alone > 0.8 * every and slots < 0.25 * alone, (slots, alone, every)


@pytest.mark.slow
def test_sharing_off_keeps_every_diff():
    net = _net(NETS["mobilenet"])
    with _plain():
        _pass(net, *_inputs(net))
    assert not net.executor.shared_diffs.slots and not net.executor.shared_diffs.stale


@pytest.mark.slow
def test_cpu_training_with_shared_diffs_equals_without():
    """The solver's plain iteration (CPU) shares too; after it, stale diffs are gone for good."""
    text = NETS["resnet"].replace("force_backward: true", "") + (
        'layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 2 } } }\n'
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }\n')
    weights = {}
    for share in (True, False):
        with caffe.using_config(share_diffs=share):
            sp = caffe_pb2.SolverParameter(base_lr=0.05, lr_policy="fixed", momentum=0.9, max_iter=10, display=0,
                                           random_seed=5, type="SGD")
            sp.net_param.CopyFrom(parse_text(text, caffe_pb2.NetParameter()))
            solver = caffe.get_solver(sp, progress=False)
            solver.net.blobs["data"].data[...] = _inputs(solver.net)[0]
            solver.net.blobs["label"].data[...] = [1, 3]
            solver.step(3)
            weights[share] = {n: [b.data.copy() for b in bs] for n, bs in solver.net.params.items()}
            if share:
                stale = solver.net._blob_names[min(solver.net.executor.shared_diffs.stale)]
                with pytest.raises(NetError, match="weights of layer"):
                    _ = solver.net.blobs[stale].diff
    for name, blobs in weights[True].items():
        for a, b in zip(blobs, weights[False][name]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_regenerated_scale_inputs_must_not_change_before_backward(monkeypatch, mode):
    """On the GPU a Scale after a BatchNorm with its own top keeps no copy of its input (its
    backward regenerates it from the BatchNorm's input). On the CPU the layers save it anyway; the
    check is the same (forced here)."""
    net, ref = _pair("mobilenet")
    assert [net.layers[k].type for k, *_ in net.executor._recomputed()] == ["Scale"] * 10
    assert not _net(NETS["resnet"]).executor._recomputed()  # BatchNorm in place: nothing to regenerate from
    monkeypatch.setattr(net.executor, "_recompute_on", lambda: True)
    x, g = _inputs(net)
    net.forward(data=x)
    _ = net.blobs["conv1"].data.sum()  # read (and written with the same values): fine
    net.blobs["conv1"].data[...] = net.blobs["conv1"].data.copy()
    net.backward(prob=g)
    with _plain():
        ref.forward(data=x)
        ref.backward(prob=g)
    _assert_diffs_equal(net, ref, ["data"])
    net.forward(data=x)
    net.blobs["conv1"].data[...] += 1
    with pytest.raises(NetError, match="layer 'conv1/scale'.*blob 'conv1'.*PYCAFFE_LITE_SHARE_DIFFS=0"):
        net.backward(prob=g)
    net.forward(data=x)  # a new forward: fine again
    net.backward(prob=g)
    _assert_diffs_equal(net, ref, ["data"])


@pytest.mark.slow
def test_the_plan_is_made_once_per_range_and_graphs_replay(mode):
    """Later passes reuse the slots (on the GPU: no allocation, so the captured graphs replay)."""
    net, ref = _pair("mobilenet")
    shared = net.executor.shared_diffs
    for seed in range(1, 7):
        x, g = _inputs(net, seed)
        _pass(net, x, g)
        if seed == 4:
            slots = list(shared.slots)
            generation = _alloc_generation()
    assert all(a is b for a, b in zip(slots, shared.slots)) and len(slots) == len(shared.slots) > 0
    assert _alloc_generation() == generation
    if common.mode() is common.Mode.GPU:  # forward and backward ranges: warm-up, capture, replays
        assert net.executor.replays >= 6 and not net.executor.fallbacks
        # the Scale layers after a BatchNorm with its own top never saved their input
        assert all(not scale._saved.data_memory.has_gpu() for _, scale, _, _ in net.executor._recomputed())
    with _plain():
        _pass(ref, x, g)
    _assert_diffs_equal(net, ref, list(net.blobs))


def _alloc_generation() -> int:
    return backend.state().alloc_generation if common.mode() is common.Mode.GPU else 0


@pytest.mark.parametrize("how", ["kwargs", "setter"])
@pytest.mark.slow
def test_a_diff_set_whole_after_new_data_needs_no_recomputation(how, mode):
    """After a full pass and a new forward, a gradient set on a (stale) blob and a backward from
    there work; diffs that backward does not write are lost (their recomputation would need the
    old data), reading one is a NetError."""
    net, ref = _pair("resnet")
    x, g = _inputs(net)
    layer, top = "res3a_relu", "res3a"
    h = np.random.default_rng(9).standard_normal(net.blobs[top].shape).astype(np.float32)
    for n, run in ((net, False), (ref, True)):
        with caffe.using_config(share_diffs=not run):
            _pass(n, x, g)
            n.forward(data=x + 1)
            if how == "kwargs":
                n.backward(start=layer, end="res3a_branch2a", **{top: h})
            else:
                n.blobs[top].diff = h
                n.backward(start=layer, end="res3a_branch2a")
    assert net._blob_names.index(top) not in net.executor.shared_diffs.stale
    written = ["res3a", "res3a_branch2c", "res3a_branch2b", "res3a_branch2a"]
    _assert_diffs_equal(net, ref, written)
    lost = dict(net.executor.shared_diffs.lost)
    assert lost and not net.executor.shared_diffs.stale
    # every other diff holds what it holds without sharing (the first pass's values below the range)
    _assert_diffs_equal(net, ref, [n for b, n in enumerate(net._blob_names) if b not in lost])
    with pytest.raises(NetError, match="changed since"):
        _ = net.blobs[net._blob_names[min(lost)]].diff
    _pass(net, x, g)  # a full pass writes them all again
    with _plain():
        _pass(ref, x, g)
    _assert_diffs_equal(net, ref, list(net.blobs))


@pytest.mark.slow
def test_per_layer_hooks_keep_every_diff(mode):
    net, _ = _pair("mobilenet")
    seen: list[int] = []
    net.after_backward(seen.append)
    _pass(net, *_inputs(net))
    assert seen and not net.executor.shared_diffs.slots and not net.executor.shared_diffs.stale
