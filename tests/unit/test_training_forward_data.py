"""Forward-only data in training iterations (runtime/training_data.TrainingData): in a TRAIN net that
a solver steps, the data no backward reads (ResNet's in-place Convolution -> BatchNorm -> Scale
blobs that feed only an Eltwise SUM) lives in the backward's gradient slots during the forward.
Training with it on and off gives the same losses and weights; the counted and held bytes go down;
reading a stale blob after an iteration is a NetError naming it, and the next iteration keeps it;
outputs and the loss stay readable. ``mode`` runs each test on the CPU (the plain iteration) and,
marked ``gpu``, on the GPU (whole iterations replayed as CUDA graphs)."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import common
from pycaffe_lite.errors import NetError
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.runtime.memory_plan import (
    forward_only_blobs,
    shared_data_slots,
    training_blob_bytes,
    training_data_blobs,
    training_slots,
)
from pycaffe_lite.schema import caffe_pb2


def _cbs(name: str, bottom: str, n: int, k: int = 3) -> str:
    """Convolution -> BatchNorm -> Scale, all in place on the convolution's top (ResNet's layout)."""
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" convolution_param {{ '
            f'num_output: {n} kernel_size: {k} pad: {k // 2} weight_filler {{ type: "gaussian" std: 0.3 }} }} }}\n'
            f'layer {{ name: "{name}/bn" type: "BatchNorm" bottom: "{name}" top: "{name}" }}\n'
            f'layer {{ name: "{name}/scale" type: "Scale" bottom: "{name}" top: "{name}" '
            f'scale_param {{ bias_term: true filler {{ type: "uniform" min: 0.5 max: 1.5 }} }} }}\n')


def _relu(blob: str) -> str:
    return f'layer {{ name: "{blob}/relu" type: "ReLU" bottom: "{blob}" top: "{blob}" }}\n'


NET = ('name: "tiny_res"\n'
       'layer { name: "input" type: "Input" top: "data" top: "label" '
       'input_param { shape { dim: 4 dim: 3 dim: 8 dim: 8 } shape { dim: 4 } } }\n'
       + _cbs("conv1", "data", 6) + _relu("conv1")
       + _cbs("conv2a", "conv1", 6, 1) + _cbs("conv2b", "conv1", 6)
       + 'layer { name: "sum" type: "Eltwise" bottom: "conv2a" bottom: "conv2b" top: "sum" }\n' + _relu("sum")
       + _cbs("conv3", "sum", 6)
       + 'layer { name: "sum2" type: "Eltwise" bottom: "conv3" bottom: "sum" top: "sum2" }\n' + _relu("sum2")
       + 'layer { name: "pool" type: "Pooling" bottom: "sum2" top: "pool" pooling_param { pool: AVE global_pooling: true } }\n'
         'layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc" '
         'inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }\n'
         'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }\n')
FORWARD_ONLY = {"conv2a", "conv2b", "conv3"}  # in-place chains feeding only a SUM


def _solver(share: bool, iter_size: int = 1):
    on_gpu = common.mode() is common.Mode.GPU
    sp = caffe_pb2.SolverParameter()
    sp.net_param.CopyFrom(parse_text(NET, caffe_pb2.NetParameter()))
    sp.base_lr, sp.momentum, sp.weight_decay, sp.lr_policy = 0.1, 0.9, 1e-3, "fixed"
    sp.max_iter, sp.display, sp.snapshot, sp.snapshot_after_train = 1000, 0, 0, False
    sp.random_seed, sp.iter_size = 3, iter_size
    sp.solver_mode = caffe_pb2.SolverParameter.GPU if on_gpu else caffe_pb2.SolverParameter.CPU
    with caffe.using_config(share_data=share):
        solver = caffe.get_solver(sp, progress=False)
    rng = np.random.default_rng(0)
    solver.net.blobs["data"].data[...] = rng.standard_normal(solver.net.blobs["data"].shape)
    solver.net.blobs["label"].data[...] = rng.integers(0, 3, 4)
    return solver


def _steps(solver, share: bool, n: int) -> list[float]:
    losses = []
    with caffe.using_config(share_data=share):
        for _ in range(n):
            solver.step(1)
            losses.append(float(solver.net.blobs["loss"].data))
    return losses


def _weights(solver) -> dict[str, list[np.ndarray]]:
    return {name: [b.data.copy() for b in blobs] for name, blobs in solver.net.params.items()}


def _same(a, b) -> None:
    if common.mode() is common.Mode.GPU:  # (device reductions may order sums differently)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(a, b)


def _held(solver) -> int:
    """Bytes the net's blob data and diffs hold: memories of their own plus the plan's slots."""
    executor, graph = solver.net.executor, solver.net.graph
    own = {id(m): m.nbytes for blob in graph.blobs for m in (blob.data_memory, blob.diff_memory) if not m.shared}
    return sum(own.values()) + executor.shared_diffs.planned_bytes()[0]


def _graph():
    return caffe.Net(parse_text(NET, caffe_pb2.NetParameter()), caffe.TRAIN).graph


def test_forward_only_blobs_in_training_are_the_in_place_chains_feeding_a_sum():
    graph = _graph()
    names = {graph.blob_names[b] for b in forward_only_blobs(graph, training=True)}
    assert names == FORWARD_ONLY
    assert {graph.blob_names[b] for b in training_data_blobs(graph)} == FORWARD_ONLY
    assert forward_only_blobs(graph) == set()  # the TEST-phase plan (recomputed by a re-run) is another one
    # conv2a and conv2b are live together (both feed sum); conv3 comes after: two slots
    slots = shared_data_slots(graph, only=training_data_blobs(graph))
    assert sorted(len(groups) for _, groups in slots) == [1, 2]


def test_a_backward_reading_the_data_keeps_the_blob():
    text = NET.replace('type: "Eltwise" bottom: "conv3"', 'type: "Eltwise" eltwise_param { operation: PROD } '
                                                            'bottom: "conv3"')
    graph = caffe.Net(parse_text(text, caffe_pb2.NetParameter()), caffe.TRAIN).graph
    assert {graph.blob_names[b] for b in forward_only_blobs(graph, training=True)} == {"conv2a", "conv2b"}


def test_training_slots_put_the_largest_data_into_the_largest_gradient_slot():
    diffs = [(100, [[1], [2]]), (300, [[3], [4]]), (50, [[5]])]
    data = [(200, [[10], [11]]), (400, [[12]])]
    slots = training_slots(diffs, data)
    assert [(s.nbytes, s.diffs, s.data) for s in slots] == [(400, [[3], [4]], [[12]]),
                                                             (200, [[1], [2]], [[10], [11]])]
    # more data slots than gradient slots: the rest keep buffers of their own when shared
    slots = training_slots([(10, [[1], [2]])], data + [(30, [[13], [14]]), (5, [[15]])])
    assert [(s.nbytes, s.diffs, s.data) for s in slots] == [(400, [[1], [2]], [[12]]), (200, [], [[10], [11]]),
                                                             (30, [], [[13], [14]])]
    assert training_slots(diffs, []) == [s for s in training_slots(diffs, []) if len(s.diffs) > 1]


def test_counted_bytes_go_down():
    graph = _graph()
    alone, before = training_blob_bytes(graph, data=False)
    alone2, after = training_blob_bytes(graph, data=True)
    forward_only = sum(graph.blobs[b].data_memory.nbytes for b in training_data_blobs(graph))
    assert alone == alone2 and after < before < alone
    assert before - after <= forward_only


def test_training_with_sharing_on_and_off_gives_the_same_weights_and_losses(mode):
    on, off = _solver(True), _solver(False)
    losses_on, losses_off = _steps(on, True, 6), _steps(off, False, 6)
    _same(losses_on, losses_off)
    assert losses_on[-1] < losses_on[0]  # it trains
    w_on, w_off = _weights(on), _weights(off)
    for name in w_on:
        for a, b in zip(w_on[name], w_off[name]):
            _same(a, b)
    training = on.net.executor.training_data
    names = {on.net.graph.blob_names[b] for b in training.stale}
    assert names == FORWARD_ONLY and training.placed
    assert not off.net.executor.training_data.placed
    assert _held(on) < _held(off)
    if mode == "gpu":  # (warm-ups first: a first run allocates, which re-keys the graph)
        assert on.net.executor.replays > 0 and not on.net.executor.fallbacks


def test_iter_size_two_trains_the_same(mode):
    on, off = _solver(True, iter_size=2), _solver(False, iter_size=2)
    _same(_steps(on, True, 3), _steps(off, False, 3))
    for name, blobs in _weights(on).items():
        for a, b in zip(blobs, _weights(off)[name]):
            _same(a, b)


def test_outputs_loss_and_kept_blobs_stay_readable(mode):
    on, off = _solver(True), _solver(False)
    _steps(on, True, 2)
    _steps(off, False, 2)
    for name in ("loss", "fc", "pool", "sum2", "sum", "conv1"):
        _same(on.net.blobs[name].data, off.net.blobs[name].data)
    _same(on.net.blobs["data"].diff, off.net.blobs["data"].diff)


def test_reading_a_stale_blob_is_an_error_and_the_next_iteration_keeps_it(mode):
    on, off = _solver(True), _solver(False)
    _steps(on, True, 2)
    _steps(off, False, 2)
    with pytest.raises(NetError) as err:
        _ = on.net.blobs["conv3"].data
    message = str(err.value)
    assert "'conv3'" in message and "reused during the" in message and "PYCAFFE_LITE_SHARE_DATA=0" in message
    assert "next iteration" in message
    with pytest.raises(NetError):  # still gone until an iteration runs
        on.net.blobs["conv3"].math_data()
    captures = on.net.executor.captures
    _steps(on, True, 1)
    _steps(off, False, 1)
    training = on.net.executor.training_data
    assert training.disabled and not training.placed and not training.stale
    for name in sorted(FORWARD_ONLY):  # every blob is kept now, with the values sharing off gives
        _same(on.net.blobs[name].data, off.net.blobs[name].data)
    _same(on.net.blobs["loss"].data, off.net.blobs["loss"].data)
    if mode == "gpu":  # the re-plan (memory of their own) captures the iteration again
        for _ in range(6):  # (warm-up first; an allocation re-keys the graph once more)
            _steps(on, True, 1)
            if on.net.executor.captures > captures:
                break
        assert on.net.executor.captures > captures, on.net.executor.fallbacks


def test_writing_a_stale_blob_whole_is_allowed(mode):
    on, off = _solver(True), _solver(False)
    _steps(on, True, 2)
    _steps(off, False, 2)
    values = np.full(on.net.blobs["conv2b"].shape, 0.25, np.float32)
    on.net.blobs["conv2b"].data = values
    np.testing.assert_array_equal(on.net.blobs["conv2b"].data, values)
    _same(_steps(on, True, 2), _steps(off, False, 2))  # sharing goes on; training is unchanged
    assert on.net.executor.training_data.placed and not on.net.executor.training_data.disabled


def test_a_pycaffe_forward_keeps_every_blob(mode):
    on, off = _solver(True), _solver(False)
    _steps(on, True, 2)
    _steps(off, False, 2)
    with caffe.using_config(share_data=True):
        on.net.forward()
    off.net.forward()
    for name in sorted(FORWARD_ONLY) + ["loss"]:
        _same(on.net.blobs[name].data, off.net.blobs[name].data)
    assert not on.net.executor.training_data.placed
    _same(_steps(on, True, 2), _steps(off, False, 2))  # and the next iterations share again
    assert on.net.executor.training_data.placed


def test_share_data_off_places_nothing(mode):
    off = _solver(False)
    _steps(off, False, 2)
    training = off.net.executor.training_data
    assert not training.placed and not training.stale
    for name in FORWARD_ONLY:
        assert off.net.blobs[name].data.shape == (4, 6, 8, 8)


@pytest.mark.gpu
def test_gpu_replays_keep_the_data_in_the_gradient_slots(gpu_mode):
    """Whole iterations replay one graph: the data's device pointers are slot pointers, fixed across
    replays (planned before capture); a stale read re-plans and the graph is captured again."""
    on, off = _solver(True), _solver(False)
    executor = on.net.executor
    for _ in range(10):  # warm-up and capture first (a first run allocates, which re-keys the graph)
        _steps(on, True, 1)
        _steps(off, False, 1)
        if executor.replays > 1:
            break
    assert executor.replays > 1, executor.fallbacks
    blobs = [on.net.blobs[name] for name in sorted(FORWARD_ONLY)]
    slots = {int(slot) for slot in executor.shared_diffs.slots}
    pointers = [blob.gpu_data() for blob in blobs]
    assert set(pointers) <= slots  # each at the start of a gradient slot
    captures, replays = executor.captures, executor.replays
    _same(_steps(on, True, 3), _steps(off, False, 3))
    assert [blob.gpu_data() for blob in blobs] == pointers
    assert executor.captures == captures and executor.replays == replays + 3
    with pytest.raises(NetError):
        on.net.blobs["conv2a"].math_data()
    for _ in range(8):  # the re-plan's warm-up and capture (an allocation re-keys the graph once more)
        _same(_steps(on, True, 1), _steps(off, False, 1))
        if executor.captures > captures:
            break
    now = {int(slot) for slot in executor.shared_diffs.slots}
    assert executor.captures > captures and not executor.training_data.placed
    assert not {blob.gpu_data() for blob in blobs} & now  # memory of their own now
    for blob, name in zip(blobs, sorted(FORWARD_ONLY)):
        _same(blob.data, off.net.blobs[name].data)


def test_a_reshape_between_iterations_plans_again(mode):
    on, off = _solver(True), _solver(False)
    _same(_steps(on, True, 2), _steps(off, False, 2))
    rng = np.random.default_rng(5)
    data, label = rng.standard_normal((6, 3, 8, 8)), rng.integers(0, 3, 6)  # larger: new memories
    for solver in (on, off):
        solver.net.blobs["data"].reshape(6, 3, 8, 8)
        solver.net.blobs["label"].reshape(6)
        solver.net.reshape()
        solver.net.blobs["data"].data[...] = data
        solver.net.blobs["label"].data[...] = label
    _same(_steps(on, True, 2), _steps(off, False, 2))
    assert on.net.executor.training_data.placed
    assert on.net.blobs["conv2a"].shape == (6, 6, 8, 8)
    for name, blobs in _weights(on).items():
        for a, b in zip(blobs, _weights(off)[name]):
            _same(a, b)


def test_training_iterations_keep_their_first_plan(mode, monkeypatch):
    """The gradient slots are allocated once: layers reshaping buffers of their own in the first
    forward, and the step from the first plain iterations to whole-iteration replays, keep the plan
    (each new plan allocates its slots while the old ones still hold values: ResNet-50 fp16 at batch
    256 ended with 669 MiB more in the device pool)."""
    from pycaffe_lite.runtime import shared_diffs

    made: list[int] = []
    real = shared_diffs.new_slot
    monkeypatch.setattr(shared_diffs, "new_slot", lambda nbytes, on_gpu: made.append(nbytes) or real(nbytes, on_gpu))
    on = _solver(True)
    executor = on.net.executor
    for _ in range(10):  # on the GPU: through warm-up, capture and replays
        _steps(on, True, 1)
        if executor.replays > 1 or (common.mode() is common.Mode.CPU and len(made) > 0):
            break
    _steps(on, True, 2)
    assert common.mode() is common.Mode.CPU or executor.replays > 1, executor.fallbacks
    assert executor.training_data.placed
    assert made == executor.shared_diffs._slot_bytes  # one plan's slots, made once
