"""Im2col layer: columns against explicit loops (2-D and 3-D), gradients, the link to Convolution,
errors, CPU-vs-GPU agreement."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer


def text(body: str) -> str:
    return f'name: "cols" type: "Im2col" convolution_param {{ {body} }}'


def naive_im2col(x, kernel, pad, stride, dilation):
    n, c, *size = x.shape
    out = [(s + 2 * p - (d * (k - 1) + 1)) // st + 1 for s, k, p, st, d in zip(size, kernel, pad, stride, dilation)]
    kk = int(np.prod(kernel))
    y = np.zeros((n, c * kk, *out))
    for ch in range(c):
        for r, k in enumerate(itertools.product(*map(range, kernel))):
            for o in itertools.product(*map(range, out)):
                i = [oo * st - p + kq * d for oo, kq, p, st, d in zip(o, k, pad, stride, dilation)]
                if all(0 <= ii < s for ii, s in zip(i, size)):
                    y[(slice(None), ch * kk + r, *o)] = x[(slice(None), ch, *i)]
    return y


CASES = [
    ((2, 3, 6, 5), "kernel_size: 3", (3, 3), (0, 0), (1, 1), (1, 1)),
    ((2, 2, 7, 6), "kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0 dilation: 1 dilation: 2",
     (3, 2), (1, 0), (2, 1), (1, 2)),
    ((1, 2, 5, 4, 6), "kernel_size: 2 kernel_size: 3 kernel_size: 2 stride: 2 pad: 1", (2, 3, 2), (1, 1, 1),
     (2, 2, 2), (1, 1, 1)),
    ((2, 3, 8), "kernel_size: 3 dilation: 2 pad: 2", (3,), (2,), (1,), (2,)),
]


@pytest.mark.parametrize("shape,body,kernel,pad,stride,dilation", CASES)
def test_forward_matches_naive(mode, shape, body, kernel, pad, stride, dilation):
    x = np.random.default_rng(0).standard_normal(shape)
    layer = make_layer(text(body))
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    want = naive_im2col(x, kernel, pad, stride, dilation)
    assert top[0].shape == want.shape
    np.testing.assert_array_equal(top[0].data, want)


@pytest.mark.parametrize("shape,body", [(c[0], c[1]) for c in CASES])
@pytest.mark.slow
def test_gradient(mode, shape, body):
    layer = make_layer(text(body))
    bottom, top = blobs([np.random.default_rng(1).standard_normal(shape)]), empty_blobs(1)
    GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)


def test_columns_times_weights_is_the_convolution(mode):
    """Im2col's top, multiplied by a Convolution's weights (M, C*kh*kw), gives that Convolution's top."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 7, 6))
    geometry = "kernel_size: 3 stride: 2 pad: 1 dilation: 1"
    conv = make_layer(f'name: "c" type: "Convolution" convolution_param {{ num_output: 4 {geometry} bias_term: false '
                      'weight_filler { type: "gaussian" std: 1 } }')
    cb, ct = blobs([x]), empty_blobs(1)
    conv.setup(cb, ct)
    conv.forward(cb, ct)
    cols = make_layer(text(geometry))
    b, t = blobs([x]), empty_blobs(1)
    cols.setup(b, t)
    cols.forward(b, t)
    w = conv.blobs[0].data.reshape(4, -1)
    got = np.einsum("mk,nkhw->nmhw", w, t[0].data)
    np.testing.assert_allclose(got, ct[0].data, rtol=1e-10, atol=1e-10)


def test_channel_axis():
    x = np.random.default_rng(3).standard_normal((2, 2, 3, 5, 4))
    layer = make_layer(text("kernel_size: 2 axis: 2"))
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape == (2, 2, 12, 4, 3)
    want = naive_im2col(x.reshape(4, 3, 5, 4), (2, 2), (0, 0), (1, 1), (1, 1))
    np.testing.assert_array_equal(top[0].data.reshape(want.shape), want)


@pytest.mark.parametrize("shape,body,match", [
    ((1, 2, 4, 4), "kernel_size: 5", "larger than the input"),
    ((1, 2, 4, 4), "stride: 2", "needs kernel_size"),
    ((1, 2), "kernel_size: 1", "no spatial axis"),
    ((1, 2, 4, 4, 4), "kernel_size: 2 kernel_size: 2", "kernel_size has 2 values"),
])
def test_errors(shape, body, match):
    layer = make_layer(text(body))
    with pytest.raises(NetError, match=match) as info:
        layer.setup(blobs([np.zeros(shape)]), empty_blobs(1))
    assert "layer 'cols'" in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,body", [(c[0], c[1]) for c in CASES])
def test_cpu_gpu_agree(shape, body, dtype):
    x = np.random.default_rng(4).standard_normal(shape)
    assert_cpu_gpu_agree(text(body), [x], dtype=dtype, rtol=1e-6 if dtype == np.float32 else 1e-12)
