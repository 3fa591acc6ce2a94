"""Interp: output sizes (zoom, shrink, both, height/width, cropping), aligned-corner bilinear values
against a naive reference, the adjoint backward, gradients, CPU/GPU agreement, errors."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

X = np.random.default_rng(7).standard_normal((2, 3, 5, 4))


def naive(x, ho, wo, pad_beg=0, pad_end=0):
    """Pixel by pixel: the fork's single-precision ratio, then the bilinear blend in float64."""
    o = -pad_beg
    hi, wi = x.shape[2] + pad_beg + pad_end, x.shape[3] + pad_beg + pad_end
    xc = x[:, :, o:o + hi, o:o + wi]
    y = np.zeros(x.shape[:2] + (ho, wo))
    rh = np.float32(hi - 1) / np.float32(ho - 1) if ho > 1 else np.float32(0)
    rw = np.float32(wi - 1) / np.float32(wo - 1) if wo > 1 else np.float32(0)
    for h in range(ho):
        for w in range(wo):
            sh, sw = float(np.float32(rh * np.float32(h))), float(np.float32(rw * np.float32(w)))
            a, b = int(sh), int(sw)
            a2, b2 = min(a + 1, hi - 1), min(b + 1, wi - 1)
            fh, fw = sh - a, sw - b
            y[:, :, h, w] = ((1 - fh) * ((1 - fw) * xc[:, :, a, b] + fw * xc[:, :, a, b2])
                             + fh * ((1 - fw) * xc[:, :, a2, b] + fw * xc[:, :, a2, b2]))
    return y


@pytest.mark.parametrize("param,size,pads", [
    ("zoom_factor: 2", (9, 7), (0, 0)),
    ("zoom_factor: 3", (13, 10), (0, 0)),
    ("shrink_factor: 2", (3, 2), (0, 0)),
    ("shrink_factor: 2 zoom_factor: 3", (7, 4), (0, 0)),
    ("height: 8 width: 11", (8, 11), (0, 0)),
    ("height: 1 width: 1", (1, 1), (0, 0)),
    ("height: 5 width: 4", (5, 4), (0, 0)),  # same size: a copy
    ("zoom_factor: 2 pad_beg: -1 pad_end: -1", (5, 3), (-1, -1)),
])
def test_forward_backward(mode, param, size, pads):
    layer, bottom, top = run_layer(f'type: "Interp" interp_param {{ {param} }}', [X])
    assert top[0].shape == (2, 3) + size
    np.testing.assert_allclose(top[0].cpu_data(), naive(X, *size, *pads), rtol=1e-12, atol=1e-14)
    # Backward is the adjoint: <dy, A x> = <A^T dy, x> for the linear map A.
    dy = top[0].cpu_diff()
    assert np.isclose(np.vdot(dy, top[0].cpu_data()), np.vdot(bottom[0].cpu_diff(), X), rtol=1e-12)
    if pads != (0, 0):
        assert not bottom[0].cpu_diff()[:, :, 0].any() and not bottom[0].cpu_diff()[:, :, -1].any()


def test_exact_values():
    x = np.array([[[[0.0, 2.0], [4.0, 6.0]]]])
    _, _, top = run_layer('type: "Interp" interp_param { zoom_factor: 2 }', [x])
    np.testing.assert_allclose(top[0].cpu_data()[0, 0], [[0, 1, 2], [2, 3, 4], [4, 5, 6]])


def test_errors():
    with pytest.raises(caffe.NetError, match="needs zoom_factor"):
        run_layer('type: "Interp" interp_param { height: 3 }', [X])
    with pytest.raises(caffe.NetError, match="<= 0"):
        run_layer('type: "Interp" interp_param { zoom_factor: 2 pad_beg: 1 }', [X])
    with pytest.raises(caffe.NetError, match=r"\(N, C, H, W\)"):
        run_layer('type: "Interp" interp_param { zoom_factor: 2 }', [X[0]])
    with pytest.raises(caffe.NetError, match="shrink_factor must be >= 1"):
        run_layer('type: "Interp" interp_param { shrink_factor: 0 }', [X])


@pytest.mark.parametrize("param", ["zoom_factor: 2", "height: 3 width: 6", "shrink_factor: 2"])
def test_gradient(mode, param):
    layer = make_layer(f'type: "Interp" interp_param {{ {param} }}')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([X[:1, :2]]), empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("param", ["zoom_factor: 8", "height: 17 width: 5", "shrink_factor: 2 zoom_factor: 2",
                                   "zoom_factor: 2 pad_beg: -1 pad_end: -2", "height: 5 width: 4"])
def test_cpu_gpu_agree(param):
    assert_cpu_gpu_agree(f'type: "Interp" interp_param {{ {param} }}', [X], rtol=1e-10, atol=1e-12)
    assert_cpu_gpu_agree(f'type: "Interp" interp_param {{ {param} }}', [X], dtype=np.float32, rtol=1e-5,
                         atol=1e-5)
