"""ArgMax: top_k indices / values, with and without axis, Caffe's tie order and top shapes."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, make_layer, run_layer

RNG = np.random.default_rng(7)
X = RNG.permutation(60).reshape(2, 3, 5, 2).astype(np.float64)  # distinct values


def naive_topk(row, k):
    """Selection by repeated max; ties pick the larger index (Caffe's pair ordering)."""
    row = list(row)
    out = []
    for _ in range(k):
        best = max((v, i) for i, v in enumerate(row) if i not in out)
        out.append(best[1])
    return out


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("out_max_val", [False, True])
def test_no_axis(mode, k, out_max_val):
    text = f'type: "ArgMax" argmax_param {{ top_k: {k} out_max_val: {str(out_max_val).lower()} }}'
    _, _, top = run_layer(text, [X], propagate=[False])
    assert top[0].shape == (2, 2 if out_max_val else 1, k, 1)
    y = top[0].cpu_data()
    for n in range(2):
        row = X[n].ravel()
        idx = naive_topk(row, k)
        np.testing.assert_array_equal(y[n, 0, :, 0], idx)
        if out_max_val:
            np.testing.assert_array_equal(y[n, 1, :, 0], row[idx])


@pytest.mark.parametrize("axis", [1, 2, -1])
@pytest.mark.parametrize("out_max_val", [False, True])
def test_axis(mode, axis, out_max_val):
    k = 2
    text = f'type: "ArgMax" argmax_param {{ axis: {axis} top_k: {k} out_max_val: {str(out_max_val).lower()} }}'
    _, _, top = run_layer(text, [X], propagate=[False])
    moved = np.moveaxis(X, axis, -1)
    expect = np.zeros(moved.shape[:-1] + (k,))
    for pos in np.ndindex(*moved.shape[:-1]):
        idx = naive_topk(moved[pos], k)
        expect[pos] = moved[pos][idx] if out_max_val else idx
    np.testing.assert_array_equal(top[0].cpu_data(), np.moveaxis(expect, -1, axis))


def test_ties_rank_larger_index_first():
    x = np.array([[1.0, 3.0, 3.0, 0.0, 3.0]])
    _, _, top = run_layer('type: "ArgMax" argmax_param { top_k: 4 }', [x], propagate=[False])
    np.testing.assert_array_equal(top[0].cpu_data().ravel(), [4, 2, 1, 0])


def test_two_axis_bottom_gives_three_axis_top():
    _, _, top = run_layer('type: "ArgMax"', [np.array([[0.0, 2.0, 1.0], [5.0, 4.0, 3.0]])], propagate=[False])
    assert top[0].shape == (2, 1, 1)
    np.testing.assert_array_equal(top[0].cpu_data().ravel(), [1, 0])


def test_errors():
    with pytest.raises(caffe.NetError, match="top_k"):
        run_layer('type: "ArgMax" argmax_param { top_k: 61 }', [X], propagate=[False])
    with pytest.raises(caffe.NetError, match="top_k"):
        run_layer('type: "ArgMax" argmax_param { axis: 1 top_k: 4 }', [X], propagate=[False])
    with pytest.raises(caffe.NetError, match="no gradient"):
        run_layer('type: "ArgMax"', [X], propagate=[True])
    assert make_layer('type: "ArgMax"').allow_force_backward(0) is False


@pytest.mark.gpu
def test_cpu_gpu_agree():
    assert_cpu_gpu_agree('type: "ArgMax" argmax_param { top_k: 3 out_max_val: true }', [X], propagate=[False])
    assert_cpu_gpu_agree('type: "ArgMax" argmax_param { axis: 2 top_k: 2 }', [X], propagate=[False])
