"""CPU N-D convolution (any number of spatial axes) over a whole minibatch: im2col_nd + GEMM.

Shapes: image batch ``(N, C, *S)`` with ``S`` the spatial sizes; weight ``(M, C/G, *K)``; top
``(N, M, *O)`` with ``O[i] = (S[i] + 2*pad[i] - (dilation[i]*(K[i]-1)+1)) // stride[i] + 1``. The
columns of an image are ``(C*prod(K), prod(O))``: row ``(c, k_0, ..., k_{d-1})`` holds, for each
output position ``o``, the input element at ``o[i]*stride[i] - pad[i] + k_i*dilation[i]`` on every
axis (zero outside the image), which is BVLC's ``im2col_nd`` order. The 2-D layer path keeps its own
tuned code (:mod:`pycaffe_lite.conv.cpu`); this module serves 1-D, 3-D and higher convolutions,
``force_nd_im2col`` and the Im2col layer.

As the 2-D code, the images are done in chunks under :data:`pycaffe_lite.conv.cpu.WORKSPACE_BYTES`
(:func:`scratch_bytes`), at least one image at a time, and a window that overhangs the padded input
(BVLC's truncating output size) reads zeros.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from pycaffe_lite.conv import cpu as cpu2d
from pycaffe_lite.conv.geometry import out_shape_nd, overhang

Dims = tuple[int, ...]


def _extra(spatial: Dims, kernel: Dims, pad: Dims, stride: Dims, dilation: Dims) -> Dims:
    return tuple(overhang(*a) for a in zip(spatial, kernel, pad, stride, dilation))


def _padded(x: np.ndarray, pad: Dims, extra: Dims) -> np.ndarray:
    if not any(pad) and not any(extra):
        return x
    return np.pad(x, [(0, 0), (0, 0)] + [(p, p + e) for p, e in zip(pad, extra)])


def scratch_bytes(passes: Iterable[str], channels: int, spatial: Dims, num_output: int, group: int, kernel: Dims,
                  pad: Dims, stride: Dims, dilation: Dims, itemsize: int) -> tuple[int, int]:
    """(fixed, per image) bytes that :func:`forward` ("forward") and :func:`backward` ("weight",
    "data") allocate at once for ``passes`` on a chunk of images: the padded copy, the columns,
    the GEMM result (top, the per-image weight products, or the column gradient) and col2im's
    planes. For Deconvolution (the transposed convolution) pass its top as ``spatial``/``channels``
    and its bottom channels as ``num_output``."""
    passes = set(passes)
    out = out_shape_nd(spatial, kernel, pad, stride, dilation)
    extra = _extra(spatial, kernel, pad, stride, dilation)
    plane = channels * math.prod(s + 2 * p + e for s, p, e in zip(spatial, pad, extra))
    cols = channels * math.prod(kernel) * math.prod(out)
    weights = num_output * (channels // group) * math.prod(kernel)
    padding = any(pad) or any(extra)
    need = []
    if "forward" in passes:
        need.append((plane if padding else 0) + cols + num_output * math.prod(out))
    if "weight" in passes:
        need.append((plane if padding else 0) + cols + weights)
    if "data" in passes:
        need.append(cols + plane)
    fixed = weights if "weight" in passes else 0
    return fixed * itemsize, max(need, default=0) * itemsize


def chunk_bytes(num: int, passes: Iterable[str], channels: int, spatial: Dims, num_output: int, group: int,
                kernel: Dims, pad: Dims, stride: Dims, dilation: Dims, itemsize: int) -> int:
    """Bytes :func:`forward`/:func:`backward` allocate at once for ``passes`` on ``num`` images
    (one chunk's worth): what a memory check counts."""
    fixed, per = scratch_bytes(passes, channels, spatial, num_output, group, kernel, pad, stride, dilation,
                               itemsize)
    return fixed + cpu2d.images_per_chunk(num, fixed, per) * per


def chunk_buffers(num: int, passes: Iterable[str], channels: int, spatial: Dims, num_output: int, group: int,
                  kernel: Dims, pad: Dims, stride: Dims, dilation: Dims, itemsize: int) -> dict[str, int]:
    """:func:`chunk_bytes` named as :func:`pycaffe_lite.conv.cpu.chunk_buffers` names its buffers:
    all of it temporary (nothing is kept between calls)."""
    return {"temporary": chunk_bytes(num, passes, channels, spatial, num_output, group, kernel, pad, stride,
                                     dilation, itemsize)}


def columns(x: np.ndarray, kernel: Dims, pad: Dims, stride: Dims, dilation: Dims) -> np.ndarray:
    """The columns ``(N, C*prod(K), prod(O))`` of the batch ``x`` (N, C, *S) (a new array)."""
    n, c = x.shape[:2]
    out = out_shape_nd(x.shape[2:], kernel, pad, stride, dilation)
    xp = _padded(x, pad, _extra(x.shape[2:], kernel, pad, stride, dilation))
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
    extra = _extra(tuple(spatial), kernel, pad, stride, dilation)
    planes = np.zeros((n, c, *(s + 2 * p + e for s, p, e in zip(spatial, pad, extra))), dtype=cols.dtype)
    for offset in itertools.product(*(range(k) for k in kernel)):
        where = tuple(slice(k * d, k * d + st * (o - 1) + 1, st) for k, d, st, o in zip(offset, dilation, stride, out))
        planes[(slice(None), slice(None)) + where] += grid[(slice(None), slice(None)) + offset]
    inner = tuple(slice(p, p + s) for p, s in zip(pad, spatial))
    return planes[(slice(None), slice(None)) + inner]


def forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, kernel: Dims, pad: Dims, stride: Dims,
            dilation: Dims, group: int, out: np.ndarray) -> None:
    """Convolve x (N, C, *S) with weight (M, C/G, *K) (+ bias (M,)) into ``out`` (N, M, *O), in
    chunks of images (:func:`scratch_bytes`)."""
    n, c = x.shape[:2]
    fixed, per = scratch_bytes(("forward",), c, x.shape[2:], weight.shape[0], group, kernel, pad, stride, dilation,
                               x.itemsize)
    step = cpu2d.images_per_chunk(n, fixed, per)
    for s in range(0, n, step):
        _forward(x[s:s + step], weight, bias, kernel, pad, stride, dilation, group, out[s:s + step])


def _forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, kernel: Dims, pad: Dims, stride: Dims,
             dilation: Dims, group: int, out: np.ndarray) -> None:
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
    for ``dweight``. In chunks of images (:func:`scratch_bytes`)."""
    image = dx if x is None else x
    assert image is not None, "backward needs x or dx (the image shape)"
    n, c = image.shape[:2]
    passes = (["weight"] if dweight is not None else []) + (["data"] if dx is not None else [])
    fixed, per = scratch_bytes(passes, c, image.shape[2:], weight.shape[0], group, kernel, pad, stride, dilation,
                               image.itemsize)
    step = cpu2d.images_per_chunk(n, fixed, per)
    for s in range(0, n, step):
        part = slice(s, s + step)
        _backward(None if x is None else x[part], weight, dy[part], kernel, pad, stride, dilation, group, dweight,
                  dbias, None if dx is None else dx[part])


def _backward(x: np.ndarray | None, weight: np.ndarray, dy: np.ndarray, kernel: Dims, pad: Dims, stride: Dims,
              dilation: Dims, group: int, dweight: np.ndarray | None, dbias: np.ndarray | None,
              dx: np.ndarray | None) -> None:
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
        del cols  # before the data pass's buffers (scratch_bytes counts one pass at a time)
    if dx is not None:
        dcol = np.matmul(wg.transpose(0, 2, 1), dyg)  # (N, G, Kg, P)
        dx[...] = col2im(dcol.reshape(n, -1, p), dx.shape, kernel, pad, stride, dilation)
