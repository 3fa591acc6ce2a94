"""Weight fillers: values and statistics of every filler type."""

import math

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import Blob, fillers
from pycaffe_lite.errors import NetError
from pycaffe_lite.schema import caffe_pb2


def _fill(shape, dtype=np.float64, **kwargs):
    caffe.set_random_seed(1234)
    b = Blob(shape, dtype)
    fillers.fill(b, caffe_pb2.FillerParameter(**kwargs))
    return b.data.copy()


def test_default_is_constant_zero():
    b = Blob((3, 4))
    b.data[...] = 5
    fillers.fill(b, None)
    np.testing.assert_array_equal(b.data, 0)


def test_constant():
    v = _fill((2, 3, 4), type="constant", value=-1.5)
    np.testing.assert_array_equal(v, -1.5)


def test_uniform_range():
    v = _fill((100, 100), type="uniform", min=-2, max=3)
    assert v.min() >= -2 and v.max() <= 3
    assert v.min() < -1.9 and v.max() > 2.9
    assert abs(v.mean() - 0.5) < 0.05
    assert abs(v.var() - 25 / 12) < 0.1


def test_gaussian_mean_std():
    v = _fill((100, 200), type="gaussian", mean=1.0, std=0.5)
    assert abs(v.mean() - 1.0) < 0.01
    assert abs(v.std() - 0.5) < 0.01


@pytest.mark.parametrize("sparse", [2, 10])
def test_gaussian_sparse_fraction(sparse):
    # Caffe keeps each weight with probability sparse / num_outputs (shape[0]).
    v = _fill((20, 2000), type="gaussian", std=1.0, sparse=sparse)
    frac = np.count_nonzero(v) / v.size
    assert abs(frac - sparse / 20) < 0.02
    nonzero = v[v != 0]
    assert abs(nonzero.std() - 1.0) < 0.05


def test_positive_unitball_rows_sum_to_one():
    v = _fill((10, 3, 4, 5), type="positive_unitball")
    assert v.min() >= 0 and v.max() <= 1
    np.testing.assert_allclose(v.reshape(10, -1).sum(axis=1), 1.0, rtol=1e-12)


SHAPE = (100, 20, 3, 5)  # fan_in = 20*3*5 = 300, fan_out = 100*3*5 = 1500


@pytest.mark.parametrize(
    "norm,n", [("FAN_IN", 300), ("FAN_OUT", 1500), ("AVERAGE", 900)]
)
def test_xavier_scale(norm, n):
    v = _fill(SHAPE, type="xavier", variance_norm=getattr(caffe_pb2.FillerParameter, norm))
    scale = math.sqrt(3.0 / n)
    assert np.abs(v).max() <= scale
    assert np.abs(v).max() > 0.99 * scale
    assert abs(v.var() / (1.0 / n) - 1) < 0.05  # var of U(-s, s) = s^2 / 3 = 1 / n
    assert abs(v.mean()) < 0.01 * scale


@pytest.mark.parametrize(
    "norm,n", [("FAN_IN", 300), ("FAN_OUT", 1500), ("AVERAGE", 900)]
)
def test_msra_scale(norm, n):
    v = _fill(SHAPE, type="msra", variance_norm=getattr(caffe_pb2.FillerParameter, norm))
    assert abs(v.std() / math.sqrt(2.0 / n) - 1) < 0.03
    assert abs(v.mean()) < 0.01 * math.sqrt(2.0 / n)


def test_xavier_default_norm_is_fan_in_and_2d_fans():
    v = _fill((50, 400), type="xavier")  # fan_in 400
    assert np.abs(v).max() <= math.sqrt(3 / 400)
    assert np.abs(v).max() > 0.99 * math.sqrt(3 / 400)
    v = _fill((400, 50), type="msra", variance_norm=caffe_pb2.FillerParameter.FAN_OUT)  # fan_out 400
    assert abs(v.std() / math.sqrt(2 / 400) - 1) < 0.05


def test_bilinear_k4_exact():
    v = _fill((2, 3, 4, 4), type="bilinear")
    w = np.array([0.25, 0.75, 0.75, 0.25])
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(v[i, j], np.outer(w, w), rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [3, 6, 7])
def test_bilinear_other_sizes_match_bvlc(k):
    v = _fill((1, 1, k, k), type="bilinear")
    f = math.ceil(k / 2)
    c = (k - 1) / (2 * f)
    w = 1 - np.abs(np.arange(k) / f - c)
    np.testing.assert_allclose(v[0, 0], np.outer(w, w), atol=1e-6)
    np.testing.assert_allclose(v[0, 0], v[0, 0][::-1, ::-1], atol=1e-6)  # symmetric kernel


def test_bilinear_shape_errors():
    with pytest.raises(NetError, match="bilinear"):
        _fill((1, 1, 3, 4), type="bilinear")
    with pytest.raises(NetError, match="bilinear"):
        _fill((3, 3), type="bilinear")


def test_unknown_filler_lists_known_types():
    with pytest.raises(NetError, match="unknown filler type 'bogus'.*xavier"):
        _fill((2, 2), type="bogus")


def test_seed_makes_fills_repeatable_and_float32_works():
    a = _fill((5, 5), np.float32, type="gaussian", std=1)
    b = _fill((5, 5), np.float32, type="gaussian", std=1)
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
