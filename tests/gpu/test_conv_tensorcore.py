"""Tensor-core convolution engine (``conv_tensorcore``, TF32 inputs, fp32 accumulation): every pass on
every convolution geometry of the model zoo, against float64 references with TF32's error bound; the
engine offered only for float32 with TF32 allowed; forced and autotuned through the Convolution layer.

Two oracles per output element, both from ``cpu_conv`` in float64 (``A`` = sum_k |a_k||b_k| + |bias
or accumulated value|, the convolution of the absolute values):

- TF32's error: ``|got - exact| <= 2 * 2**-10 * A`` (each operand rounded to 10 mantissa bits is off
  by at most 2**-11 relative, a product by 2**-10, plus fp32 accumulation);
- no lost or doubled terms: ``|got - tf32_exact| <= 2**-16 * A``, where ``tf32_exact`` convolves the
  operands rounded exactly as the kernel rounds them (``cvt.rna.tf32.f32``: nearest, ties away from
  zero; their products are exact in fp32), so only fp32 accumulation error remains. This one catches
  a skipped K slice that the first bound would hide at large K.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.conv import cpu as cpu_conv
from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.conv import tensorcore as tc
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.errors import NetError
from pycaffe_lite.gpu import backend
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_mode")]  # conftest's: GPU mode, then CPU

ZOO_DIR = Path(__file__).resolve().parents[2] / "examples" / "model_zoo"
ZOO_NETS = ("bvlc_alexnet", "bvlc_reference_caffenet", "bvlc_googlenet", "vgg16", "resnet50", "squeezenet_v1_1",
            "mobilenet_v1", "mobilenet_v2", "fcn32s")
TENSOR_CORE = conv_engines.ENGINE_CANDIDATES["TENSOR_CORE"]
MAX_OUTPUTS = 320  # group-1 layers keep at most this many output channels (rows only repeat the K sums)


@pytest.fixture
def tf32(gpu_mode):
    """TF32 allowed during the test (GPU mode), disallowed afterwards."""
    caffe.set_allow_tf32(True)
    yield
    caffe.set_allow_tf32(False)


def _zoo_geometries(net_name: str) -> list[tuple]:
    """The distinct convolutions (incl. the deconvolution's engine problem) of a zoo net:
    (channels, H, W, num_output, group, kernel, pad, stride, dilation), with the image cut to a few
    output pixels beyond the kernel's reach (the contraction length C/G*kh*kw is kept exactly)."""
    sys.path.insert(0, str(ZOO_DIR))
    try:
        import model_zoo
    finally:
        sys.path.remove(str(ZOO_DIR))
    caffe.set_mode_cpu()
    try:
        net = caffe.Net(model_zoo.MODELS[net_name](batch=1), caffe.TEST)
    finally:
        caffe.set_mode_gpu()
    out = set()
    for layer in net.layers:
        p = getattr(layer, "problem", None)
        if p is not None:
            h, w = (min(size, d * (k - 1) + 1 + 2 * s + extra) for size, k, s, d, extra
                    in zip((p.height, p.width), p.kernel, p.stride, p.dilation, (3, 2)))
            m = p.num_output if p.group > 1 else min(p.num_output, MAX_OUTPUTS)
            out.add((p.channels, h, w, m, p.group, p.kernel, p.pad, p.stride, p.dilation))
    assert out, f"{net_name}: no convolution found"
    return sorted(out)


def _tf32_round(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 like ``cvt.rna.tf32.f32`` (10 mantissa bits, ties away from zero)."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def _passes(prob: ConvProblem, x, w, bias, dy, dw0, db0):
    """float64 (y, dx, dw, db) of the convolution, dw and db accumulated onto dw0 and db0."""
    x, w, bias, dy = (np.asarray(a, dtype=np.float64) for a in (x, w, bias, dy))
    y = np.empty(dy.shape)
    cpu_conv.forward(x, w, bias, prob.kernel, prob.pad, prob.stride, prob.dilation, prob.group, y)
    dx, dw, db = np.empty(x.shape), np.array(dw0, dtype=np.float64), np.array(db0, dtype=np.float64)
    cpu_conv.backward(x, w, dy, prob.kernel, prob.pad, prob.stride, prob.dilation, prob.group,
                      dweight=dw, dbias=db, dx=dx)
    return y, dx, dw, db


def _engine_run(prob: ConvProblem, tile: str, x, w, bias, dy, dw0, db0):
    """The engine's float32 (y, dx, dw, db): y and dx poisoned with NaN, dw/db starting at dw0/db0."""
    X, W, B, DY = blobs([x, w, bias, dy], np.float32)
    Y, DX, DW, DB = blobs([np.full(dy.shape, np.nan), np.full(x.shape, np.nan), dw0, db0], np.float32)
    wf, wd, ws = backend.workspace(*(max(1, n) * 4 for n in (
        tc.weight_scratch_count(prob, tile, "forward"), tc.weight_scratch_count(prob, tile, "backward_data"),
        tc.workspace_count(prob, tile, True))))
    engine = tc.TensorCoreEngine(tile)
    engine.forward(prob, X.gpu_data(), W.gpu_data(), B.gpu_data(), Y.mutable_gpu_data(), [wf])
    engine.backward_data(prob, W.gpu_data(), DY.gpu_data(), DX.mutable_gpu_data(), [wd])
    engine.backward_weight(prob, X.gpu_data(), DY.gpu_data(), DW.mutable_gpu_data(), DB.mutable_gpu_data(), [ws])
    return [b.cpu_data().astype(np.float64) for b in (Y, DX, DW, DB)]


def _check_all(prob: ConvProblem, tiles, seed: int, what: str) -> None:
    """Every pass of every tile of ``prob`` against both oracles (module docstring)."""
    rng = np.random.default_rng(seed)
    f32 = [rng.standard_normal(s).astype(np.float32) for s in (
        (prob.num, prob.channels, prob.height, prob.width), (prob.num_output, prob.cg) + prob.kernel,
        (prob.num_output,), (prob.num, prob.num_output) + prob.out_hw)]
    x, w, bias, dy = f32
    dw0 = np.full(w.shape, 0.25, np.float32)
    db0 = np.full(bias.shape, -0.5, np.float32)
    exact = _passes(prob, x, w, bias, dy, dw0, db0)
    bound = _passes(prob, *(np.abs(a) for a in f32), np.abs(dw0), np.abs(db0))
    rounded = _passes(prob, _tf32_round(x), _tf32_round(w), bias, _tf32_round(dy), dw0, db0)
    for tile in tiles:
        got = _engine_run(prob, tile, x, w, bias, dy, dw0, db0)
        for name, g, e, r, a in zip(("y", "dx", "dw", "db"), got, exact, rounded, bound):
            label = f"{what} tile {tile} {name}"
            if name == "db" and tc.sliced(prob, tile, "backward_weight"):
                r = e  # the sliced kernels leave the bias gradient to an fp32 reduction of dy
            err = np.abs(g - e)
            assert np.all(err <= 2 * 2.0**-10 * a + 1e-6), \
                f"{label}: beyond TF32's error (worst {np.nanmax(err / (a + 1e-30)):.3g} of A)"
            err = np.abs(g - r)
            assert np.all(err <= 2.0**-16 * a + 1e-6), \
                f"{label}: differs from the TF32-rounded sum (worst {np.nanmax(err / (a + 1e-30)):.3g} of A)"


@pytest.mark.usefixtures("tf32")
@pytest.mark.parametrize("net", ZOO_NETS)
def test_zoo_layer_shapes_within_tf32_error(net):
    for i, (c, h, w, m, g, kernel, pad, stride, dil) in enumerate(_zoo_geometries(net)):
        prob = ConvProblem(1 + i % 3, c, h, w, m, g, kernel, pad, stride, dil, "<f4")
        assert conv_engines.ENGINES["tensorcore-128x128"].supports(prob)
        _check_all(prob, tc.TILES, seed=i, what=f"{net} {prob}")


# batches beyond one N tile, rows beyond one M tile, a K that is not a multiple of 16, dilation,
# non-square kernels and strides, groups
EXTRA = [
    ConvProblem(4, 19, 23, 21, 150, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f4"),
    ConvProblem(2, 7, 17, 19, 37, 1, (5, 3), (2, 0), (2, 1), (1, 1), "<f4"),
    ConvProblem(3, 12, 15, 14, 20, 2, (3, 3), (2, 2), (1, 1), (2, 2), "<f4"),
    ConvProblem(2, 33, 9, 9, 130, 1, (1, 1), (0, 0), (1, 1), (1, 1), "<f4"),
    ConvProblem(1, 5, 40, 33, 9, 1, (7, 7), (3, 3), (2, 2), (1, 1), "<f4"),
    # sliced weight gradient on every tile, tiles straddling taps, the last one ragged (Kg = 432),
    # output rows narrower than a slice (13 < 32 pixels), images crossed within a slice
    ConvProblem(3, 48, 11, 13, 40, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f4"),
]


@pytest.mark.usefixtures("tf32")
@pytest.mark.parametrize("prob", EXTRA, ids=str)
def test_edge_geometries_within_tf32_error(prob):
    _check_all(prob, tc.TILES, seed=7, what=str(prob))


def test_zoo_and_edge_shapes_reach_every_sliced_kernel():
    """The shapes above run each pass's channel-sliced kernels on every tile (a narrowed condition
    in ``tc.sliced`` would otherwise leave them untested)."""
    probs = EXTRA + [ConvProblem(1, c, h, w, m, g, k, p, s, d, "<f4") for net in ("vgg16", "squeezenet_v1_1")
                     for c, h, w, m, g, k, p, s, d in _zoo_geometries(net)]
    for tile in tc.TILES:
        for pass_ in ("forward", "backward_data", "backward_weight"):
            assert any(tc.sliced(p, tile, pass_) for p in probs), (tile, pass_)
    assert any(tc.sliced(p, "128x128", "backward_weight") and p.cg < 128 for p in probs)


@pytest.mark.usefixtures("tf32")
def test_weight_gradient_without_bias_is_reproducible():
    """Without a bias column: within TF32's error, and two runs agree bit for bit (fixed-order
    split-K reduction)."""
    prob = ConvProblem(3, 16, 20, 20, 24, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f4")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 16, 20, 20)).astype(np.float32)
    dy = rng.standard_normal((3, 24) + prob.out_hw).astype(np.float32)
    zw, zb = np.zeros((24, 16, 3, 3)), np.zeros(24)
    exact = _passes(prob, x, zw, zb, dy, zw, zb)[2]
    bound = _passes(prob, np.abs(x), zw, zb, np.abs(dy), zw, zb)[2]
    for tile in tc.TILES:
        runs = []
        for _ in range(2):
            X, DY, DW = blobs([x, dy, zw], np.float32)
            ws, = backend.workspace(tc.workspace_count(prob, tile, False) * 4)
            tc.TensorCoreEngine(tile).backward_weight(prob, X.gpu_data(), DY.gpu_data(), DW.mutable_gpu_data(), None,
                                                      [ws])
            runs.append(DW.cpu_data().astype(np.float64))
        assert np.array_equal(runs[0], runs[1])
        assert np.all(np.abs(runs[0] - exact) <= 2 * 2.0**-10 * bound + 1e-6), tile


def _float32_problem() -> ConvProblem:
    return ConvProblem(2, 8, 10, 10, 16, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f4")


def test_offered_only_with_tf32_for_float32():
    names = conv_engines.ENGINE_CANDIDATES["TENSOR_CORE"]
    assert set(names) == {f"tensorcore-{t}" for t in tc.TILES}
    f32, f64 = _float32_problem(), ConvProblem(2, 8, 10, 10, 16, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f8")
    assert not any(conv_engines.ENGINES[n].supports(f32) for n in names)  # TF32 off: the default
    caffe.set_allow_tf32(True)
    try:
        assert all(conv_engines.ENGINES[n].supports(f32) for n in names)
        assert not any(conv_engines.ENGINES[n].supports(f64) for n in names)
    finally:
        caffe.set_allow_tf32(False)


def _conv_layer(extra: str = ""):
    return make_layer('name: "tc" type: "Convolution" convolution_param { num_output: 12 kernel_size: 3 pad: 1 '
                      f'stride: 2 {extra} weight_filler {{ type: "gaussian" std: 0.5 }} '
                      'bias_filler { type: "uniform" min: -1 max: 1 } }', np.float32)


@pytest.mark.parametrize("allow", [False, True])
def test_autotune_includes_it_only_with_tf32(allow):
    """A layer with the default engine times the tensor-core engines on every pass exactly when TF32
    is allowed."""
    conv_engines.clear_cache()
    caffe.set_allow_tf32(allow)
    try:
        layer = _conv_layer()
        bottom, top = blobs([np.ones((2, 5, 9, 9))], np.float32), empty_blobs(1, np.float32)
        layer.setup(bottom, top)
        layer.forward(bottom, top)
        timings = layer.engine_choice().timings
    finally:
        caffe.set_allow_tf32(False)
    for p in conv_engines.PASSES:
        timed = {n for q, n, _ in timings if q == p}
        assert timed & set(TENSOR_CORE) == (set(TENSOR_CORE) if allow else set())


def test_forced_engine_needs_tf32():
    layer = _conv_layer("engine: TENSOR_CORE")
    bottom, top = blobs([np.ones((2, 5, 9, 9))], np.float32), empty_blobs(1, np.float32)
    with pytest.raises(NetError, match="engine TENSOR_CORE needs float32 with TF32 allowed"):
        layer.setup(bottom, top)
        layer.forward(bottom, top)


@pytest.mark.usefixtures("tf32")
def test_forced_engine_through_the_layer():
    """``engine: TENSOR_CORE``: every pass on a tensor-core engine, within TF32's error of float64."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 5, 9, 9)).astype(np.float32)
    layer = _conv_layer("engine: TENSOR_CORE")
    bottom, top = blobs([x], np.float32), empty_blobs(1, np.float32)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    choice = layer.engine_choice()
    assert {choice.forward, choice.backward_data, choice.backward_weight} <= set(TENSOR_CORE)
    dy = rng.standard_normal(top[0].shape).astype(np.float32)
    top[0].diff[...] = dy
    for b in layer.blobs:
        b.diff[...] = 0.0
    layer.backward(top, [True], bottom)
    w, bias = (b.data.astype(np.float32) for b in layer.blobs)
    prob = layer.problem
    exact = _passes(prob, x, w, bias, dy, np.zeros(w.shape), np.zeros(bias.shape))
    bound = _passes(prob, np.abs(x), np.abs(w), np.abs(bias), np.abs(dy), np.zeros(w.shape), np.zeros(bias.shape))
    got = (top[0].data, bottom[0].diff, layer.blobs[0].diff, layer.blobs[1].diff)
    for name, g, e, a in zip(("y", "dx", "dw", "db"), got, exact, bound):
        assert np.all(np.abs(g - e) <= 2 * 2.0**-10 * a + 1e-6), name
