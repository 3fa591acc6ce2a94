"""CPU N-D convolution (any number of spatial axes) over a whole minibatch: im2col_nd + GEMM.

Shapes: image batch ``(N, C, *S)`` with ``S`` the spatial sizes; weight ``(M, C/G, *K)``; top
``(N, M, *O)`` with ``O[i] = (S[i] + 2*pad[i] - (dilation[i]*(K[i]-1)+1)) // stride[i] + 1``. The
columns of an image are ``(C*prod(K), prod(O))``: row ``(c, k_0, ..., k_{d-1})`` holds, for each
output position ``o``, the input element at ``o[i]*stride[i] - pad[i] + k_i*dilation[i]`` on every
axis (zero outside the image), which is BVLC's ``im2col_nd`` order. The 2-D layer path keeps its own
tuned code (:mod:`pycaffe_lite.conv.cpu`); this module serves 1-D, 3-D and higher convolutions,
``force_nd_im2col`` and the Im2col layer.
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.lib.stride_tricks import as_strided

from pycaffe_lite.conv.geometry import out_shape_nd

Dims = tuple[int, ...]


def _padded(x: np.ndarray, pad: Dims) -> np.ndarray:
    if not any(pad):
        return x
    return np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])


def columns(x: np.ndarray, kernel: Dims, pad: Dims, stride: Dims, dilation: Dims) -> np.ndarray:
    """The columns ``(N, C*prod(K), prod(O))`` of the batch ``x`` (N, C, *S) (a new array)."""
    n, c = x.shape[:2]
    out = out_shape_nd(x.shape[2:], kernel, pad, stride, dilation)
    xp = _padded(x, pad)
    sp = xp.strides[2:]
    shape = (n, c, *kernel, *out)
    strides = (xp.strides[0], xp.strides[1], *(d * s for d, s in zip(dilation, sp)),
               *(st * s for st, s in zip(stride, sp)))
    cols = np.ascontiguousarray(as_strided(xp, shape, strides, writeable=False))
    return cols.reshape(n, c * int(np.prod(kernel, dtype=np.int64)), int(np.prod(out, dtype=np.int64)))


def col2im(cols: np.ndarray, image_shape: Dims, kernel: Dims, pad: Dims, stride: Dims,
           dilation: Dims) -> np.ndarray:
    """Adjoint of :func:`columns`: the (N, C, *S) array of the summed column entries that read each
    element."""
    n, c, *spatial = image_shape
    out = out_shape_nd(tuple(spatial), kernel, pad, stride, dilation)
    grid = cols.reshape(n, c, *kernel, *out)
    planes = np.zeros((n, c, *(s + 2 * p for s, p in zip(spatial, pad))), dtype=cols.dtype)
    for offset in itertools.product(*(range(k) for k in kernel)):
        where = tuple(slice(k * d, k * d + st * (o - 1) + 1, st) for k, d, st, o in zip(offset, dilation, stride, out))
        planes[(slice(None), slice(None)) + where] += grid[(slice(None), slice(None)) + offset]
    inner = tuple(slice(p, p + s) for p, s in zip(pad, spatial))
    return planes[(slice(None), slice(None)) + inner]


def forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, kernel: Dims, pad: Dims, stride: Dims,
            dilation: Dims, group: int, out: np.ndarray) -> None:
    """Convolve x (N, C, *S) with weight (M, C/G, *K) (+ bias (M,)) into ``out`` (N, M, *O)."""
    n = x.shape[0]
    m = weight.shape[0]
    cols = columns(x, kernel, pad, stride, dilation)
    p = cols.shape[2]
    y = np.matmul(weight.reshape(group, m // group, -1), cols.reshape(n, group, -1, p))  # (N, G, M/G, P)
    y = y.reshape(out.shape)
    if bias is not None:
        y += bias.reshape((m,) + (1,) * (out.ndim - 2))
    out[...] = y


def backward(x: np.ndarray | None, weight: np.ndarray, dy: np.ndarray, kernel: Dims, pad: Dims, stride: Dims,
             dilation: Dims, group: int, dweight: np.ndarray | None = None, dbias: np.ndarray | None = None,
             dx: np.ndarray | None = None) -> None:
    """Gradients of :func:`forward` for the top diff ``dy`` (N, M, *O): accumulate (+=) into
    ``dweight`` and ``dbias``, assign ``dx`` (N, C, *S); each skipped when None. ``x`` is read only
    for ``dweight``."""
    n, m = dy.shape[:2]
    mg = m // group
    p = int(np.prod(dy.shape[2:], dtype=np.int64))
    dyg = dy.reshape(n, group, mg, p)
    wg = weight.reshape(group, mg, -1)
    if dbias is not None:
        dbias += dyg.sum(axis=(0, 3)).reshape(m)
    if dweight is not None:
        assert x is not None, "dweight needs x"
        cols = columns(x, kernel, pad, stride, dilation).reshape(n, group, -1, p)
        dweight += np.matmul(dyg, cols.transpose(0, 1, 3, 2)).sum(axis=0).reshape(dweight.shape)
    if dx is not None:
        dcol = np.matmul(wg.transpose(0, 2, 1), dyg)  # (N, G, Kg, P)
        dx[...] = col2im(dcol.reshape(n, -1, p), dx.shape, kernel, pad, stride, dilation)
