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
