"""Filter (BVLC's): selected items forwarded in order for every bottom, zero diffs for the others,
the first-reshape rule, gradient checks, errors, CPU-vs-GPU agreement, use in a net."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

RNG = np.random.default_rng(9)
A = RNG.standard_normal((5, 3, 2))
B = RNG.standard_normal((5, 4))
SEL = np.array([[1.0], [0.0], [2.5], [0.0], [-1.0]])  # items 0, 2, 4
TEXT = 'type: "Filter"'


def test_forward_backward(mode):
    _, bottom, top = run_layer(TEXT, [A, B, SEL], ntop=2, propagate=[True, True, False])
    keep = [n for n in range(5) if SEL[n, 0] != 0]
    assert keep == [0, 2, 4]
    for b, t, src in zip(bottom, top, (A, B)):
        assert t.shape == (3,) + src.shape[1:]
        for j, n in enumerate(keep):
            np.testing.assert_array_equal(t.cpu_data()[j], src[n])
            np.testing.assert_array_equal(b.cpu_diff()[n], t.cpu_diff()[j])
        for n in (1, 3):
            assert not b.cpu_diff()[n].any()


def test_first_reshape_keeps_all_items():
    layer = make_layer(TEXT)
    bottom, top = blobs([A, SEL]), empty_blobs(1)
    layer.setup(bottom, top)
    assert top[0].shape == A.shape
    layer.forward(bottom, top)
    assert top[0].shape == (3, 3, 2)


def test_gradient(mode):
    GradientChecker(1e-3, 1e-8).check(make_layer(TEXT), blobs([A, B, SEL]), empty_blobs(2), check_bottom=[0, 1])


def test_errors():
    with pytest.raises(NetError, match="selector"):
        run_layer(TEXT, [A, B, SEL], ntop=2, propagate=[True, True, True])
    with pytest.raises(NetError, match="one top per filtered bottom"):
        run_layer(TEXT, [A, B, SEL], ntop=1)
    with pytest.raises(NetError, match="size 1"):
        run_layer(TEXT, [A, np.ones((5, 2))])
    with pytest.raises(NetError, match="as many items"):
        run_layer(TEXT, [A[:4], SEL])


def test_in_net(tmp_path):
    (tmp_path / "f.prototxt").write_text("""
layer { name: "in" type: "Input" top: "x" top: "s" input_param { shape { dim: 4 dim: 2 } shape { dim: 4 } } }
layer { name: "filt" type: "Filter" bottom: "x" bottom: "s" top: "y" }
""")
    net = caffe.Net(str(tmp_path / "f.prototxt"), caffe.TEST)
    x = np.arange(8.0).reshape(4, 2)
    out = net.forward(x=x, s=np.array([0.0, 1.0, 1.0, 0.0]))
    np.testing.assert_array_equal(out["y"], x[1:3])


@pytest.mark.gpu
def test_cpu_gpu_agree():
    assert_cpu_gpu_agree(TEXT, [A, B, SEL], ntop=2, propagate=[True, True, False])
    assert_cpu_gpu_agree(TEXT, [A, B, SEL], ntop=2, propagate=[False, True, False], dtype=np.float32)
