"""Embed: lookup forward, weight/bias gradients (repeated indices add), no input gradient."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

IDX = np.array([[0, 3, 1], [3, 3, 2]], dtype=np.float64)  # repeats exercise accumulation
TEXT = ('type: "Embed" embed_param {{ num_output: 5 input_dim: 4 bias_term: {bias} '
        'weight_filler {{ type: "gaussian" }} bias_filler {{ type: "gaussian" }} }}')


@pytest.mark.parametrize("bias", [True, False])
def test_forward_backward(mode, bias):
    layer, _, top = run_layer(TEXT.format(bias=str(bias).lower()), [IDX], propagate=[False])
    w = layer.blobs[0].cpu_data()
    assert w.shape == (4, 5) and top[0].shape == (2, 3, 5)
    expect = np.zeros((2, 3, 5))
    dw = np.full((4, 5), 0.25)
    for pos in np.ndindex(2, 3):
        expect[pos] = w[int(IDX[pos])] + (layer.blobs[1].cpu_data() if bias else 0)
        dw[int(IDX[pos])] += top[0].cpu_diff()[pos]
    np.testing.assert_allclose(top[0].cpu_data(), expect, rtol=1e-12)
    np.testing.assert_allclose(layer.blobs[0].cpu_diff(), dw, rtol=1e-12)
    if bias:
        np.testing.assert_allclose(layer.blobs[1].cpu_diff(), 0.25 + top[0].cpu_diff().sum(axis=(0, 1)), rtol=1e-12)
    else:
        assert len(layer.blobs) == 1


def test_bad_index_and_input_gradient():
    with pytest.raises(caffe.NetError, match="input_dim"):
        run_layer(TEXT.format(bias="true"), [np.array([4.0])], propagate=[False])
    with pytest.raises(caffe.NetError, match="integer"):
        run_layer(TEXT.format(bias="true"), [np.array([1.5])], propagate=[False])
    with pytest.raises(caffe.NetError, match="back-propagate"):
        run_layer(TEXT.format(bias="true"), [IDX], propagate=[True])
    assert make_layer(TEXT.format(bias="true")).allow_force_backward(0) is False


def test_gradient(mode):
    layer = make_layer(TEXT.format(bias="true"))
    GradientChecker(1e-3, 1e-6).check(layer, blobs([IDX]), empty_blobs(1), check_bottom=[])


@pytest.mark.gpu
def test_cpu_gpu_agree():
    assert_cpu_gpu_agree(TEXT.format(bias="true"), [IDX], propagate=[False])
    assert_cpu_gpu_agree(TEXT.format(bias="false"), [IDX], propagate=[False], dtype=np.float32, rtol=1e-5, atol=1e-6)
