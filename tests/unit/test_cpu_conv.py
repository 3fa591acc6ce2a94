"""CPU convolution kernels (pycaffe_lite.conv.cpu): both layouts against naive loops over the
convolution's definition, for forward, weight/bias accumulation and the bottom gradient."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite.conv import cpu as cpu_conv
from pycaffe_lite.conv.geometry import out_shape

# (x shape, num_output, kernel, pad, stride, dilation, group)
GEOMETRIES = [
    ((2, 3, 6, 6), 4, (3, 3), (0, 0), (1, 1), (1, 1), 1),
    ((2, 2, 7, 6), 3, (3, 2), (1, 0), (2, 1), (1, 1), 1),
    ((1, 2, 9, 9), 2, (3, 3), (2, 2), (1, 1), (2, 2), 1),
    ((3, 4, 8, 7), 6, (2, 3), (1, 2), (3, 2), (2, 1), 2),
    ((2, 4, 4, 4), 4, (1, 1), (0, 0), (1, 1), (1, 1), 4),
    ((2, 1, 4, 4), 2, (4, 4), (0, 0), (1, 1), (1, 1), 1),
    ((2, 6, 5, 5), 4, (3, 3), (1, 1), (2, 2), (1, 1), 2),
    # BVLC's truncating output size: windows overhanging the padded input read zeros
    ((2, 3, 1, 1), 2, (2, 2), (0, 0), (2, 2), (1, 1), 1),
    ((2, 2, 2, 5), 3, (3, 3), (0, 1), (2, 3), (1, 1), 1),
    ((1, 2, 3, 3), 2, (3, 2), (0, 0), (4, 2), (2, 1), 2),
]


def naive_forward(x, w, b, kernel, pad, stride, dilation, group):
    n, c, h, wd = x.shape
    m = w.shape[0]
    ho, wo = out_shape(h, wd, kernel, pad, stride, dilation)
    cg, mg = c // group, m // group
    y = np.zeros((n, m, ho, wo))
    for o in range(m):
        g = o // mg
        for ci in range(cg):
            for i in range(kernel[0]):
                for j in range(kernel[1]):
                    for yy in range(ho):
                        for xx in range(wo):
                            iy = yy * stride[0] - pad[0] + i * dilation[0]
                            ix = xx * stride[1] - pad[1] + j * dilation[1]
                            if 0 <= iy < h and 0 <= ix < wd:
                                y[:, o, yy, xx] += w[o, ci, i, j] * x[:, g * cg + ci, iy, ix]
    return y + b[:, None, None]


def naive_backward(x, w, dy, kernel, pad, stride, dilation, group):
    """(dW, db, dx) from the same index relation as naive_forward."""
    n, c, h, wd = x.shape
    m = w.shape[0]
    ho, wo = dy.shape[2:]
    cg, mg = c // group, m // group
    dw, dx = np.zeros(w.shape), np.zeros(x.shape)
    for o in range(m):
        g = o // mg
        for ci in range(cg):
            for i in range(kernel[0]):
                for j in range(kernel[1]):
                    for yy in range(ho):
                        for xx in range(wo):
                            iy = yy * stride[0] - pad[0] + i * dilation[0]
                            ix = xx * stride[1] - pad[1] + j * dilation[1]
                            if 0 <= iy < h and 0 <= ix < wd:
                                dw[o, ci, i, j] += dy[:, o, yy, xx] @ x[:, g * cg + ci, iy, ix]
                                dx[:, g * cg + ci, iy, ix] += w[o, ci, i, j] * dy[:, o, yy, xx]
    return dw, dy.sum(axis=(0, 2, 3)), dx


def make_case(shape, m, kernel, pad, stride, dilation, group, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    w = rng.standard_normal((m, shape[1] // group) + kernel)
    b = rng.standard_normal(m)
    ho, wo = out_shape(shape[2], shape[3], kernel, pad, stride, dilation)
    dy = rng.standard_normal((shape[0], m, ho, wo))
    return x, w, b, dy


@pytest.mark.parametrize("layout", ["nchw", "hwn"])
@pytest.mark.parametrize("shape,m,kernel,pad,stride,dilation,group", GEOMETRIES)
def test_forward_matches_naive(layout, shape, m, kernel, pad, stride, dilation, group):
    x, w, b, dy = make_case(shape, m, kernel, pad, stride, dilation, group)
    out = np.full(dy.shape, np.nan)
    cpu_conv.forward(x, w, b, kernel, pad, stride, dilation, group, out, layout=layout)
    np.testing.assert_allclose(out, naive_forward(x, w, b, kernel, pad, stride, dilation, group), rtol=1e-12,
                               atol=1e-12)
    cpu_conv.forward(x, w, None, kernel, pad, stride, dilation, group, out, layout=layout)
    np.testing.assert_allclose(out, naive_forward(x, w, 0 * b, kernel, pad, stride, dilation, group), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("layout", ["nchw", "hwn"])
@pytest.mark.parametrize("shape,m,kernel,pad,stride,dilation,group", GEOMETRIES)
def test_backward_matches_naive(layout, shape, m, kernel, pad, stride, dilation, group):
    x, w, b, dy = make_case(shape, m, kernel, pad, stride, dilation, group, seed=1)
    dw_ref, db_ref, dx_ref = naive_backward(x, w, dy, kernel, pad, stride, dilation, group)
    dw0, db0 = np.full(w.shape, 0.5), np.full(b.shape, -0.25)  # param diffs accumulate
    dw, db, dx = dw0.copy(), db0.copy(), np.full(x.shape, np.nan)
    cpu_conv.backward(x, w, dy, kernel, pad, stride, dilation, group, dweight=dw, dbias=db, dx=dx, layout=layout)
    np.testing.assert_allclose(dw, dw0 + dw_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, db0 + db_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-12, atol=1e-12)


def test_backward_skips_none_outputs():
    shape, m, kernel, pad, stride, dilation, group = GEOMETRIES[1]
    x, w, b, dy = make_case(shape, m, kernel, pad, stride, dilation, group)
    _, db_ref, dx_ref = naive_backward(x, w, dy, kernel, pad, stride, dilation, group)
    dx = np.zeros(x.shape)
    cpu_conv.backward(x, w, dy, kernel, pad, stride, dilation, group, dx=dx)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-12, atol=1e-12)
    db = np.zeros(b.shape)
    cpu_conv.backward(x, w, dy, kernel, pad, stride, dilation, group, dbias=db)
    np.testing.assert_allclose(db, db_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["nchw", "hwn"])
def test_float32_and_buffer_reuse_across_shapes(layout):
    """The reused scratch buffers must not leak values between calls of different sizes/dtypes."""
    for shape, m, kernel, pad, stride, dilation, group in (GEOMETRIES[3], GEOMETRIES[0], GEOMETRIES[3]):
        x, w, b, dy = make_case(shape, m, kernel, pad, stride, dilation, group, seed=2)
        x32, w32, b32, dy32 = (a.astype(np.float32) for a in (x, w, b, dy))
        out = np.empty(dy.shape, np.float32)
        cpu_conv.forward(x32, w32, b32, kernel, pad, stride, dilation, group, out, layout=layout)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, naive_forward(x, w, b, kernel, pad, stride, dilation, group), rtol=1e-4,
                                   atol=1e-4)
        dw, db, dx = np.zeros(w.shape, np.float32), np.zeros(b.shape, np.float32), np.empty(x.shape, np.float32)
        cpu_conv.backward(x32, w32, dy32, kernel, pad, stride, dilation, group, dweight=dw, dbias=db, dx=dx,
                          layout=layout)
        for got, want in zip((dw, db, dx), naive_backward(x, w, dy, kernel, pad, stride, dilation, group)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_layout_choice_and_scratch():
    assert cpu_conv.layout_for((8, 8)) == "hwn"
    assert cpu_conv.layout_for((24, 24)) == "nchw"
    a = cpu_conv.scratch("test", (3, 4), np.float64)
    assert a.shape == (3, 4) and a.dtype == np.float64 and a.flags.c_contiguous
    b = cpu_conv.scratch("test", (2, 2), np.float32)
    assert np.shares_memory(a, b)  # the same name reuses (and grows) one buffer
    c = cpu_conv.scratch("test", (100,), np.float64)
    assert c.shape == (100,)
