"""The 2-D im2col / col2im CUDA kernels (``conv/im2col.cu``, the GEMM engine's) built for the host
(pycaffe_lite.testing.host_kernels) and called through ``conv/im2col.py``: their columns and image
gradients equal the CPU code's, including BVLC's truncating output size, where the last window
overhangs the padded input and reads zeros."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite.conv import cpu_nd
from pycaffe_lite.conv import im2col as gpu_im2col
from pycaffe_lite.gpu import backend
from pycaffe_lite.testing import host_kernels

pytestmark = pytest.mark.skipif(host_kernels.CXX is None, reason="no host C++ compiler")

CU = Path(gpu_im2col.__file__).with_name("im2col.cu")
GEOMETRIES = [  # (N, C, H, W), kernel, pad, stride, dilation
    ((2, 3, 6, 5), (3, 3), (1, 1), (1, 1), (1, 1)),
    ((2, 2, 7, 6), (3, 2), (1, 0), (2, 3), (2, 1)),
    ((3, 2, 1, 1), (2, 2), (0, 0), (2, 2), (1, 1)),   # (1 - 2) / 2 + 1 = 1: overhang
    ((2, 3, 2, 5), (3, 3), (0, 1), (2, 3), (1, 1)),   # rows (2 - 3) / 2 + 1 = 1: overhang
]


@pytest.fixture
def host_backend(monkeypatch):
    lib, sigs = host_kernels.serial_library(CU, np.float64)

    def kernel(path, name, dtype):
        assert Path(path) == CU and np.dtype(dtype) == np.float64
        fn = getattr(lib, name)

        def call(*args, **launch):
            fn(*host_kernels.kernel_args(sigs[name], args, np.float64))
        return call

    monkeypatch.setattr(backend, "kernel", kernel)


def ptr(a: np.ndarray) -> int:
    assert a.flags.c_contiguous and a.dtype == np.float64
    return a.ctypes.data


@pytest.mark.parametrize("shape,kernel,pad,stride,dilation", GEOMETRIES)
def test_im2col_and_col2im_kernels_match_the_cpu(host_backend, shape, kernel, pad, stride, dilation):
    rng = np.random.default_rng(0)
    n, c, h, w = shape
    x = rng.standard_normal(shape)
    want = cpu_nd.columns(x, kernel, pad, stride, dilation)  # (N, C*kh*kw, P)
    cols = np.full((want.shape[1], n, want.shape[2]), np.nan)
    gpu_im2col.im2col(ptr(x), n, c, (h, w), kernel, pad, stride, dilation, ptr(cols), np.float64)
    np.testing.assert_array_equal(cols, want.transpose(1, 0, 2))
    dcol = rng.standard_normal(cols.shape)
    dx = np.full(shape, np.nan)
    gpu_im2col.col2im(ptr(dcol), n, c, (h, w), kernel, pad, stride, dilation, ptr(dx), np.float64)
    ref = cpu_nd.col2im(np.ascontiguousarray(dcol.transpose(1, 0, 2)), shape, kernel, pad, stride, dilation)
    np.testing.assert_allclose(dx, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("planes", "hw", "stride"), [(3, (9, 8), (2, 2)), (3, (7, 7), (2, 2)), (2, (7, 10), (3, 2)),
                                                      (5, (5, 3), (2, 3)), (1, (1, 1), (2, 2))])
def test_upsample_planes_vector_stores_match_numpy(monkeypatch, dtype, planes, hw, stride):
    """upsample_planes's vector kernels (V elements a store, the pixel position kept by counters across
    rows and planes) put y at every stride-th pixel and zeros elsewhere, as the scalar kernel does;
    and copy_planes moves planes between buffers of different plane strides."""
    lib, sigs = host_kernels.serial_library(CU, dtype)
    used = []

    def kernel(path, name, dt):
        used.append(name)
        fn = getattr(lib, name)
        return lambda *args, **launch: fn(*host_kernels.kernel_args(sigs[name], args, dtype))

    monkeypatch.setattr(backend, "kernel", kernel)
    rng = np.random.default_rng(1)
    h, w = hw
    x = rng.standard_normal((planes, h, w)).astype(dtype)
    sub = np.ascontiguousarray(x[:, ::stride[0], ::stride[1]])
    for aligned in (True, False):  # a vector kernel, then (x misaligned for it) the scalar one
        out = np.full(x.size + 8, np.nan, dtype)
        start = 0 if aligned else 1
        view = out[start:start + x.size]
        gpu_im2col.upsample_planes(sub.ctypes.data, planes, hw, stride, view.ctypes.data, dtype)
        want = np.zeros_like(x)
        want[:, ::stride[0], ::stride[1]] = sub
        np.testing.assert_array_equal(view.reshape(x.shape), want)
    itemsize = np.dtype(dtype).itemsize
    vector = [n for n in used if n != "upsample_planes"]
    assert len(vector) == (1 if (x.size * itemsize) % 16 == 0 or (x.size * itemsize) % 8 == 0 and itemsize < 8 else 0)
    padded = np.full((planes, h * w + 3), np.nan, dtype)
    gpu_im2col.copy_planes(x.ctypes.data, planes, h * w, h * w, padded.ctypes.data, h * w + 3, dtype)
    np.testing.assert_array_equal(padded[:, :h * w], x.reshape(planes, -1))
    assert np.isnan(padded[:, h * w:]).all()
