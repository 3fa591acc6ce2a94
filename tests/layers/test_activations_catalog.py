"""Element-wise activation catalog: PReLU, ELU, Swish, Power, Exp, Log, AbsVal, BNLL, Threshold, Clip.

Each case gives the layer text, an independent numpy reference (float64) and how to draw inputs that
stay in the function's domain and away from its kinks (so central differences are meaningful).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer

SHAPE = (2, 3, 2, 3)


def sigmoid(x):
    e = np.exp(-np.abs(x))  # no overflow for large |x|
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def prelu_ref(x, layer):
    a = layer.blobs[0].cpu_data().astype(np.float64).reshape(-1)
    a = a.reshape(()) if a.size == 1 and layer.blobs[0].num_axes == 0 else a.reshape(1, -1, *([1] * (x.ndim - 2)))
    out = np.empty_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for v in it:  # naive loop: the slope of element (n, c, ...) is a[c]
        c = it.multi_index[1]
        slope = float(a) if a.ndim == 0 else a.reshape(-1)[c]
        out[it.multi_index] = v if v > 0 else slope * v
    return out


def f32(v: float) -> float:
    """A prototxt float as the layer sees it (proto fields are float32)."""
    return float(np.float32(v))


def power_ref(p, scale, shift):
    p, scale, shift = f32(p), f32(scale), f32(shift)
    return lambda x, _: np.power(shift + scale * x, p) if p * scale != 0 else np.full_like(x, 1.0 if p == 0 else shift**p)


@dataclass
class Case:
    id: str
    text: str
    ref: Callable[[np.ndarray, object], np.ndarray]
    low: float = -2.0
    high: float = 2.0
    kinks: tuple = ()
    backward: bool = True
    in_place_safe: bool = False


CASES = [
    Case("prelu", "type: 'PReLU' prelu_param { filler { type: 'uniform' min: 0.1 max: 0.6 } }", prelu_ref,
         kinks=(0.0,), in_place_safe=True),
    Case("prelu_shared", "type: 'PReLU' prelu_param { channel_shared: true }", prelu_ref, kinks=(0.0,),
         in_place_safe=True),
    Case("elu", "type: 'ELU'", lambda x, _: np.where(x > 0, x, np.exp(x) - 1), in_place_safe=True),
    Case("elu_alpha", "type: 'ELU' elu_param { alpha: 0.5 }", lambda x, _: np.where(x > 0, x, 0.5 * (np.exp(x) - 1)),
         kinks=(0.0,), in_place_safe=True),
    Case("swish", "type: 'Swish'", lambda x, _: x * sigmoid(x), in_place_safe=True),
    Case("swish_beta", "type: 'Swish' swish_param { beta: 2.5 }", lambda x, _: x * sigmoid(2.5 * x),
         in_place_safe=True),
    Case("power_square", "type: 'Power' power_param { power: 2 scale: 0.5 shift: 1.5 }", power_ref(2, 0.5, 1.5)),
    Case("power_sqrt", "type: 'Power' power_param { power: 0.5 scale: 2 shift: 1 }", power_ref(0.5, 2, 1),
         low=0.1, high=2.0),
    Case("power_cube_noshift", "type: 'Power' power_param { power: 3 }", power_ref(3, 1, 0), kinks=(0.0,)),
    Case("power_linear", "type: 'Power' power_param { power: 1 scale: -2 shift: 0.3 }", power_ref(1, -2, 0.3)),
    Case("power_negative", "type: 'Power' power_param { power: -1.5 scale: 1.5 shift: 0.25 }",
         power_ref(-1.5, 1.5, 0.25), low=0.5, high=2.0),
    Case("power_zero", "type: 'Power' power_param { power: 0 scale: 3 shift: 2 }", power_ref(0, 3, 2)),
    Case("power_scale_zero", "type: 'Power' power_param { power: 2 scale: 0 shift: 3 }", power_ref(2, 0, 3)),
    Case("exp", "type: 'Exp'", lambda x, _: np.exp(x), in_place_safe=True),
    Case("exp_base2", "type: 'Exp' exp_param { base: 2 scale: 0.5 shift: 1 }", lambda x, _: 2.0 ** (1 + 0.5 * x),
         in_place_safe=True),
    Case("log", "type: 'Log'", lambda x, _: np.log(x), low=0.3, high=3.0),
    Case("log_base10", "type: 'Log' log_param { base: 10 scale: 2 shift: 0.5 }",
         lambda x, _: np.log10(0.5 + 2 * x), low=0.1, high=3.0),
    Case("absval", "type: 'AbsVal'", lambda x, _: np.abs(x), kinks=(0.0,)),
    Case("bnll", "type: 'BNLL'", lambda x, _: np.log1p(np.exp(x)), low=-4, high=4),
    Case("threshold", "type: 'Threshold' threshold_param { threshold: 0.3 }",
         lambda x, _: (x > f32(0.3)).astype(np.float64), kinks=(0.3,), backward=False),
    Case("clip", "type: 'Clip' clip_param { min: -0.5 max: 0.7 }", lambda x, _: np.clip(x, -0.5, f32(0.7)),
         kinks=(-0.5, 0.7)),
]
GRAD_CASES = [c for c in CASES if c.backward]


def draw(case: Case, seed: int = 0, shape=SHAPE) -> np.ndarray:
    """Inputs in [low, high], none within 0.05 of a kink (those are moved 0.1 away from it)."""
    x = np.random.default_rng(seed).uniform(case.low, case.high, shape)
    for k in case.kinks:
        near = np.abs(x - k) < 0.05
        x[near] = k + np.where(x[near] >= k, 0.1, -0.1)
    return x


def tol(dtype) -> dict:
    return {"rtol": 2e-5, "atol": 2e-6} if np.dtype(dtype) == np.float32 else {"rtol": 1e-12, "atol": 1e-13}


def setup_layer(case: Case, x: np.ndarray, dtype):
    layer = make_layer(case.text, dtype)
    bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_matches_numpy(case, dtype, mode):
    x = draw(case, seed=1).astype(dtype)
    layer, bottom, top = setup_layer(case, x, dtype)
    layer.forward(bottom, top)
    assert top[0].shape == SHAPE
    expected = case.ref(x.astype(np.float64), layer)
    np.testing.assert_allclose(top[0].cpu_data(), expected, **tol(dtype))


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_gradient(case, mode):
    x = draw(case, seed=2)
    layer, bottom, top = setup_layer(case, x, np.float64)
    checked = GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)
    assert checked >= x.size


@pytest.mark.parametrize("case", [c for c in CASES if c.in_place_safe], ids=lambda c: c.id)
def test_in_place_matches_out_of_place(case, mode):
    x = draw(case, seed=3)
    dy = np.random.default_rng(4).uniform(-1, 1, SHAPE)
    ref_layer, bottom, top = setup_layer(case, x, np.float64)
    ref_layer.forward(bottom, top)
    top[0].mutable_cpu_diff()[...] = dy
    ref_layer.backward(top, [True], bottom)

    layer = make_layer(case.text)
    blob = blobs([x])[0]
    layer.setup([blob], [blob])
    for mine, ref in zip(layer.blobs, ref_layer.blobs):
        mine.mutable_cpu_data()[...] = ref.cpu_data()
    layer.forward([blob], [blob])
    np.testing.assert_allclose(blob.cpu_data(), top[0].cpu_data(), rtol=1e-12)
    blob.mutable_cpu_diff()[...] = dy
    layer.backward([blob], [True], [blob])
    np.testing.assert_allclose(blob.cpu_diff(), bottom[0].cpu_diff(), rtol=1e-12, atol=1e-14)
    for mine, ref in zip(layer.blobs, ref_layer.blobs):
        np.testing.assert_allclose(mine.cpu_diff(), ref.cpu_diff(), rtol=1e-12, atol=1e-14)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_gpu_agreement(case, dtype):
    looser = {"rtol": 1e-4, "atol": 1e-5} if np.dtype(dtype) == np.float32 else tol(dtype)
    assert_cpu_gpu_agree(case.text, [draw(case, seed=5)], propagate=[case.backward], dtype=dtype, **looser)


# -- layer-specific behaviour ----------------------------------------------------------------
def test_prelu_default_filler_and_shapes():
    layer, _, _ = setup_layer(CASES[1], draw(CASES[1]), np.float64)
    assert layer.blobs[0].shape == ()
    assert float(layer.blobs[0].cpu_data()) == 0.25
    layer = make_layer("type: 'PReLU'")
    layer.setup(blobs([np.zeros((2, 5, 3))]), empty_blobs(1))
    assert layer.blobs[0].shape == (5,)
    np.testing.assert_array_equal(layer.blobs[0].cpu_data(), np.full(5, 0.25))


def test_prelu_param_gradient_accumulates(mode):
    x = draw(CASES[0], seed=7)
    layer, bottom, top = setup_layer(CASES[0], x, np.float64)
    layer.forward(bottom, top)
    dy = np.random.default_rng(8).uniform(-1, 1, SHAPE)
    top[0].mutable_cpu_diff()[...] = dy
    layer.blobs[0].mutable_cpu_diff()[...] = 0
    layer.backward(top, [False], bottom)
    expected = np.where(x <= 0, dy * x, 0).sum(axis=(0, 2, 3))
    np.testing.assert_allclose(layer.blobs[0].cpu_diff(), expected, rtol=1e-12)
    layer.backward(top, [False], bottom)
    np.testing.assert_allclose(layer.blobs[0].cpu_diff(), 2 * expected, rtol=1e-12)


def test_prelu_on_2d_input(mode):
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]])
    layer = make_layer("type: 'PReLU' prelu_param { filler { type: 'constant' value: 0.1 } }")
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.blobs[0].mutable_cpu_data()[...] = [0.1, 0.2, 0.3]
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].cpu_data(), [[-0.1, 2.0, -0.9], [4.0, -1.0, 6.0]])


def test_prelu_rejects_bad_inputs():
    with pytest.raises(NetError, match="at least 2 axes"):
        make_layer("type: 'PReLU'").setup(blobs([np.zeros(4)]), empty_blobs(1))
    layer = make_layer("type: 'PReLU'")
    layer.setup(blobs([np.zeros((1, 3, 2))]), empty_blobs(1))
    other = make_layer("type: 'PReLU'")
    other.blobs = layer.blobs  # 3 slopes, but the new bottom has 4 channels
    with pytest.raises(NetError, match="3 values but the bottom has 4 channels"):
        other.setup(blobs([np.zeros((1, 4, 2))]), empty_blobs(1))


def test_threshold_backward_is_an_error(mode):
    layer, bottom, top = setup_layer(CASES[-2], draw(CASES[-2]), np.float64)
    layer.forward(bottom, top)
    layer.backward(top, [False], bottom)  # nothing asked: fine
    with pytest.raises(NetError, match="Threshold.*backward is not implemented"):
        layer.backward(top, [True], bottom)


def test_threshold_is_strict():
    layer, bottom, top = setup_layer(CASES[-2], np.array([[0.3, 0.31, 0.29, -1.0]]), np.float64)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].cpu_data(), [[0.0, 1.0, 0.0, 0.0]])


def test_clip_gradient_passes_at_the_bounds(mode):
    hi = f32(0.7)  # the bound as read from the float32 proto field
    x = np.array([[-0.5, hi, -0.6, 0.8, 0.0]])
    layer, bottom, top = setup_layer(CASES[-1], x, np.float64)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].cpu_data(), [[-0.5, hi, -0.5, hi, 0.0]])
    top[0].mutable_cpu_diff()[...] = 2.0
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].cpu_diff(), [[2.0, 2.0, 0.0, 0.0, 2.0]])


def test_clip_requires_min_and_max():
    with pytest.raises(NetError, match="clip_param.max required"):
        make_layer("type: 'Clip' clip_param { min: 0 }").setup(blobs([np.zeros(2)]), empty_blobs(1))


def test_absval_refuses_in_place():
    layer = make_layer("type: 'AbsVal'")
    b = blobs([np.zeros(3)])[0]
    with pytest.raises(NetError, match="in-place"):
        layer.setup([b], [b])


def test_absval_gradient_at_zero_is_zero(mode):
    layer, bottom, top = setup_layer(CASES[-4], np.array([-2.0, 0.0, 3.0]), np.float64)
    layer.forward(bottom, top)
    top[0].mutable_cpu_diff()[...] = 5.0
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].cpu_diff(), [-5.0, 0.0, 5.0])


@pytest.mark.parametrize("text", ["type: 'Exp' exp_param { base: -2 }", "type: 'Exp' exp_param { base: 0 }",
                                  "type: 'Log' log_param { base: 1 }", "type: 'Log' log_param { base: -0.5 }"])
def test_bad_base_rejected(text):
    with pytest.raises(NetError, match="base must be positive"):
        make_layer(text).setup(blobs([np.ones(2)]), empty_blobs(1))


def test_bnll_is_stable_for_large_inputs(mode):
    x = np.array([-800.0, -40.0, 0.0, 40.0, 800.0])
    layer, bottom, top = setup_layer(CASES[-3], x, np.float64)
    layer.forward(bottom, top)
    expected = [0.0, math.log1p(math.exp(-40.0)), math.log(2.0), 40.0 + math.log1p(math.exp(-40.0)), 800.0]
    np.testing.assert_allclose(top[0].cpu_data(), expected, rtol=1e-12, atol=1e-300)
    top[0].mutable_cpu_diff()[...] = 1.0
    layer.backward(top, [True], bottom)
    assert np.isfinite(bottom[0].cpu_diff()).all()
    np.testing.assert_allclose(bottom[0].cpu_diff(), sigmoid(np.minimum(x, 50.0)), rtol=1e-12, atol=1e-300)


def test_power_zero_scale_gives_zero_gradient(mode):
    case = next(c for c in CASES if c.id == "power_scale_zero")
    layer, bottom, top = setup_layer(case, draw(case), np.float64)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].cpu_data(), np.full(SHAPE, 9.0))
    top[0].mutable_cpu_diff()[...] = 1.0
    bottom[0].mutable_cpu_diff()[...] = np.nan
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].cpu_diff(), np.zeros(SHAPE))


def test_propagate_down_false_leaves_bottom_diff(mode):
    for case in GRAD_CASES:
        layer, bottom, top = setup_layer(case, draw(case), np.float64)
        layer.forward(bottom, top)
        top[0].mutable_cpu_diff()[...] = 1.0
        bottom[0].mutable_cpu_diff()[...] = 7.0
        layer.backward(top, [False], bottom)
        np.testing.assert_array_equal(bottom[0].cpu_diff(), np.full(SHAPE, 7.0), err_msg=case.id)


def test_all_types_registered():
    names = set(caffe.layer_type_list())
    assert {"PReLU", "ELU", "Swish", "Power", "Exp", "Log", "AbsVal", "BNLL", "Threshold", "Clip"} <= names
