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


STORAGE = [np.float32, np.float64, np.float16, np.uint16]  # (uint16: bfloat16 bit patterns)


def _bits_blob(size: int, dtype, seed: int) -> tuple[Blob, np.ndarray]:
    """A device blob of ``size`` random values (bfloat16: random bits) and its host copy."""
    rng = np.random.default_rng(seed)
    a = (rng.integers(0, 1 << 16, size, dtype=np.uint16) if np.dtype(dtype) == np.uint16
         else rng.standard_normal(size).astype(dtype))
    b = Blob((size,), dtype)
    b.mutable_cpu_data()[...] = a
    return b, a


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", STORAGE)
@pytest.mark.parametrize(("a_dim", "b_dim", "inner", "shift"),  # 16-, 8-, 4-byte vectors, element by element
                         [(3, 5, 7, 0), (3, 5, 8, 0), (4, 6, 4, 0), (5, 3, 2, 0), (3, 5, 8, 1), (64, 33, 49, 0),
                          (2, 70000, 3, 0), (1, 4, 4096, 0)])  # (b past the grid's z limit; rows longer than a block)
def test_gpu_swap_leading_axes(gpu_mode, dtype, a_dim, b_dim, inner, shift):
    """(a, b, inner) -> (b, a, inner) bit for bit, pointers `shift` elements off the pool's alignment."""
    from pycaffe_lite.conv import im2col as gpu

    n, isz = a_dim * b_dim * inner, np.dtype(dtype).itemsize
    src, a = _bits_blob(n + 1, dtype, 3)
    dst, d = _bits_blob(n + 1, dtype, 4)
    gpu.swap_leading_axes(src.gpu_data() + shift * isz, a_dim, b_dim, inner, dst.mutable_gpu_data() + shift * isz,
                          dtype)
    want = d.copy()
    want[shift:shift + n] = a[shift:shift + n].reshape(a_dim, b_dim, inner).transpose(1, 0, 2).reshape(-1)
    assert np.array_equal(dst.cpu_data().view(np.uint8), want.view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", STORAGE)
@pytest.mark.parametrize(("planes", "plane", "src_stride", "dst_stride", "shift_src", "shift_dst"), [
    (300, 49, 49, 56, 0, 0), (300, 49, 56, 49, 0, 0),    # the padded 7x7 half path: vector stores / loads only
    (30, 16, 24, 40, 0, 0), (30, 12, 14, 18, 0, 0), (30, 6, 6, 10, 0, 0),  # 16-, 8-, 4-byte both sides (half)
    (30, 7, 9, 11, 0, 0), (30, 16, 24, 40, 1, 0), (30, 16, 24, 40, 0, 3),  # element by element, misaligned
    (40, 12, 12, 12, 0, 0), (40, 12, 12, 12, 1, 1),      # one contiguous run
    (20, 196, 196, 200, 0, 0), (3, 3000, 3008, 3000, 0, 0),
    (17_000_000, 1, 1, 2, 0, 0),                          # planes past the grid's y limit (x 256 threads)
])
def test_gpu_copy_planes(gpu_mode, dtype, planes, plane, src_stride, dst_stride, shift_src, shift_dst):
    """dst[:, :plane] = src[:, :plane] bit for bit between buffers of different plane strides; dst's
    other values stay."""
    from pycaffe_lite.conv import im2col as gpu

    isz = np.dtype(dtype).itemsize
    src, a = _bits_blob(planes * src_stride + 4, dtype, 5)
    dst, d = _bits_blob(planes * dst_stride + 4, dtype, 6)
    gpu.copy_planes(src.gpu_data() + shift_src * isz, planes, plane, src_stride,
                    dst.mutable_gpu_data() + shift_dst * isz, dst_stride, dtype)
    want = d.copy()
    view = want[shift_dst:shift_dst + planes * dst_stride].reshape(planes, dst_stride)
    view[:, :plane] = a[shift_src:shift_src + planes * src_stride].reshape(planes, src_stride)[:, :plane]
    assert np.array_equal(dst.cpu_data().view(np.uint8), want.view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", STORAGE)
@pytest.mark.parametrize(("planes", "hw", "shift"), [(6, (14, 14), 0), (6, (7, 7), 0), (5, (3, 3), 0), (3, (5, 1), 0),
                                                     (6, (14, 14), 1), (512, (56, 56), 0)])
def test_gpu_subsample_planes_every_store(gpu_mode, dtype, planes, hw, shift):
    """x[:, ::2, ::2] bit for bit through each store width (16, 8, 4 bytes, one value) and a y off the
    pool's alignment (the scalar kernel)."""
    from pycaffe_lite.conv import im2col as gpu

    h, w = hw
    x, a = _bits_blob(planes * h * w, dtype, 7)
    want = np.ascontiguousarray(a.reshape(planes, h, w)[:, ::2, ::2]).reshape(-1)
    y, yv = _bits_blob(want.size + 1, dtype, 8)
    gpu.subsample_planes(x.gpu_data(), planes, hw, (2, 2), y.mutable_gpu_data() + shift * np.dtype(dtype).itemsize,
                         dtype)
    expected = yv.copy()
    expected[shift:shift + want.size] = want
    assert np.array_equal(y.cpu_data().view(np.uint8), expected.view(np.uint8))


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
