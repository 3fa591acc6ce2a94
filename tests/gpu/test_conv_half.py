"""Convolution engines on half blobs (float16, and bfloat16 as uint16 bit patterns): every engine
that supports a half problem, every pass it implements, against float64 references computed on the
half-rounded operands; the fp16/bf16 tensor-core engine (``tensorcore16-*``) with a tight bound.

Bounds, per output element, with ``u`` the format's unit roundoff (2**-11 fp16, 2**-8 bf16),
``K`` the contraction length of the pass (C/G*kh*kw forward, M/G*kh*kw data gradient, N*Ho*Wo
weight gradient), ``exact`` the float64 result on the rounded operands and ``A`` the same pass on
their absolute values (sum of |a_k||b_k|, plus |bias| or |initial gradient|):

- tensorcore16: ``|got - exact| <= u*|exact| + 2*K*2**-24*A``: the products of half values are
  exact in fp32, fp32 accumulation over K terms is off by at most about K*2**-24 of A, and the
  result is rounded to the storage type once (weight gradient: fp32 partial sums and an fp32
  reduction, one rounding). A lost or doubled slice of the contraction (~sqrt(32) terms of A/K) is
  far outside that, because |exact| is ~sqrt(K) times smaller than A for random signs.
- the other engines (and tensorcore16's bias gradient where its sliced weight kernels leave it to
  ``channel_sum``) keep some intermediate values in the storage type (the weight gradient's
  split partial sums in implicit and depthwise, the gemm engine's 1x1 per-image products, cuBLAS's
  output before the column sums): ``3*u*A`` (at most two roundings before the last, each at most
  u of A) plus the fp32 accumulation term;
- winograd stores its transformed tiles, their products and the inverse transform's input in the
  storage type: three roundings, each of values up to 16 times A (F(2x2, 3x3)'s transforms add at
  most 4 terms per axis), so ``48*u*A`` plus the accumulation term.
"""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite.blob import Blob
from pycaffe_lite.conv import cpu as cpu_conv
from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.conv import tensorcore16 as tc16
from pycaffe_lite.conv import tensorcore16_nhwc as tc16n
from pycaffe_lite.conv import wgmma
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.gpu import backend

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_mode")]  # conftest's: GPU mode, then CPU

FORMATS = {"fp16": (np.float16, "<f2", 2.0**-11), "bf16": (np.uint16, "<u2", 2.0**-8)}

# (num, channels, H, W, num_output, group, kernel, pad, stride, dilation): ragged tiles (M, N and K
# not multiples of 16/32), a bias column, groups, strides, dilation, 1x1, a 7x7 stem, a long
# contraction (K = 576), depthwise, a weight gradient long enough to split, the sliced kernels
SHAPES = [
    (2, 19, 11, 10, 37, 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    (3, 64, 9, 9, 70, 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 7, 17, 19, 33, 1, (5, 3), (2, 0), (2, 1), (1, 1)),
    (3, 12, 15, 14, 20, 2, (3, 3), (2, 2), (1, 1), (2, 2)),
    (2, 40, 9, 9, 130, 1, (1, 1), (0, 0), (1, 1), (1, 1)),
    (1, 3, 40, 33, 9, 1, (7, 7), (3, 3), (2, 2), (1, 1)),
    (4, 16, 30, 30, 24, 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 8, 12, 12, 8, 8, (3, 3), (1, 1), (1, 1), (1, 1)),
    # tensorcore16's channel-sliced kernels: forward (C/G % 32 == 0) and data gradient (M/G % 32 == 0),
    # ragged columns, strides, groups, a non-square kernel
    (2, 64, 15, 13, 96, 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 32, 9, 8, 64, 2, (3, 2), (1, 0), (2, 1), (1, 1)),
    (3, 128, 7, 7, 160, 1, (1, 1), (0, 0), (1, 1), (1, 1)),
    # the gemm engine's padded planes (7x7 = 98 bytes a row in half): 1x1 at stride 1 and 2, groups
    (2, 24, 7, 7, 40, 2, (1, 1), (0, 0), (1, 1), (1, 1)),
    (2, 24, 13, 13, 40, 1, (1, 1), (0, 0), (2, 2), (1, 1)),
]


def _round(a: np.ndarray, dtype) -> np.ndarray:
    """float64 values of ``a`` rounded to the storage type (through a blob, as the engines see them)."""
    b = Blob(a.shape, dtype)
    b.set_math_data(np.asarray(a, np.float32))
    return b.math_data().astype(np.float64)


def _blob(a: np.ndarray, dtype) -> Blob:
    b = Blob(a.shape, dtype)
    b.set_math_data(np.asarray(a, np.float32))
    return b


def _reference(prob: ConvProblem, x, w, bias, dy, dw0, db0):
    """float64 (y, dx, dw, db); dw and db accumulated onto dw0 and db0."""
    y = np.empty(dy.shape)
    cpu_conv.forward(x, w, bias, prob.kernel, prob.pad, prob.stride, prob.dilation, prob.group, y)
    dx, dw, db = np.empty(x.shape), np.array(dw0, np.float64), np.array(db0, np.float64)
    cpu_conv.backward(x, w, dy, prob.kernel, prob.pad, prob.stride, prob.dilation, prob.group,
                      dweight=dw, dbias=db, dx=dx)
    return {"forward": y, "backward_data": dx, "backward_weight": (dw, db)}


def _run(name: str, prob: ConvProblem, arrays: dict, dtype) -> dict:
    """The engine's results for each pass it implements, as float64 (y, dx poisoned with NaN first)."""
    engine = conv_engines.ENGINES[name]
    X, W, B, DY = (_blob(arrays[k], dtype) for k in ("x", "w", "bias", "dy"))
    Y = _blob(np.full(arrays["dy"].shape, np.nan), dtype)
    DX = _blob(np.full(arrays["x"].shape, np.nan), dtype)
    DW, DB = _blob(arrays["dw0"], dtype), _blob(arrays["db0"], dtype)
    out = {}
    for pass_ in engine.passes:
        sizes = engine.scratch(prob, pass_, True)
        ws = backend.workspace(*sizes) if sizes else []
        if pass_ == "forward":
            engine.forward(prob, X.gpu_data(), W.gpu_data(), B.gpu_data(), Y.mutable_gpu_data(), ws)
            out[pass_] = Y.math_data().astype(np.float64)
        elif pass_ == "backward_data":
            engine.backward_data(prob, W.gpu_data(), DY.gpu_data(), DX.mutable_gpu_data(), ws)
            out[pass_] = DX.math_data().astype(np.float64)
        else:
            engine.backward_weight(prob, X.gpu_data(), DY.gpu_data(), DW.mutable_gpu_data(), DB.mutable_gpu_data(),
                                   ws)
            out[pass_] = (DW.math_data().astype(np.float64), DB.math_data().astype(np.float64))
    return out


def _contraction(prob: ConvProblem, pass_: str) -> int:
    return {"forward": prob.kg, "backward_data": prob.mg * prob.khkw,
            "backward_weight": prob.num * prob.out_plane}[pass_]


def _bias_by_channel_sum(name: str, prob: ConvProblem) -> bool:
    """Whether the engine ``name``'s bias gradient comes from ``channel_sum`` (Dtype rounding of the
    intermediate sums) rather than from its fp32 GEMM: tensorcore16's sliced weight kernels, and the
    NHWC engines' own weight gradient (or their delegate's sliced one)."""
    if not name.startswith("tensorcore16-"):  # (names without a tile: gemm, winograd, ...)
        return False
    tile = name.rsplit("-", 1)[1]
    if name.startswith("tensorcore16-nhwc-"):
        return tc16n.owns(prob, "backward_weight") or tc16.sliced(prob, "backward_weight", tc16n.delegate_tile(tile))
    return tc16.sliced(prob, "backward_weight", tile)


def _check_engine(name: str, prob: ConvProblem, fmt: str, seed: int) -> None:
    dtype, _, u = FORMATS[fmt]
    rng = np.random.default_rng(seed)
    shapes = {"x": (prob.num, prob.channels, prob.height, prob.width), "w": (prob.num_output, prob.cg) + prob.kernel,
              "bias": (prob.num_output,), "dy": (prob.num, prob.num_output) + prob.out_hw}
    arrays = {k: _round(rng.standard_normal(s), dtype) for k, s in shapes.items()}
    arrays["dw0"] = np.full(shapes["w"], 0.25)
    arrays["db0"] = np.full(shapes["bias"], -0.5)
    exact = _reference(prob, **arrays)
    bound = _reference(prob, **{k: np.abs(v) for k, v in arrays.items()})
    got = _run(name, prob, arrays, dtype)
    assert got, f"{name} ran no pass"
    for pass_, g in got.items():
        accumulation = 2 * _contraction(prob, pass_) * 2.0**-24
        pairs = zip(("dw", "db"), g, exact[pass_], bound[pass_]) if pass_ == "backward_weight" else \
            [(pass_, g, exact[pass_], bound[pass_])]
        for what, gv, ev, av in pairs:
            bias_by_channel_sum = what == "db" and _bias_by_channel_sum(name, prob)
            if name.startswith("tensorcore16-") and not bias_by_channel_sum:
                tol = u * np.abs(ev) + accumulation * av + 1e-6
            else:
                tol = (48 if name == "winograd" else 3) * u * av + accumulation * av + 1e-6
            err = np.abs(gv - ev)
            assert np.all(err <= tol), (f"{name} {fmt} {prob} {what}: worst error {np.nanmax(err / (av + 1e-30)):.3g} "
                                        f"of A (u = {u:.3g}), {int(np.sum(~(err <= tol)))} elements beyond the bound")


def _half_engines(prob: ConvProblem) -> list[str]:
    return [n for n, e in conv_engines.ENGINES.items() if e.supports(prob)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_half_engine_every_pass(shape, fmt):
    prob = ConvProblem(*shape, FORMATS[fmt][1])
    names = _half_engines(prob)
    assert any(n.startswith("tensorcore16-") for n in names)  # offered on this (sm_80+) device
    assert not any(n.startswith("tensorcore-") for n in names)  # TF32 stays float32-only
    if prob.dilation == (1, 1) and (prob.cg % 32 == 0 or prob.mg % 32 == 0):
        assert tc16.sliced(prob, "forward") or tc16.sliced(prob, "backward_data")
    for i, name in enumerate(names):
        _check_engine(name, prob, fmt, seed=i)


@pytest.mark.parametrize("fmt", FORMATS)
def test_tensorcore16_offered_for_half_only(fmt):
    names = conv_engines.ENGINE_CANDIDATES["TENSOR_CORE_16"]
    nhwc = {f"tensorcore16-nhwc-{t}" for t in tc16n.TILES} | WGMMA_NAMES
    assert set(names) == {f"tensorcore16-{t}" for t in tc16.TILES} | nhwc | {"tensorcore16-nhwc-cublas"}
    if not _hopper():  # registered everywhere, offered on compute capability 9.0 only
        names = tuple(n for n in names if n not in WGMMA_NAMES)
    shape = SHAPES[0]  # C = 19 (staged padded to 24), 3x3: every engine but the 1x1 weight gradient's
    assert all(conv_engines.ENGINES[n].supports(ConvProblem(*shape, FORMATS[fmt][1])) == (n != "tensorcore16-nhwc-cublas")
               for n in names)
    shape = NHWC_SHAPES[1]  # 1x1, C and M multiples of 8: all of them
    assert all(conv_engines.ENGINES[n].supports(ConvProblem(*shape, FORMATS[fmt][1])) for n in names)
    for other in ("<f4", "<f8"):
        assert not any(conv_engines.ENGINES[n].supports(ConvProblem(*shape, other)) for n in names)


@pytest.mark.parametrize("fmt", FORMATS)
def test_tensorcore16_forward_relu_epilogue_and_reproducible_weights(fmt):
    """The fused bias + ReLU epilogue equals ReLU of the unfused result (both rounded once), and the
    weight gradient's split-K reduction gives the same bits twice."""
    dtype, code, _ = FORMATS[fmt]
    prob = ConvProblem(4, 32, 20, 20, 48, 1, (3, 3), (1, 1), (1, 1), (1, 1), code)
    rng = np.random.default_rng(5)
    x, w, b = (_blob(rng.standard_normal(s), dtype) for s in ((4, 32, 20, 20), (48, 32, 3, 3), (48,)))
    dy = _blob(rng.standard_normal((4, 48) + prob.out_hw), dtype)
    for tile in tc16.TILES:
        engine = tc16.TensorCore16Engine(tile)
        plain, fused = (_blob(np.zeros((4, 48) + prob.out_hw), dtype) for _ in range(2))
        sizes = engine.scratch(prob, "forward", True)
        ws = backend.workspace(*sizes) if sizes else []
        engine.forward(prob, x.gpu_data(), w.gpu_data(), b.gpu_data(), plain.mutable_gpu_data(), ws)
        engine.forward(prob, x.gpu_data(), w.gpu_data(), b.gpu_data(), fused.mutable_gpu_data(), ws, relu=True)
        assert np.array_equal(fused.math_data(), np.maximum(plain.math_data(), 0)), tile
        runs = []
        for _ in range(2):
            dw, db = _blob(np.zeros((48, 32, 3, 3)), dtype), _blob(np.zeros(48), dtype)
            ws = backend.workspace(*engine.scratch(prob, "backward_weight", True))
            engine.backward_weight(prob, x.gpu_data(), dy.gpu_data(), dw.mutable_gpu_data(), db.mutable_gpu_data(), ws)
            runs.append((dw.cpu_data().copy(), db.cpu_data().copy()))
        assert all(np.array_equal(a, b) for a, b in zip(*runs)), tile


# ---- the NHWC-staged engines (tensorcore16-nhwc-*): forward; data gradient (one GEMM per stride
# phase) and weight gradient with M % 8 == 0 (tensorcore16's kernels otherwise); all with
# tensorcore16's tight bound
NHWC_SHAPES = [
    (3, 64, 13, 11, 72, 1, (3, 3), (1, 1), (1, 1), (1, 1)),  # 3x3 s1 p1 at odd sizes, M not a tile multiple
    (5, 256, 14, 14, 136, 1, (1, 1), (0, 0), (1, 1), (1, 1)),  # 1x1 at 14x14 (196 columns an image)
    (3, 200, 7, 7, 520, 1, (1, 1), (0, 0), (1, 1), (1, 1)),  # 1x1 at 7x7; C = 6*32 + 8: a partial slice
    (2, 96, 15, 15, 40, 1, (1, 1), (0, 0), (2, 2), (1, 1)),  # 1x1 stride 2: data-gradient phases without taps
    (2, 48, 17, 16, 80, 1, (3, 3), (1, 1), (2, 2), (1, 1)),  # 3x3 stride 2: four data-gradient phases
    (2, 8, 9, 10, 24, 1, (5, 3), (2, 1), (1, 1), (1, 1)),  # C = 8, a non-square kernel
    (2, 16, 11, 9, 32, 1, (5, 3), (2, 0), (3, 2), (1, 1)),  # mixed strides: 6 ragged data-gradient phases
    (1, 16, 6, 7, 8, 1, (3, 3), (0, 0), (1, 1), (1, 1)),  # no padding: the data gradient pads by 2
    (2, 32, 8, 8, 20, 1, (3, 3), (1, 1), (1, 1), (1, 1)),  # M = 20: both gradients delegated
    (130, 16, 3, 3, 32, 1, (3, 3), (1, 1), (1, 1), (1, 1)),  # batch 130: columns past a 128 multiple
    (3, 3, 37, 34, 64, 1, (7, 7), (3, 3), (2, 2), (1, 1)),  # an RGB stem: x staged padded to 8 channels
    (2, 12, 10, 9, 16, 1, (3, 3), (1, 1), (1, 1), (1, 1)),  # C = 12, padded to 16: slices span taps
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", NHWC_SHAPES, ids=str)
def test_tensorcore16_nhwc_every_tile(shape, fmt):
    prob = ConvProblem(*shape, FORMATS[fmt][1])
    assert tc16n.supports(prob)
    for i, tile in enumerate(tc16n.TILES):
        _check_engine(f"tensorcore16-nhwc-{tile}", prob, fmt, seed=10 + i)


@pytest.mark.parametrize("fmt", FORMATS)
def test_tensorcore16_nhwc_bias_relu_epilogue(fmt):
    """The fused bias + ReLU equals ReLU of the float64 reference within the bound, and equals ReLU of
    the unfused result bit for bit (one rounding either way)."""
    dtype, code, u = FORMATS[fmt]
    prob = ConvProblem(3, 40, 9, 11, 100, 1, (3, 3), (1, 1), (1, 1), (1, 1), code)
    rng = np.random.default_rng(7)
    arrays = {k: _round(rng.standard_normal(s), dtype) for k, s in
              (("x", (3, 40, 9, 11)), ("w", (100, 40, 3, 3)), ("bias", (100,)))}
    y = np.empty((3, 100) + prob.out_hw)
    cpu_conv.forward(arrays["x"], arrays["w"], arrays["bias"], prob.kernel, prob.pad, prob.stride, prob.dilation, 1, y)
    a = np.empty_like(y)
    cpu_conv.forward(np.abs(arrays["x"]), np.abs(arrays["w"]), np.abs(arrays["bias"]), prob.kernel, prob.pad,
                     prob.stride, prob.dilation, 1, a)
    x, w, b = (_blob(arrays[k], dtype) for k in ("x", "w", "bias"))
    for tile in [f"nhwc-{t}" for t in tc16n.TILES] + [n.removeprefix("tensorcore16-") for n in _wgmma_names()]:
        engine = conv_engines.ENGINES[f"tensorcore16-{tile}"]
        plain, fused = (_blob(np.full(y.shape, np.nan), dtype) for _ in range(2))
        ws = backend.workspace(*engine.scratch(prob, "forward", True))
        engine.forward(prob, x.gpu_data(), w.gpu_data(), b.gpu_data(), plain.mutable_gpu_data(), ws)
        engine.forward(prob, x.gpu_data(), w.gpu_data(), b.gpu_data(), fused.mutable_gpu_data(), ws, relu=True)
        got = fused.math_data().astype(np.float64)
        assert np.array_equal(got, np.maximum(plain.math_data(), 0)), tile
        tol = u * np.abs(y) + 2 * prob.kg * 2.0**-24 * a + 1e-6
        assert np.all(np.abs(got - np.maximum(y, 0)) <= tol), tile
        assert np.all(got >= 0), tile


@pytest.mark.parametrize("fmt", FORMATS)
def test_tensorcore16_nhwc_is_an_autotune_candidate(fmt):
    """The autotune times every NHWC tile on every pass among all engines."""
    prob = ConvProblem(8, 64, 14, 14, 64, 1, (3, 3), (1, 1), (1, 1), (1, 1), FORMATS[fmt][1])
    conv_engines.clear_cache()
    choice = conv_engines.choose(prob, True, conv_engines.field_candidates("DEFAULT"))
    timed = {(p, n) for p, n, _ in choice.timings}
    for tile in tc16n.TILES:
        assert ("forward", f"tensorcore16-nhwc-{tile}") in timed
        assert ("backward_data", f"tensorcore16-nhwc-{tile}") in timed
        assert ("backward_weight", f"tensorcore16-nhwc-{tile}") in timed
    conv_engines.clear_cache()


@pytest.mark.parametrize("fmt", FORMATS)
def test_tensorcore16_nhwc_weight_gradient_is_reproducible(fmt):
    """The split-K weight gradient (fp32 partial sums, fixed-order reduction) gives the same bits twice."""
    dtype, code, _ = FORMATS[fmt]
    prob = ConvProblem(16, 64, 14, 14, 48, 1, (3, 3), (1, 1), (1, 1), (1, 1), code)
    rng = np.random.default_rng(9)
    x = _blob(rng.standard_normal((16, 64, 14, 14)), dtype)
    dy = _blob(rng.standard_normal((16, 48) + prob.out_hw), dtype)
    for tile in tc16n.TILES:
        engine = conv_engines.ENGINES[f"tensorcore16-nhwc-{tile}"]
        assert tc16n.weight_splits(prob, tile)[0] >= 1
        runs = []
        for _ in range(2):
            dw, db = _blob(np.zeros((48, 64, 3, 3)), dtype), _blob(np.zeros(48), dtype)
            ws = backend.workspace(*engine.scratch(prob, "backward_weight", True))
            engine.backward_weight(prob, x.gpu_data(), dy.gpu_data(), dw.mutable_gpu_data(), db.mutable_gpu_data(), ws)
            runs.append((dw.cpu_data().copy(), db.cpu_data().copy()))
        assert all(np.array_equal(a, b) for a, b in zip(*runs)), tile
        assert np.any(runs[0][0] != 0), tile


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(2, 24, 49), (3, 136, 196), (1, 64, 3136), (2, 8, 5), (3, 3, 1000), (2, 13, 9)],
                         ids=str)
def test_tensorcore16_nhwc_staging_is_the_transpose(shape, fmt):
    """t16n_to_nhwc (C % 8 == 0) and t16n_to_nhwc_narrow (others) move every element of (N, C, HW)
    to (N, HW, C') exactly (bits unchanged), C' = C rounded up to 8 with zeros past C."""
    dtype, code, _ = FORMATS[fmt]
    num, c, plane = shape
    padded = -(-c // 8) * 8
    src = _blob(np.random.default_rng(6).standard_normal(shape), dtype)
    dst = _blob(np.full((num, plane, padded), np.nan), dtype)
    prob = ConvProblem(num, c, plane, 1, 8, 1, (1, 1), (0, 0), (1, 1), (1, 1), code)
    tc16n.stage_plan(prob, num, c, plane)(src.gpu_data(), dst.mutable_gpu_data())
    want = np.zeros_like(dst.cpu_data())
    want[..., :c] = src.cpu_data().transpose(0, 2, 1)
    assert np.array_equal(dst.cpu_data(), want)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", NHWC_SHAPES, ids=str)
def test_tensorcore16_nhwc_backward_pair_equals_the_passes_in_turn(shape, fmt):
    """run_backward with NHWC engines on both gradients (dy staged once, for the weight gradient;
    any pair of tiles) gives the bits of the two passes run one after the other; with another
    engine family for the data gradient, or M % 8 != 0, it runs the passes in turn."""
    dtype, code, _ = FORMATS[fmt]
    prob = ConvProblem(*shape, code)
    n, c, h, w_, m, _, (kh, kw) = shape[:7]
    rng = np.random.default_rng(21)
    x, w = _blob(rng.standard_normal((n, c, h, w_)), dtype), _blob(rng.standard_normal((m, c, kh, kw)), dtype)
    dy = _blob(rng.standard_normal((n, m) + prob.out_hw), dtype)
    dw0, db0 = rng.standard_normal((m, c, kh, kw)), rng.standard_normal(m)
    pairs = [(tc16n.TILES[0], f"nhwc-{tc16n.TILES[0]}"), (tc16n.TILES[1], f"nhwc-{tc16n.TILES[3]}"),
             (tc16n.TILES[3], tc16.TILES[0])]
    pairs += [(tc16n.TILES[i % 2], n.removeprefix("tensorcore16-")) for i, n in enumerate(_wgmma_names())]
    if tc16n.cublas_supports(prob):  # the 1x1 weight gradient on cuBLAS hands its staged dy over too
        pairs += [("cublas", f"nhwc-{tc16n.TILES[0]}")] + [("cublas", n.removeprefix("tensorcore16-"))
                                                            for n in _wgmma_names()[:1]]
    for weight_tile, data_tile in pairs:
        data_name = f"tensorcore16-{data_tile}"
        choice = conv_engines.Choice("", data_name, f"tensorcore16-nhwc-{weight_tile}", ())
        results = []
        for paired in (False, True):
            dx = _blob(np.full((n, c, h, w_), np.nan), dtype)
            dw, db = _blob(dw0, dtype), _blob(db0, dtype)
            args = (x.gpu_data(), w.gpu_data(), dy.gpu_data(), dw.mutable_gpu_data(), db.mutable_gpu_data(),
                    dx.mutable_gpu_data())
            if paired:
                conv_engines.run_backward(prob, choice, *args)
            else:
                conv_engines.run(prob, choice, "backward_weight", args[0], args[2], args[3], args[4])
                conv_engines.run(prob, choice, "backward_data", args[1], args[2], args[5])
            results.append([b.cpu_data().copy() for b in (dx, dw, db)])
            assert np.isfinite(dx.math_data()).all(), (weight_tile, data_tile, paired)  # every dx written
        for got, want in zip(results[1], results[0]):
            assert np.array_equal(got, want), (weight_tile, data_tile)


# ---- the wgmma engines (tensorcore16-wgmma-*, compute capability 9.0): forward and data gradient
# (tensorcore16-nhwc's staging and phases, the GEMM on wgmma), tensorcore16's tight bound
WGMMA_NAMES = {f"tensorcore16-wgmma-{t}" for t in wgmma.TILES}


def _hopper() -> bool:
    return tc16.compute_capability() == (9, 0)


def _wgmma_names() -> list[str]:
    """The wgmma engines where this device runs them (none before compute capability 9.0)."""
    return sorted(WGMMA_NAMES) if _hopper() else []


WGMMA_SHAPES = NHWC_SHAPES + [
    (2, 128, 20, 20, 256, 1, (3, 3), (1, 1), (1, 1), (1, 1)),  # 18 slices, two 128-row tiles, ragged columns
    (3, 72, 9, 9, 64, 1, (3, 3), (1, 1), (1, 1), (1, 1)),  # C = 64 + 8: a one-chunk slice per tap; M = 64
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", WGMMA_SHAPES, ids=str)
def test_tensorcore16_wgmma_every_tile(shape, fmt):
    if not _hopper():
        pytest.skip("wgmma runs on compute capability 9.0 only")
    prob = ConvProblem(*shape, FORMATS[fmt][1])
    assert wgmma.supports(prob)
    for i, name in enumerate(_wgmma_names()):
        assert conv_engines.ENGINES[name].passes == ("forward", "backward_data")
        _check_engine(name, prob, fmt, seed=20 + i)


@pytest.mark.parametrize("fmt", FORMATS)
def test_tensorcore16_wgmma_is_an_autotune_candidate_of_its_passes(fmt):
    """The autotune times every wgmma tile on the forward and the data gradient, never on the weight
    gradient (not offered)."""
    if not _hopper():
        pytest.skip("wgmma runs on compute capability 9.0 only")
    prob = ConvProblem(8, 64, 14, 14, 64, 1, (3, 3), (1, 1), (1, 1), (1, 1), FORMATS[fmt][1])
    conv_engines.clear_cache()
    choice = conv_engines.choose(prob, True, conv_engines.field_candidates("DEFAULT"))
    timed = {(p, n) for p, n, _ in choice.timings}
    for name in WGMMA_NAMES:
        assert ("forward", name) in timed and ("backward_data", name) in timed
        assert ("backward_weight", name) not in timed
    assert choice.backward_weight not in WGMMA_NAMES
    conv_engines.clear_cache()
