"""The convolution autotune on the calling layer's own blobs, without a GPU: fake engines record the
pointers each pass gets and the bytes it writes, a fake workspace the regions requested. With layer
operands the timing carves only what the layer does not give (and scratch for the accumulated dw,
db), never writes the layer's inputs, and keeps an output that aliases an input out; the layers
name their first bottom/top pair's pointers by the roles their engine passes give them."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite.blob import Blob
from pycaffe_lite.config import Config
from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.conv.registry import PASSES
from pycaffe_lite.gpu import backend, blas
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

PROB = ConvProblem(2, 4, 6, 6, 8, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f4")
NBYTES = {"x": 2 * 4 * 36 * 4, "y": 2 * 8 * 36 * 4, "w": 8 * 36 * 4, "b": 8 * 4}
NBYTES.update(dx=NBYTES["x"], dy=NBYTES["y"], dw=NBYTES["w"], db=NBYTES["b"])
WS = 1 << 40  # the fake workspace's base; region i at WS + i MiB
LAYER = {"x": 1 << 30, "w": 2 << 30, "b": 3 << 30, "dy": 4 << 30, "y": 5 << 30, "dx": 6 << 30}
SCRATCH = 4096  # each fake engine's scratch region per pass


class FakeEngine:
    """Records (pass, engine, operand pointers, scratch pointers) per call and the bytes it writes."""

    passes = PASSES

    def __init__(self, name: str, log: list, writes: list) -> None:
        self.name, self.log, self.writes = name, log, writes

    def supports(self, prob) -> bool:
        return True

    def scratch(self, prob, pass_, has_bias):
        return (SCRATCH,)

    def _wrote(self, ptr, nbytes, ws) -> None:
        self.writes.append((ptr, nbytes))
        self.writes.extend((p, SCRATCH) for p in ws)

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        self.log.append(("forward", self.name, {"x": x, "w": w, "b": bias, "y": y}, ws))
        self._wrote(y, NBYTES["y"], ws)

    def backward_data(self, prob, w, dy, dx, ws):
        self.log.append(("backward_data", self.name, {"w": w, "dy": dy, "dx": dx}, ws))
        self._wrote(dx, NBYTES["dx"], ws)

    def backward_weight(self, prob, x, dy, dw, db, ws):
        self.log.append(("backward_weight", self.name, {"x": x, "dy": dy, "dw": dw, "db": db}, ws))
        self._wrote(dw, NBYTES["dw"], ws)
        if db is not None:
            self.writes.append((db, NBYTES["db"]))


class Fakes:
    def __init__(self) -> None:
        self.log: list = []  # engine calls
        self.writes: list[tuple[int, int]] = []  # (pointer, bytes) written by engines and fills
        self.fills: list[tuple[int, float]] = []  # gm.set: (pointer, value)
        self.workspace: list[tuple[int, ...]] = []  # the sizes of every workspace request

    def carve(self, *sizes, slot="main"):
        assert all(s <= 1 << 20 for s in sizes)
        self.workspace.append(sizes)
        return [WS + (i << 20) for i in range(len(sizes))]

    def fill(self, count, value, ptr, dtype):
        self.fills.append((ptr, value))
        self.writes.append((ptr, count * np.dtype(dtype).itemsize))


@pytest.fixture
def fakes(monkeypatch, fake_hopper):
    f = Fakes()
    monkeypatch.setattr(conv_engines, "ENGINES", {n: FakeEngine(n, f.log, f.writes) for n in ("one", "two")})
    monkeypatch.setattr(backend, "workspace", f.carve)
    monkeypatch.setattr(backend, "release_workspace", lambda slot="main": f.workspace.append(("released",)))
    monkeypatch.setattr(backend, "synchronize", lambda: None)
    monkeypatch.setattr(blas, "tf32_allowed", lambda: False)
    monkeypatch.setattr(gm, "set", f.fill)
    monkeypatch.setattr(conv_engines, "_choices", {})
    monkeypatch.setattr(conv_engines, "_unreserved", set())
    monkeypatch.setattr(conv_engines, "_scratch_peak", 0)
    monkeypatch.setattr(conv_engines, "_cache_file", None)
    monkeypatch.setattr(conv_engines, "config", Config())  # no $PYCAFFE_LITE_AUTOTUNE_CACHE
    return f


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def _written(fakes: Fakes, name: str) -> bool:
    return any(_overlaps(w, (LAYER[name], NBYTES[name])) for w in fakes.writes)


def _operand_requests(fakes: Fakes) -> set[tuple[int, ...]]:
    """The leading regions of every workspace request, less the engines' scratch."""
    return {sizes[:-1] if sizes[-1:] == (SCRATCH,) else sizes for sizes in fakes.workspace}


def test_without_layer_operands_all_eight_are_carved(fakes):
    choice = conv_engines._tune(PROB, True, ("one", "two"), PASSES)
    eight = tuple(NBYTES[n] for n in ("x", "dx", "y", "dy", "w", "dw", "b", "db"))
    assert _operand_requests(fakes) == {eight}
    assert {p for p, _ in fakes.fills} == {WS + (i << 20) for i in (0, 3, 4, 5, 6, 7)}  # x, dy, w, dw, b, db
    assert all(p >= WS for _, _, ops, _ in fakes.log for p in ops.values() if p is not None)
    assert (choice.forward, choice.backward_data, choice.backward_weight) != ("", "", "")


def test_forward_times_on_the_layer_blobs_alone(fakes):
    ops = {n: LAYER[n] for n in ("x", "w", "b", "y")}
    conv_engines._tune(PROB, True, ("one", "two"), ("forward",), ops)
    assert _operand_requests(fakes) == {()}  # engine scratch only
    calls = [c for c in fakes.log if c[0] == "forward"]
    assert len(calls) == 2 * (1 + conv_engines.TUNE_REPS) and len(fakes.log) == len(calls)
    assert all(c[2] == ops for c in calls)
    assert not fakes.fills
    assert not any(_written(fakes, n) for n in ("x", "w", "b"))  # only read
    assert _written(fakes, "y")  # the layer's forward assigns it next


def test_backward_times_on_the_layer_blobs_with_scratch_gradients(fakes):
    ops = {n: LAYER[n] for n in ("x", "w", "dy", "dx")}
    conv_engines._tune(PROB, True, ("one", "two"), ("backward_data", "backward_weight"), ops)
    assert _operand_requests(fakes) == {(NBYTES["dw"], NBYTES["db"])}  # accumulated: never the layer's
    dw, db = WS, WS + (1 << 20)
    assert sorted(fakes.fills) == [(dw, 0.0), (db, 0.0)]
    for pass_, _, got, _ in fakes.log:
        want = {"backward_data": {"w": LAYER["w"], "dy": LAYER["dy"], "dx": LAYER["dx"]},
                "backward_weight": {"x": LAYER["x"], "dy": LAYER["dy"], "dw": dw, "db": db}}[pass_]
        assert got == want
    assert {c[0] for c in fakes.log} == {"backward_data", "backward_weight"}
    assert not any(_written(fakes, n) for n in ("x", "w", "dy"))


def test_missing_layer_operands_come_from_the_workspace(fakes):
    conv_engines._tune(PROB, False, ("one",), ("backward_data",), {"w": LAYER["w"], "dx": LAYER["dx"]})
    assert _operand_requests(fakes) == {(NBYTES["dy"],)}  # no bias: nor b, db
    assert fakes.fills == [(WS, 0.5)]
    assert {c[2]["dy"] for c in fakes.log} == {WS}


@pytest.mark.parametrize("alias", ["in_place", "inside"])
def test_an_output_sharing_an_input_is_not_used(fakes, alias):
    """An in-place top, or one whose storage overlaps an input, must not be written before the pass
    reads that input: the timing takes workspace for it."""
    y = LAYER["x"] if alias == "in_place" else LAYER["x"] + NBYTES["x"] - 4
    ops = {"x": LAYER["x"], "w": LAYER["w"], "y": y}
    conv_engines._tune(PROB, False, ("one",), ("forward",), ops)
    assert _operand_requests(fakes) == {(NBYTES["y"],)}
    assert {c[2]["y"] for c in fakes.log} == {WS}
    assert not _written(fakes, "x")


def test_accumulated_gradients_are_refused(fakes):
    with pytest.raises(ValueError, match="dw and db"):
        conv_engines._tune(PROB, True, ("one",), ("backward_weight",), {"dw": LAYER["x"]})


def test_choose_passes_the_operands_and_releases_the_scratch(fakes):
    ops = {n: LAYER[n] for n in ("x", "w", "b", "y")}
    choice = conv_engines.choose(PROB, True, ("one", "two"), ("forward",), operands=ops)
    assert choice.forward and not choice.backward_data
    assert all(c[2] == ops for c in fakes.log)
    assert ("released",) in fakes.workspace
    assert _operand_requests(fakes) - {("released",)} == {()}


# -- the layers' operands ----------------------------------------------------------------------


@pytest.fixture
def pointers(monkeypatch):
    """Blob device pointers without a device: one fake address per memory; engine runs recorded."""
    addresses: dict[int, int] = {}

    def address(mem) -> int:
        return addresses.setdefault(id(mem), (len(addresses) + 1) << 32)

    for name, side in (("gpu_data", "data"), ("mutable_gpu_data", "data"), ("gpu_diff", "diff"),
                       ("mutable_gpu_diff", "diff")):
        monkeypatch.setattr(Blob, name, lambda self, side=side: address(getattr(self, f"{side}_memory")))
    chosen: list = []

    def choose(prob, has_bias, candidates, passes=PASSES, *, operands=None):
        chosen.append((passes, operands))
        return conv_engines.Choice(*("gemm" if p in passes else "" for p in PASSES))

    monkeypatch.setattr(conv_engines, "choose", choose)
    monkeypatch.setattr(conv_engines, "run", lambda *a, **k: None)
    monkeypatch.setattr(conv_engines, "run_backward", lambda *a, **k: None)
    monkeypatch.setattr(gm, "add_channel_bias", lambda *a: None)  # Deconvolution's bias
    monkeypatch.setattr(gm, "channel_sum", lambda *a, **k: None)
    return address, chosen


def _layer(kind: str, bias: bool):
    body = f"num_output: 6 kernel_size: 3 pad: 1 bias_term: {str(bias).lower()}"
    layer = make_layer(f'name: "c" type: "{kind}" convolution_param {{ {body} }}', np.float32)
    bottom, top = blobs([np.ones((2, 4, 5, 5))], np.float32), empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("down", [True, False])
def test_convolution_names_its_blobs(pointers, bias, down):
    address, chosen = pointers
    layer, bottom, top = _layer("Convolution", bias)
    x, dx = address(bottom[0].data_memory), address(bottom[0].diff_memory)
    y, dy = address(top[0].data_memory), address(top[0].diff_memory)
    w = address(layer.blobs[0].data_memory)
    layer.forward_gpu(bottom, top)
    layer.backward_gpu(top, [down], bottom)
    forward = {"x": x, "w": w, "y": y} | ({"b": address(layer.blobs[1].data_memory)} if bias else {})
    backward = {"x": x, "w": w, "dy": dy} | ({"dx": dx} if down else {})
    assert chosen == [(("forward",), forward), (("backward_weight", "backward_data"), backward)]


def test_convolution_relu_backward_names_its_blobs(pointers):
    address, chosen = pointers
    layer, bottom, top = _layer("Convolution", True)
    layer.forward_gpu(bottom, top)
    gm_calls: list = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gm, "relu_backward_channel_sum", lambda *a: gm_calls.append(a))
        layer.backward_gpu_relu(top, [True], bottom)
    assert gm_calls
    assert chosen[-1][1] == {"x": address(bottom[0].data_memory), "w": address(layer.blobs[0].data_memory),
                             "dy": address(top[0].diff_memory), "dx": address(bottom[0].diff_memory)}


@pytest.mark.parametrize("down", [True, False])
def test_deconvolution_names_its_blobs_in_the_transposed_roles(pointers, down):
    address, chosen = pointers
    layer, bottom, top = _layer("Deconvolution", True)
    layer.forward_gpu(bottom, top)
    layer.backward_gpu(top, [down], bottom)
    w = address(layer.blobs[0].data_memory)
    x_data, x_diff = address(bottom[0].data_memory), address(bottom[0].diff_memory)
    forward = {"w": w, "dy": x_data, "dx": address(top[0].data_memory)}
    backward = {"w": w, "dy": x_data, "x": address(top[0].diff_memory)} | ({"y": x_diff} if down else {})
    assert chosen == [(("backward_data",), forward), (("backward_weight", "forward"), backward)]


def test_a_clear_loser_is_timed_once(fakes, monkeypatch):
    """A candidate whose first timed call exceeds LOSER_FACTOR x the pass's best (+ the margin) is
    not timed again; the winner and a close second are timed TUNE_REPS times. The fake clock
    advances by each engine's cost per call."""
    cost = {"one": 1.0, "two": 1.5, "three": 10.0}  # ms: "two" is within the bound, "three" beyond
    clock = [0.0]
    engines = {n: FakeEngine(n, fakes.log, fakes.writes) for n in cost}
    for n, e in engines.items():
        fwd = e.forward

        def timed(*a, _fwd=fwd, _n=n, **k):
            clock[0] += cost[_n] / 1e3
            _fwd(*a, **k)
        e.forward = timed
    monkeypatch.setattr(conv_engines, "ENGINES", engines)
    monkeypatch.setattr(conv_engines.time, "perf_counter", lambda: clock[0])
    choice = conv_engines._tune(PROB, True, tuple(cost), ("forward",))
    calls = {n: sum(1 for c in fakes.log if c[1] == n) for n in cost}
    assert calls == {"one": 1 + conv_engines.TUNE_REPS, "two": 1 + conv_engines.TUNE_REPS, "three": 2}
    assert choice.forward == "one"
    assert dict((n, ms) for _, n, ms in choice.timings)["three"] == pytest.approx(10.0)
