"""GPU convolution engines: every engine (and mixes of engines per pass) against the CPU layer,
chunking, determinism, gradient checks, the autotune cache and the ``engine`` override."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

pytestmark = pytest.mark.gpu

# (input shape, convolution_param body): Winograd-eligible and not, odd sizes, several K tiles
GEOMETRIES = [
    ((2, 3, 7, 6), "num_output: 4 kernel_size: 3 pad: 1"),
    ((2, 4, 9, 8), "num_output: 3 kernel_size: 3"),
    ((1, 3, 6, 5), "num_output: 5 kernel_size: 3 pad: 2"),
    ((2, 3, 7, 7), "num_output: 2 kernel_size: 3 stride: 2 pad: 1"),
    ((1, 2, 9, 8), "num_output: 3 kernel_size: 3 dilation: 2 pad: 2"),
    ((2, 4, 6, 6), "num_output: 6 kernel_h: 3 kernel_w: 2 group: 2 pad_h: 1 pad_w: 0"),
    ((2, 4, 5, 4), "num_output: 4 kernel_size: 1 group: 2"),
    ((2, 20, 8, 8), "num_output: 50 kernel_size: 5"),
    ((3, 1, 16, 16), "num_output: 7 kernel_size: 5 bias_term: false"),
    ((2, 40, 5, 5), "num_output: 70 kernel_size: 3 pad: 1"),
    ((2, 1, 12, 12), "num_output: 20 kernel_size: 5 stride: 1"),
    ((2, 6, 11, 10), "num_output: 5 kernel_size: 1"),  # 1x1, a plane large enough for per-image GEMMs
    # strided 1x1 (gemm: on the subsampled input; the weight pass too where the plane is large)
    ((2, 6, 20, 21), "num_output: 5 kernel_size: 1 stride: 2"),
    ((2, 4, 7, 9), "num_output: 4 kernel_size: 1 stride: 2 group: 2"),
    ((1, 4, 9, 8), "num_output: 3 kernel_size: 1 stride_h: 3 stride_w: 2"),
]
ENGINE_NAMES = ["gemm", "implicit-128x128", "implicit-64x128", "implicit-32x64", "implicit-16x128", "implicit-32x32",
                "winograd"]


def _text(body: str, extra: str = "") -> str:
    return (f'name: "conv" type: "Convolution" convolution_param {{ {body} {extra} '
            'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "uniform" min: -1 max: 1 } }')


def _run(layer, x, top_diff, dtype, choice=None, propagate=(True,), params=(True, True)):
    """Forward + backward; returns top data, bottom diff, and the param diffs (after clearing)."""
    bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    if choice is not None:
        layer._choice = choice
    layer.param_propagate_down = list(params[:len(layer.blobs)])
    layer.forward(bottom, top)
    top[0].diff[...] = top_diff
    for b in layer.blobs:
        b.diff[...] = 0.25  # backward accumulates into what is there
    bottom[0].diff[...] = 7.0
    layer.backward(top, list(propagate), bottom)
    return [top[0].data.copy(), bottom[0].diff.copy()] + [b.diff.copy() for b in layer.blobs]


def _reference(shape, body, dtype, **kw):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape)
    caffe.set_mode_cpu()
    caffe.set_random_seed(2)
    layer = make_layer(_text(body), dtype)
    bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    top_diff = rng.standard_normal(top[0].shape)
    want = _run(layer, x, top_diff, dtype, **kw)
    return layer, x, top_diff, want


def _gpu_layer(cpu_layer, body, dtype, extra=""):
    caffe.set_mode_gpu()
    layer = make_layer(_text(body, extra), dtype)
    layer.blobs = blobs([b.data for b in cpu_layer.blobs], dtype)
    return layer


def _tol(dtype):
    return 1e-4 if dtype == np.float32 else 1e-10


def _supports(name, shape, body):
    from pycaffe_lite.conv import engines as conv_engines

    layer = make_layer(_text(body))
    bottom, top = blobs([np.zeros(shape)]), empty_blobs(1)
    layer.setup(bottom, top)
    return conv_engines.ENGINES[name].supports(layer.problem)


@pytest.fixture(autouse=True)
def _cpu_after():
    yield
    caffe.set_mode_cpu()


def _winograd_geometry(body: str) -> bool:
    return "kernel_size: 3" in body and "stride" not in body and "dilation" not in body and "group" not in body


# Winograd only where it applies (the autotune never offers it elsewhere; test_winograd_supports
# checks that this list and the engine agree)
CASES = [(shape, body, name) for shape, body in GEOMETRIES for name in ENGINE_NAMES
         if name != "winograd" or _winograd_geometry(body)]


@pytest.mark.parametrize("shape,body", GEOMETRIES)
def test_winograd_supports(shape, body):
    assert _supports("winograd", shape, body) == _winograd_geometry(body)
    assert all(_supports(name, shape, body) for name in ENGINE_NAMES if name != "winograd")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,body,name", CASES)
def test_engine_matches_cpu(shape, body, name, dtype):
    from pycaffe_lite.conv.engines import Choice

    cpu_layer, x, top_diff, want = _reference(shape, body, dtype)
    layer = _gpu_layer(cpu_layer, body, dtype)
    got = _run(layer, x, top_diff, dtype, choice=Choice(name, name, name))
    for what, g, w in zip(("top", "bottom diff", "weight diff", "bias diff"), got, want):
        np.testing.assert_allclose(g, w, rtol=_tol(dtype), atol=_tol(dtype), err_msg=f"{name}: {what}")


@pytest.mark.parametrize("mix", [("gemm", "winograd", "implicit-32x64"), ("winograd", "implicit-64x128", "gemm"),
                                 ("implicit-128x128", "gemm", "winograd")])
def test_mixed_engines_per_pass(mix):
    from pycaffe_lite.conv.engines import Choice

    shape, body = (2, 5, 8, 7), "num_output: 6 kernel_size: 3 pad: 1"
    cpu_layer, x, top_diff, want = _reference(shape, body, np.float64)
    got = _run(_gpu_layer(cpu_layer, body, np.float64), x, top_diff, np.float64, choice=Choice(*mix))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ENGINE_NAMES)
@pytest.mark.parametrize("propagate,params", [((False,), (True, True)), ((True,), (False, False)),
                                              ((True,), (True, False))])
def test_partial_backward(name, propagate, params):
    """Only the requested gradients are written: an unpropagated bottom diff and frozen params keep
    their values."""
    from pycaffe_lite.conv.engines import Choice

    shape, body = (2, 3, 6, 6), "num_output: 4 kernel_size: 3 pad: 1"
    cpu_layer, x, top_diff, want = _reference(shape, body, np.float64, propagate=propagate, params=params)
    got = _run(_gpu_layer(cpu_layer, body, np.float64), x, top_diff, np.float64, choice=Choice(name, name, name),
               propagate=propagate, params=params)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
    if not propagate[0]:
        assert np.all(got[1] == 7.0)
    if not params[0]:
        assert np.all(got[2] == 0.25)


@pytest.mark.parametrize("name", ["gemm", "winograd"])
def test_chunked_batches(monkeypatch, name):
    """Tiny buffer budgets make the gemm and Winograd engines run one image per chunk."""
    from pycaffe_lite.conv import gemm, winograd
    from pycaffe_lite.conv.engines import Choice

    monkeypatch.setattr(gemm, "COL_BUFFER_BYTES", 1)
    monkeypatch.setattr(winograd, "BUFFER_BYTES", 1)
    shape, body = (3, 3, 6, 5), "num_output: 4 kernel_size: 3 pad: 1"
    cpu_layer, x, top_diff, want = _reference(shape, body, np.float64)
    got = _run(_gpu_layer(cpu_layer, body, np.float64), x, top_diff, np.float64, choice=Choice(name, name, name))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


def test_implicit_weight_gradient_is_deterministic_and_split():
    from pycaffe_lite.conv import implicit as conv_implicit
    from pycaffe_lite.conv.engines import Choice

    shape, body = (8, 6, 20, 20), "num_output: 5 kernel_size: 3 pad: 1"
    cpu_layer, x, top_diff, want = _reference(shape, body, np.float32)
    layer = _gpu_layer(cpu_layer, body, np.float32)
    name = "implicit-32x64"
    runs = [_run(layer, x, top_diff, np.float32, choice=Choice(name, name, name)) for _ in range(3)]
    splits, _ = conv_implicit.weight_splits(layer.problem, "32x32", True)
    assert splits > 1
    for r in runs[1:]:
        for a, b in zip(r, runs[0]):
            assert np.array_equal(a, b)
    for g, w in zip(runs[0], want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["implicit-64x128", "winograd"])
def test_gradient_check(name):
    from pycaffe_lite.conv.engines import Choice

    caffe.set_mode_gpu()
    caffe.set_random_seed(4)
    layer = make_layer(_text("num_output: 3 kernel_size: 3 pad: 1"), np.float64)
    bottom, top = blobs([np.random.default_rng(1).standard_normal((2, 2, 5, 4))]), empty_blobs(1)
    layer.setup(bottom, top)
    layer._choice = Choice(name, name, name)
    # the checker's forwards keep the shape, so the forced choice stays
    GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)


def test_autotune_times_every_candidate_and_caches():
    from pycaffe_lite.conv import engines as conv_engines

    conv_engines.clear_cache()
    caffe.set_mode_gpu()
    layer = make_layer(_text("num_output: 8 kernel_size: 3 pad: 1"), np.float32)
    bottom, top = blobs([np.ones((4, 4, 10, 10))], np.float32), empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    choice = layer.engine_choice()
    tried = {(p, n) for p, n, _ in choice.timings}
    for p in ("forward", "backward_data", "backward_weight"):
        assert {n for q, n in tried if q == p} == {n for n, e in conv_engines.ENGINES.items()
                                                   if e.supports(layer.problem) and p in e.passes}
        fastest = min((ms, n) for q, n, ms in choice.timings if q == p)[1]
        assert getattr(choice, p) == fastest
    assert len(conv_engines.cached_choices()) == 1
    other = make_layer(_text("num_output: 8 kernel_size: 3 pad: 1"), np.float32)  # same shape: no new tuning
    other.setup(bottom, top)
    other.forward(bottom, top)
    assert other.engine_choice() is choice
    assert len(conv_engines.cached_choices()) == 1


def test_a_forward_tunes_only_the_forward_pass():
    """A net that never runs backward (deploy) times no backward pass; the first backward tunes
    the rest and the layer then has every pass."""
    from pycaffe_lite.conv import engines as conv_engines

    conv_engines.clear_cache()
    caffe.set_mode_gpu()
    layer = make_layer(_text("num_output: 8 kernel_size: 3 pad: 1"), np.float32)
    bottom, top = blobs([np.ones((4, 4, 10, 10))], np.float32), empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    (choice,) = conv_engines.cached_choices().values()
    assert choice.forward and not choice.backward_data and not choice.backward_weight
    assert {p for p, _, _ in choice.timings} == {"forward"}
    top[0].mutable_cpu_diff()[...] = 1
    layer.backward(top, [True], bottom)
    (choice,) = conv_engines.cached_choices().values()
    assert choice.has() and {p for p, _, _ in choice.timings} == set(conv_engines.PASSES)
    np.testing.assert_allclose(bottom[0].cpu_diff(), _cpu_backward_data(layer, top), rtol=1e-4, atol=1e-4)


def _cpu_backward_data(layer, top) -> np.ndarray:
    """The data gradient of ``layer`` on the CPU, for ``top``'s diff."""
    caffe.set_mode_cpu()
    bottom = blobs([np.ones((4, 4, 10, 10))], np.float32)
    layer.backward(top, [True], bottom)
    caffe.set_mode_gpu()
    return bottom[0].cpu_diff().copy()


@pytest.mark.parametrize("engine,allowed", [("GEMM", {"gemm"}), ("WINOGRAD", {"winograd"}),
                                            ("IMPLICIT_GEMM", {"implicit-128x128", "implicit-64x128",
                                                               "implicit-32x64", "implicit-16x128",
                                                               "implicit-32x32"})])
def test_engine_field_narrows_the_choice(engine, allowed):
    caffe.set_mode_gpu()
    layer = make_layer(_text("num_output: 4 kernel_size: 3 pad: 1", f"engine: {engine}"), np.float32)
    bottom, top = blobs([np.ones((2, 3, 6, 6))], np.float32), empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    choice = layer.engine_choice()
    assert {choice.forward, choice.backward_data, choice.backward_weight} <= allowed
    assert {n for _, n, _ in choice.timings} <= allowed


def test_winograd_engine_rejects_other_geometry():
    caffe.set_mode_gpu()
    layer = make_layer(_text("num_output: 4 kernel_size: 3 stride: 2", "engine: WINOGRAD"), np.float32)
    bottom, top = blobs([np.ones((1, 3, 7, 7))], np.float32), empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    with pytest.raises(NetError, match="conv.*WINOGRAD needs a 3x3 kernel, stride 1"):
        layer.forward(bottom, top)


def test_layers_share_one_workspace():
    """Scratch comes from the process-wide workspace: sized by the largest need, and a layer that
    needs less runs in the same buffer without growing it."""
    from pycaffe_lite.conv import engines as conv_engines
    from pycaffe_lite.gpu import backend

    caffe.set_mode_gpu()
    big = make_layer(_text("num_output: 8 kernel_size: 3 pad: 1", "engine: GEMM"), np.float32)
    bottom, top = blobs([np.ones((4, 4, 12, 12))], np.float32), empty_blobs(1, np.float32)
    big.setup(bottom, top)
    big.forward(bottom, top)
    size = backend.workspace_bytes("main")  # "reduce" (bias gradients) may or may not exist yet
    assert size >= sum(conv_engines.ENGINES["gemm"].scratch(big.problem, "forward", True)) > 0
    small = make_layer(_text("num_output: 2 kernel_size: 3", "engine: GEMM"), np.float32)
    bottom, top = blobs([np.ones((1, 2, 6, 6))], np.float32), empty_blobs(1, np.float32)
    small.setup(bottom, top)
    small.forward(bottom, top)
    top[0].diff[...] = 1.0
    small.backward(top, [True], bottom)
    assert backend.workspace_bytes("main") == size


RELU_GEOMETRIES = GEOMETRIES + [((2, 4, 7, 7), "num_output: 4 kernel_size: 3 pad: 1 group: 4"),  # depthwise
                                ((1, 3, 9, 9), "num_output: 5 kernel_size: 3 pad: 1 stride: 2")]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,body", RELU_GEOMETRIES)
def test_relu_epilogue_every_engine(shape, body, dtype):
    """Forward with the fused ReLU epilogue equals the CPU forward followed by ReLU, on every engine
    that runs the geometry (with and without a bias)."""
    from pycaffe_lite.conv import engines as conv_engines
    from pycaffe_lite.conv.engines import Choice

    cpu_layer, x, _, _ = _reference(shape, body, dtype)
    bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
    caffe.set_mode_cpu()
    cpu_layer.compute_forward_relu(bottom, top)
    want = top[0].data.copy()
    assert (want == 0).any() and (want > 0).any()
    tried = 0
    for name, engine in conv_engines.ENGINES.items():
        caffe.set_mode_gpu()
        layer = _gpu_layer(cpu_layer, body, dtype)
        bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
        layer.setup(bottom, top)
        if not engine.supports(layer.problem) or "forward" not in engine.passes:
            continue
        layer._choice = Choice(name, "gemm", "gemm")
        top[0].data[...] = np.nan  # the forward assigns every element
        layer.compute_forward_relu(bottom, top)
        np.testing.assert_allclose(top[0].data, want, rtol=_tol(dtype), atol=_tol(dtype), err_msg=name)
        tried += 1
    assert tried >= 2


def test_nets_tune_for_graph_replay_and_plain_calls_by_wall_clock(tmp_path):
    """The executor's warm-up run tunes with graph timing (what its replays cost); a plain layer call
    tunes by wall clock (launch overhead included); the two are cached apart."""
    from pycaffe_lite.conv import engines as conv_engines

    conv_engines.clear_cache()
    caffe.set_mode_gpu()
    path = tmp_path / "n.prototxt"
    path.write_text('input: "data" input_shape { dim: 2 dim: 3 dim: 9 dim: 9 }\n'
                    'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { '
                    'num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" } } }')
    net = caffe.Net(str(path), caffe.TEST)
    for _ in range(3):
        net.forward()
    assert net.executor.replays >= 1
    assert {key[-1] for key in conv_engines.cached_choices()} == {"graph"}
    _run(make_layer(_text("num_output: 4 kernel_size: 3"), np.float32), np.ones((2, 3, 9, 9)),
         np.ones((2, 4, 7, 7)), np.float32)
    assert {key[-1] for key in conv_engines.cached_choices()} == {"graph", "wall"}
