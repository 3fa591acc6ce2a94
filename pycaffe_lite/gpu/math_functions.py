"""GPU helpers shared by layers and solvers (Caffe's math_functions role).

Every function takes sizes, device pointers (ints) and ``dtype``; all queue work on the backend
stream without synchronizing or reading device data, so they are safe inside CUDA graph capture.
One-statement element-wise kernels are generated with :func:`backend.elementwise`; the per-channel
affine maps, multi-input sums and per-channel reductions live in ``math_functions.cu``. The latter
view a tensor as (outer, dim, inner) — for NCHW with channel statistics (N, C, H·W) — and use
128-bit accesses (:func:`vec_width`) when ``inner`` and the pointers allow.

Reductions run in two levels: a block per (channel, chunk) writes partial sums into
:func:`backend.workspace`, then one thread per channel adds the chunks and applies the result.
So ``channel_sum`` (when ``spatial > 1``), ``channel_dot`` and ``channel_moments`` invalidate
workspace pointers a caller obtained earlier: ask for the workspace after calling them.

Half storage (float16; uint16 for bfloat16): kernels compute in the math type (``Mtype``, float), the
partial sums live in float, and per-channel statistics (``channel_moments``' outputs, a
``channel_dot`` with ``math_out``, its ``shift``) are float buffers (:func:`backend.math_dtype`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import backend, blas
from .backend import math_dtype

KERNELS = Path(__file__).with_name("math_functions.cu")
REDUCE_THREADS = 256  # must match REDUCE_THREADS in block_sum.cuh
# Reduction grids aim for this many blocks per multiprocessor (about four waves of 8 resident
# 256-thread blocks: small enough blocks that the last wave's tail stays short), each at least
# 4 units per thread.
_BLOCKS_PER_SM = 32


def _ew(name: str, params: str, body: str, dtype) -> backend.Kernel:
    """An element-wise kernel; bodies load with ``to_m``, compute in ``Mtype`` and store with ``from_m``
    (scalars ``const Mtype``), so they are exact as before for float and double and run on half storage."""
    return backend.elementwise(name, params, body, dtype)


def vec_width(inner: int, dtype, *ptrs: int) -> int:
    """4 when ``inner`` is a multiple of 4 and every pointer is 4-element aligned, else 1."""
    align = 4 * np.dtype(dtype).itemsize
    return 4 if inner % 4 == 0 and all(int(p) % align == 0 for p in ptrs) else 1


# -- element-wise ---------------------------------------------------------------------------
def set(n: int, value: float, y: int, dtype) -> None:  # noqa: A001 - Caffe's name
    """``y[:] = value``."""
    if value == 0:
        backend.memset_zero(y, n * np.dtype(dtype).itemsize)
    else:
        _ew("set_kernel", "const Mtype v, Dtype* y", "y[i] = from_m(v)", dtype)(n, value, y)


def copy(n: int, x: int, y: int, dtype) -> None:
    """``y[:] = x``."""
    if x != y:
        backend.memcpy_dtod(y, x, n * np.dtype(dtype).itemsize)


def add_scalar(n: int, value: float, y: int, dtype) -> None:
    """``y += value``."""
    _ew("add_scalar_kernel", "const Mtype v, Dtype* y", "y[i] = from_m(to_m(y[i]) + v)", dtype)(n, value, y)


def _binary(name: str, op: str):
    def fn(n: int, a: int, b: int, y: int, dtype) -> None:
        _ew(f"{name}_kernel", "const Dtype* a, const Dtype* b, Dtype* y", f"y[i] = from_m(to_m(a[i]) {op} to_m(b[i]))", dtype)(n, a, b, y)

    fn.__name__ = name
    fn.__doc__ = f"``y = a {op} b`` element-wise."
    return fn


add = _binary("add", "+")
sub = _binary("sub", "-")
mul = _binary("mul", "*")
div = _binary("div", "/")


def scale(n: int, alpha: float, x: int, y: int, dtype) -> None:
    """``y = alpha·x``."""
    _ew("scale_kernel", "const Mtype alpha, const Dtype* x, Dtype* y", "y[i] = from_m(alpha * to_m(x[i]))",
        dtype)(n, alpha, x, y)


def axpby(n: int, alpha: float, x: int, beta: float, y: int, dtype) -> None:
    """``y = alpha·x + beta·y``."""
    _ew("axpby_kernel", "const Mtype alpha, const Dtype* x, const Mtype beta, Dtype* y",
        "y[i] = from_m(alpha * to_m(x[i]) + beta * to_m(y[i]))", dtype)(n, alpha, x, beta, y)


def powx(n: int, a: int, alpha: float, y: int, dtype) -> None:
    """``y = a ** alpha``."""
    _ew("powx_kernel", "const Dtype* a, const Mtype alpha, Dtype* y", "y[i] = from_m(pow(to_m(a[i]), alpha))",
        dtype)(n, a, alpha, y)


def _unary(name: str, expr: str):
    def fn(n: int, a: int, y: int, dtype) -> None:
        _ew(f"{name}_kernel", "const Dtype* a, Dtype* y", f"y[i] = from_m({expr})", dtype)(n, a, y)

    fn.__name__ = name
    fn.__doc__ = f"``y = {name}(a)`` element-wise."
    return fn


exp = _unary("exp", "exp(to_m(a[i]))")
log = _unary("log", "log(to_m(a[i]))")
abs = _unary("abs", "fabs(to_m(a[i]))")  # noqa: A001
sqrt = _unary("sqrt", "sqrt(to_m(a[i]))")
sign = _unary("sign", "(Mtype(0) < to_m(a[i])) - (to_m(a[i]) < Mtype(0))")


# -- per-channel maps and multi-input sums ---------------------------------------------------
def channel_affine(outer: int, dim: int, inner: int, x: int, s: int | None, b: int | None, y: int, dtype,
                   relu: bool = False) -> None:
    """``y[o, c, i] = x[o, c, i]·s[c] + b[c]`` (``s``/``b`` None: omitted), then ReLU (negative_slope
    0) when ``relu`` (compiled for ``b`` alone: the convolution engines' bias epilogue); ``x`` and
    ``y`` may alias."""
    if relu and (s is not None or b is None):
        raise ValueError("channel_affine: relu is compiled for a bias alone (s None, b given)")
    if s is None and b is None:
        copy(outer * dim * inner, x, y, dtype)
        return
    w = vec_width(inner, dtype, x, y)
    name = "affine_sb" if s is not None and b is not None else "affine_s" if s is not None else "affine_b"
    backend.kernel(KERNELS, f"{name}{'_relu' if relu else ''}_v{w}", dtype)(
        outer * dim * inner // w, dim, inner, x, s if s is not None else x, b if b is not None else x, y)


def add_bias(rows: int, cols: int, bias: int, y: int, dtype) -> None:
    """``y(rows, cols) += bias[None, :]``."""
    channel_affine(rows, cols, 1, y, None, bias, y, dtype)


def add_channel_bias(num: int, channels: int, spatial: int, bias: int, y: int, dtype, relu: bool = False) -> None:
    """``y(num, channels, spatial) += bias[None, :, None]``, then ReLU (negative_slope 0) when ``relu``."""
    channel_affine(num, channels, spatial, y, None, bias, y, dtype, relu)


def weighted_sum(n: int, xs: list[int], coeffs: list[float], y: int, dtype) -> None:
    """``y = Σ_j coeffs[j]·xs[j]`` in one pass per four inputs (later passes add onto ``y``);
    ``y`` may alias one of the first four inputs."""
    w = vec_width(n, dtype, y, *xs)
    k = backend.kernel(KERNELS, f"weighted_sum_v{w}", dtype)
    xs, coeffs = list(xs), [float(c) for c in coeffs]
    while xs:
        group, xs = xs[:4], xs[4:]
        cs, coeffs = coeffs[:4], coeffs[4:]
        k(n // w, len(group), *(group + [group[0]] * (4 - len(group))), *(cs + [0.0] * (4 - len(cs))), y)
        if xs:  # the partial sum so far becomes the first input of the next group
            xs.insert(0, y)
            coeffs.insert(0, 1.0)


def copy_rows(rows: int, cols: int, src: int, src_stride: int, dst: int, dst_stride: int, dtype) -> None:
    """``dst[r·dst_stride + c] = src[r·src_stride + c]`` for ``r < rows``, ``c < cols`` (elements):
    a block of rows between two row-major matrices (Concat, Slice)."""
    w = vec_width(cols, dtype, src, dst) if src_stride % 4 == 0 and dst_stride % 4 == 0 else 1
    backend.kernel(KERNELS, f"copy_rows_v{w}", dtype)(rows * cols // w, cols // w, src, src_stride // w,
                                                      dst, dst_stride // w)


# -- per-channel reductions ------------------------------------------------------------------
def reduce_partials(outer: int, dim: int, inner: int, w: int, dtype) -> tuple[int, int]:
    """(chunks, part) for a per-channel reduction of an (outer, dim, inner) view read ``w`` elements
    at a time: blocks of REDUCE_THREADS per (channel, chunk), about _BLOCKS_PER_SM per SM in all,
    and the workspace (the ``reduce`` slot) for their two partial sums each (in the math type)."""
    units = outer * inner // w
    target = -(-_BLOCKS_PER_SM * backend.multiprocessor_count() // dim)
    chunks = max(1, min(target, -(-units // (4 * REDUCE_THREADS))))
    (part,) = backend.workspace(2 * dim * chunks * math_dtype(np.dtype(dtype)).itemsize, slot="reduce")
    return chunks, part


def _reduce(op: str, outer: int, dim: int, inner: int, a: int, dtype, b: int | None = None,
            shift: int | None = None, q: int | None = None, y: int | None = None) -> tuple[int, int]:
    """First level: partial sums into the workspace; returns (pointer, chunks per channel)."""
    w = vec_width(inner, dtype, *(p for p in (a, b, y) if p is not None))
    chunks, part = reduce_partials(outer, dim, inner, w, dtype)
    backend.kernel(KERNELS, f"reduce_{op}_v{w}", dtype)(
        chunks, outer, dim, inner, a, b or a, shift or a, q or a, y or part, part,
        grid=(chunks * dim, 1, 1), block=REDUCE_THREADS)
    return part, chunks


def _finish(dim: int, part: int, chunks: int, alpha: float, out0: int | None, beta0: float,
            out1: int | None, beta1: float, dtype, math_out: bool = False) -> None:
    which = (out0 is not None) | 2 * (out1 is not None)
    backend.kernel(KERNELS, "reduce_finish_m" if math_out else "reduce_finish", dtype)(
        dim, chunks, part, alpha, which, out0 or part, beta0, out1 or part, beta1)


def channel_sum(num: int, channels: int, spatial: int, x: int, out: int, dtype, beta: float = 1.0) -> None:
    """``out[c] = beta·out[c] + Σ_{n,s} x[n, c, s]``."""
    if channels == 0:
        return
    if spatial == 1 or num * spatial == 0:  # rows of a matrix: a GEMV reads them coalesced
        sum_rows_into(num * spatial, channels, x, out, dtype, beta)
        return
    part, chunks = _reduce("sum", num, channels, spatial, x, dtype)
    _finish(channels, part, chunks, 1.0, out, beta, None, 0.0, dtype)


def channel_dot(outer: int, dim: int, inner: int, a: int, b: int, dtype, sum_a: int | None = None,
                dot: int | None = None, alpha: float = 1.0, beta_sum: float = 0.0, beta_dot: float = 0.0,
                shift: int | None = None, q: int | None = None, y: int | None = None,
                math_out: bool = False) -> None:
    """One pass over ``a`` and ``b`` (outer, dim, inner): ``sum_a[c] = alpha·Σ a + beta_sum·sum_a[c]``
    and ``dot[c] = alpha·Σ a·(b - shift[c]) + beta_dot·dot[c]`` (each output optional; ``shift``
    None: 0; ``shift`` is in the math type). With ``q`` and ``y`` the same pass also writes
    ``y = a·q[c]`` (``y`` may alias ``a``). ``math_out``: ``sum_a`` and ``dot`` are math-type
    buffers (statistics; float for the half types), else ``dtype`` (param gradients).
    """
    if (q is None) != (y is None) or (q is not None and shift is not None):
        raise ValueError("channel_dot: give q and y together, and not with shift")
    if dim == 0:
        return
    if outer * inner == 0:
        for out, beta in ((sum_a, beta_sum), (dot, beta_dot)):
            if out is not None:
                scale(dim, beta, out, out, math_dtype(np.dtype(dtype)) if math_out else dtype)
        return
    op = "dot_dx" if q is not None else "dot_shift" if shift is not None else "dot"
    part, chunks = _reduce(op, outer, dim, inner, a, dtype, b=b, shift=shift, q=q, y=y)
    _finish(dim, part, chunks, alpha, sum_a, beta_sum, dot, beta_dot, dtype, math_out)


def relu_backward_channel_sum(outer: int, dim: int, inner: int, dy: int, y: int, dx: int, out: int, dtype,
                              beta: float = 1.0) -> None:
    """One pass over (outer, dim, inner): ReLU's backward (negative_slope 0) ``dx = dy·[y > 0]``
    (``y`` its output; ``dx`` may alias ``dy``) and ``out[c] = beta·out[c] + Σ dx`` (a convolution's
    bias gradient from the ReLU after it)."""
    if dim == 0:
        return
    if outer * inner == 0:
        scale(dim, beta, out, out, dtype)
        return
    part, chunks = _reduce("relu_sum", outer, dim, inner, dy, dtype, b=y, y=dx)
    _finish(dim, part, chunks, 1.0, out, beta, None, 0.0, dtype)


def channel_moments(outer: int, dim: int, inner: int, x: int, mean: int, var: int, dtype) -> None:
    """Per-channel mean and biased variance of ``x`` (outer, dim, inner) in one pass over ``x``;
    ``mean`` and ``var`` are math-type buffers (float for the half types)."""
    if dim == 0:
        return
    if outer * inner == 0:
        backend.memset_zero(mean, dim * math_dtype(np.dtype(dtype)).itemsize)
        backend.memset_zero(var, dim * math_dtype(np.dtype(dtype)).itemsize)
        return
    part, chunks = _reduce("moments", outer, dim, inner, x, dtype)
    backend.kernel(KERNELS, "moments_finish", dtype)(dim, chunks, outer * inner, inner, x, part, mean, var)


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


def plane_scatter(planes: int, S: int, T: int, x: int, idx: int, y: int, dtype) -> None:
    """Max-unpooling: ``y[p, idx[p, s]] = x[p, s]`` for each of ``planes`` planes (``x``, ``idx``:
    S elements each; ``y``: T, zeroed here); indices outside [0, T) are skipped, and where several
    name one cell the last wins (as a CPU loop leaves it)."""
    backend.memset_zero(y, planes * T * np.dtype(dtype).itemsize)
    (winner,) = backend.workspace(planes * T * 4, slot="reduce")
    backend.memset_zero(winner, planes * T * 4)
    n = planes * S
    backend.kernel(KERNELS, "plane_scatter_claim", dtype)(n, S, T, idx, winner)
    backend.kernel(KERNELS, "plane_scatter", dtype)(n, S, T, x, idx, winner, y)


def plane_gather(planes: int, S: int, T: int, y: int, idx: int, x: int, dtype) -> None:
    """The gradient of :func:`plane_scatter`'s gather: ``x[p, s] = y[p, idx[p, s]]`` (0 outside [0, T))."""
    backend.kernel(KERNELS, "plane_gather", dtype)(planes * S, S, T, y, idx, x)


def ones_vector(n: int, dtype) -> int:
    """A cached device vector of at least ``n`` ones (per device and dtype)."""
    dtype = np.dtype(dtype)
    ones = backend.device_cache("ones")  # dtype -> (length, allocation)
    have = ones.get(dtype.str)
    if have is None or have[0] < n:
        size = max(n, 1024)
        alloc = backend.alloc(size * dtype.itemsize)
        set(size, 1.0, int(alloc), dtype)
        ones[dtype.str] = have = (size, alloc)
    return int(have[1])
