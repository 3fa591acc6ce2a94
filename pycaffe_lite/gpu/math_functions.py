"""Element-wise GPU helpers shared by layers and solvers (kernels in ``math_functions.cu``).

Every function takes ``n`` (element count), device pointers (ints) and ``dtype``; all run on the
backend stream without synchronizing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import backend, blas

KERNELS = Path(__file__).with_name("math_functions.cu")
REDUCE_THREADS = 256


def _k(name: str, dtype, argtypes: str) -> backend.Kernel:
    return backend.kernel(KERNELS, name, dtype, argtypes)


def set(n: int, value: float, y: int, dtype) -> None:  # noqa: A001 - Caffe's name
    """``y[:] = value``."""
    if value == 0:
        backend.memset_zero(y, n * np.dtype(dtype).itemsize)
    else:
        _k("set_kernel", dtype, "ifP")(n, n, value, y)


def copy(n: int, x: int, y: int, dtype) -> None:
    """``y[:] = x``."""
    if x != y:
        backend.memcpy_dtod(y, x, n * np.dtype(dtype).itemsize)


def add_scalar(n: int, value: float, y: int, dtype) -> None:
    _k("add_scalar_kernel", dtype, "ifP")(n, n, value, y)


def add(n: int, a: int, b: int, y: int, dtype) -> None:
    _k("add_kernel", dtype, "iPPP")(n, n, a, b, y)


def sub(n: int, a: int, b: int, y: int, dtype) -> None:
    _k("sub_kernel", dtype, "iPPP")(n, n, a, b, y)


def mul(n: int, a: int, b: int, y: int, dtype) -> None:
    _k("mul_kernel", dtype, "iPPP")(n, n, a, b, y)


def div(n: int, a: int, b: int, y: int, dtype) -> None:
    _k("div_kernel", dtype, "iPPP")(n, n, a, b, y)


def scale(n: int, alpha: float, x: int, y: int, dtype) -> None:
    """``y = alpha·x``."""
    _k("scale_kernel", dtype, "ifPP")(n, n, alpha, x, y)


def axpby(n: int, alpha: float, x: int, beta: float, y: int, dtype) -> None:
    """``y = alpha·x + beta·y``."""
    _k("axpby_kernel", dtype, "ifPfP")(n, n, alpha, x, beta, y)


def powx(n: int, a: int, alpha: float, y: int, dtype) -> None:
    _k("powx_kernel", dtype, "iPfP")(n, n, a, alpha, y)


def _unary(name: str):
    def fn(n: int, a: int, y: int, dtype) -> None:
        _k(f"{name}_kernel", dtype, "iPP")(n, n, a, y)

    fn.__name__ = name
    fn.__doc__ = f"``y = {name}(a)`` element-wise."
    return fn


exp = _unary("exp")
log = _unary("log")
abs = _unary("abs")  # noqa: A001
sqrt = _unary("sqrt")
sign = _unary("sign")


def add_bias(rows: int, cols: int, bias: int, y: int, dtype) -> None:
    """``y(rows, cols) += bias[None, :]``."""
    n = rows * cols
    _k("add_bias_kernel", dtype, "iiPP")(n, n, cols, bias, y)


def add_channel_bias(num: int, channels: int, spatial: int, bias: int, y: int, dtype) -> None:
    """``y(num, channels, spatial) += bias[None, :, None]``."""
    n = num * channels * spatial
    _k("add_channel_bias_kernel", dtype, "iiiPP")(n, n, channels, spatial, bias, y)


def channel_sum(num: int, channels: int, spatial: int, x: int, out: int, dtype, beta: float = 1.0) -> None:
    """``out[c] = beta·out[c] + Σ_{n,s} x[n, c, s]``."""
    if channels == 0:
        return
    itemsize = np.dtype(dtype).itemsize
    _k("channel_sum_kernel", dtype, "iiiPfP")(
        0, num, channels, spatial, x, beta, out,
        grid=(channels, 1, 1), block=REDUCE_THREADS, shared=REDUCE_THREADS * itemsize,
    )


def sum_rows_into(rows: int, cols: int, x: int, y: int, dtype, beta: float = 1.0) -> None:
    """``y(cols) = beta·y + Σ_rows x(rows, cols)`` (a GEMV with a ones vector)."""
    if rows == 0:
        if beta == 0:
            backend.memset_zero(y, cols * np.dtype(dtype).itemsize)
        else:
            scale(cols, beta, y, y, dtype)
        return
    ones = ones_vector(rows, dtype)
    blas.gemv(True, rows, cols, 1.0, x, ones, beta, y, dtype)


_ones: dict[tuple[int, str], tuple[int, object]] = {}


def ones_vector(n: int, dtype) -> int:
    """A cached device vector of at least ``n`` ones (per device and dtype)."""
    dtype = np.dtype(dtype)
    key = (backend.state().device_id, dtype.str)
    have = _ones.get(key)
    if have is None or have[0] < n:
        size = max(n, 1024)
        alloc = backend.alloc(size * dtype.itemsize)
        set(size, 1.0, int(alloc), dtype)
        _ones[key] = have = (size, alloc)
    return int(have[1])
