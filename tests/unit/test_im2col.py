"""Convolution output sizes, and the GPU im2col / col2im of the gemm engine: against a naive gather,
and col2im as im2col's adjoint."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite.blob import Blob
from pycaffe_lite.conv.geometry import conv_out_size, deconv_out_shape, out_shape, overhang

# (shape, kernel, pad, stride, dilation)
GEOMETRIES = [
    ((2, 3, 5, 5), (3, 3), (0, 0), (1, 1), (1, 1)),
    ((2, 2, 7, 6), (3, 2), (1, 0), (2, 1), (1, 1)),
    ((1, 2, 9, 9), (3, 3), (2, 2), (1, 1), (2, 2)),
    ((3, 1, 8, 7), (2, 3), (1, 2), (3, 2), (2, 1)),
    ((2, 4, 4, 4), (1, 1), (0, 0), (1, 1), (1, 1)),
    ((1, 1, 4, 4), (4, 4), (0, 0), (1, 1), (1, 1)),
]


def naive_im2col(x, kernel, pad, stride, dilation):
    n, c, h, w = x.shape
    ho, wo = out_shape(h, w, kernel, pad, stride, dilation)
    col = np.zeros((n, c, kernel[0], kernel[1], ho, wo))
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            for y in range(ho):
                for z in range(wo):
                    iy = y * stride[0] - pad[0] + i * dilation[0]
                    iz = z * stride[1] - pad[1] + j * dilation[1]
                    if 0 <= iy < h and 0 <= iz < w:
                        col[:, :, i, j, y, z] = x[:, :, iy, iz]
    return col


def test_conv_out_size():
    assert conv_out_size(28, 5, 0, 1) == 24
    assert conv_out_size(7, 3, 1, 2) == 4
    assert conv_out_size(9, 3, 2, 1, dilation=2) == 9
    assert conv_out_size(4, 5, 0, 1) == 0
    assert conv_out_size(4, 3, 0, 1, dilation=3) == -2  # BVLC's (4 - 7) / 1 + 1: no output
    # C++ division truncates toward zero: a window overhanging by less than a stride still counts
    assert conv_out_size(1, 2, 0, 2) == 1 and overhang(1, 2, 0, 2) == 1
    assert conv_out_size(2, 3, 0, 2) == 1 and overhang(2, 3, 0, 2) == 1
    assert conv_out_size(1, 3, 0, 2) == 0  # (1 - 3) / 2 + 1 = 0
    assert conv_out_size(3, 2, 0, 2) == 1 and overhang(3, 2, 0, 2) == 0  # floor and truncation agree


def test_deconv_out_shape_inverts_out_shape():
    cases = [((5, 6), (4, 3), (1, 0), (2, 3), (1, 2)), ((3, 3), (3, 3), (1, 1), (1, 1), (1, 1))]
    for (h, w), kernel, pad, stride, dilation in cases:
        big = deconv_out_shape(h, w, kernel, pad, stride, dilation)
        assert out_shape(*big, kernel, pad, stride, dilation) == (h, w)
    assert deconv_out_shape(4, 5, (4, 4), (1, 1), (2, 2), (1, 1)) == (8, 10)  # FCN's 2x upsampling


# -- GPU ----------------------------------------------------------------------------------------
def _device_blob(array, dtype):
    b = Blob(array.shape, dtype)
    b.data[...] = array
    return b


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,kernel,pad,stride,dilation", GEOMETRIES)
def test_gpu_im2col_matches_naive_and_col2im_is_adjoint(gpu_mode, shape, kernel, pad, stride, dilation, dtype):
    from pycaffe_lite.conv import im2col as gpu

    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(dtype)
    n, c = shape[:2]
    ho, wo = out_shape(shape[2], shape[3], kernel, pad, stride, dilation)
    rows = c * kernel[0] * kernel[1]
    # the GPU column layout is (C*kh*kw, N, Ho*Wo)
    expected = naive_im2col(x, kernel, pad, stride, dilation).transpose(1, 2, 3, 0, 4, 5).reshape(rows, n, ho * wo)
    xb, colb = _device_blob(x, dtype), Blob((rows, n, ho * wo), dtype)
    gpu.im2col(xb.gpu_data(), n, c, shape[2:], kernel, pad, stride, dilation, colb.mutable_gpu_data(), dtype)
    np.testing.assert_array_equal(colb.data, expected)

    cols = rng.standard_normal((rows, n, ho * wo)).astype(dtype)
    colb.data[...] = cols
    imb = Blob(shape, dtype)
    imb.data[...] = np.nan  # col2im assigns every element
    gpu.col2im(colb.gpu_data(), n, c, shape[2:], kernel, pad, stride, dilation, imb.mutable_gpu_data(), dtype)
    assert np.all(np.isfinite(imb.data))
    # <im2col(x), cols> == <x, col2im(cols)>
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(np.vdot(x.astype(np.float64), imb.data), np.vdot(expected, cols), rtol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_swap_leading_axes(gpu_mode, dtype):
    from pycaffe_lite.conv import im2col as gpu

    a = np.random.default_rng(3).standard_normal((3, 5, 7)).astype(dtype)
    src, dst = _device_blob(a, dtype), Blob((5, 3, 7), dtype)
    gpu.swap_leading_axes(src.gpu_data(), 3, 5, 7, dst.mutable_gpu_data(), dtype)
    np.testing.assert_array_equal(dst.data, a.transpose(1, 0, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize(("hw", "stride"), [((9, 8), (2, 2)), ((7, 10), (3, 2)), ((14, 14), (2, 2)), ((7, 14), (2, 2)),
                                           ((5, 3), (2, 3)), ((28, 28), (2, 2))])  # (16-, 8-, 4-byte and scalar stores)
def test_gpu_subsample_and_its_adjoint(gpu_mode, dtype, hw, stride):
    """The strided 1x1 convolution's subsampled input is x[:, :, ::sh, ::sw]; the upsample puts the
    values back at the strided pixels and zeros everywhere else (its adjoint)."""
    from pycaffe_lite.conv import im2col as gpu

    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3) + hw).astype(dtype)
    want = x[:, :, ::stride[0], ::stride[1]]
    xb, sub = _device_blob(x, dtype), Blob(want.shape, dtype)
    gpu.subsample_planes(xb.gpu_data(), 6, hw, stride, sub.mutable_gpu_data(), dtype)
    np.testing.assert_array_equal(sub.data, want)
    back = Blob(x.shape, dtype)
    back.data[...] = 7  # every element is written
    gpu.upsample_planes(sub.gpu_data(), 6, hw, stride, back.mutable_gpu_data(), dtype)
    expected = np.zeros_like(x)
    expected[:, :, ::stride[0], ::stride[1]] = want
    np.testing.assert_array_equal(back.data, expected)
