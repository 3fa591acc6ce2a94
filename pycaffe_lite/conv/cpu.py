"""CPU 2-D convolution over a whole minibatch (im2col + BLAS GEMMs), in one of two layouts.

* ``"hwn"`` (small output planes, deep layers): the batch is copied channel-major with the image
  index innermost, ``(C, Hp, Wp, N)``; the columns ``(C, kh, kw, Ho, Wo, N)`` reshape to
  ``(C*kh*kw, N*Ho*Wo)``, so each group is ONE large GEMM over the whole batch, and the column
  copy and the col2im slice additions move runs of ``Wo*N`` contiguous elements. Costs two small
  transposes (input/top diff in, top/bottom diff out).
* ``"nchw"`` (large output planes, first layers): Caffe's per-image columns
  ``(N, C, kh, kw, Ho, Wo)`` and one batched ``np.matmul`` over the images; no transposes, and the
  per-image GEMMs are large enough to be efficient.

:func:`layout_for` picks one from the output plane size. Columns are built with one copy of an
``as_strided`` view of the zero-padded batch into a reused buffer (:func:`scratch`); col2im is
``kh*kw`` slice additions into a zeroed padded buffer. Only the summation order inside BLAS
differs from a naive evaluation.

The images are done in chunks: as many per chunk as keep the scratch of a call (:func:`scratch_bytes`)
under :data:`WORKSPACE_BYTES`, and never fewer than one (BVLC's own buffer: one image's columns), so a
large batch never needs the whole batch's columns at once. A window that overhangs the padded input
(BVLC's truncating output size, :func:`pycaffe_lite.conv.geometry.conv_out_size`) reads zeros: the
padded copy is extended on the high side by the overhang.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Literal

import numpy as np
from numpy.lib.stride_tricks import as_strided

from pycaffe_lite.conv.geometry import Pair, out_shape, overhang

Layout = Literal["nchw", "hwn"]
HWN_MAX_PLANE = 256  # output planes of at most this many pixels use the "hwn" layout
WORKSPACE_BYTES = 256 << 20  # host scratch a call may use before it splits the batch into chunks

_workspace = threading.local()


def scratch(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized C-contiguous array kept for reuse under ``name`` (per thread, grown on demand).

    Re-allocating the large column buffers every call costs page faults; the arrays returned for a
    name share memory, so a caller must be done with one before asking for the same name again.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    store = getattr(_workspace, "buffers", None)
    if store is None:
        store = _workspace.buffers = {}
    buf = store.get(name)
    if buf is None or buf.nbytes < nbytes:
        buf = store[name] = np.empty(max(nbytes, 1), dtype=np.uint8)
    return buf[:nbytes].view(dtype).reshape(shape)


def layout_for(out_hw: Pair) -> Layout:
    """The faster layout for an output plane of ``out_hw`` pixels (see the module doc)."""
    return "hwn" if out_hw[0] * out_hw[1] <= HWN_MAX_PLANE else "nchw"


def padded(x: np.ndarray, pad: Pair, layout: Layout, name: str, extra: Pair = (0, 0)) -> np.ndarray:
    """The batch x (N, C, H, W) zero-padded by ``pad`` on both sides of each spatial axis (and by
    ``extra`` more on the high side: :func:`pycaffe_lite.conv.geometry.overhang`), as
    ``(N, C, Hp, Wp)`` ("nchw"; x itself when there is no padding) or ``(C, Hp, Wp, N)`` ("hwn",
    a copy in :func:`scratch` ``name``)."""
    n, c, h, w = x.shape
    ph, pw = pad
    hp, wp = h + 2 * ph + extra[0], w + 2 * pw + extra[1]
    padding = bool(ph or pw or extra[0] or extra[1])
    if layout == "nchw":
        if not padding:
            return x
        xp = scratch(name, (n, c, hp, wp), x.dtype)
        inner, src = xp[:, :, ph:ph + h, pw:pw + w], x
    else:
        xp = scratch(name, (c, hp, wp, n), x.dtype)
        inner, src = xp[:, ph:ph + h, pw:pw + w, :], x.transpose(1, 2, 3, 0)
    if padding:
        xp[...] = 0
    inner[...] = src
    return xp


def columns(xp: np.ndarray, layout: Layout, kernel: Pair, stride: Pair, dilation: Pair, out_hw: Pair,
            name: str = "cols") -> np.ndarray:
    """Columns of the padded batch ``xp`` (from :func:`padded`) copied into :func:`scratch` ``name``:
    ``(N, C*kh*kw, Ho*Wo)`` ("nchw") or ``(C*kh*kw, Ho*Wo*N)`` ("hwn"). Column row ``(c, i, j)``
    holds the input pixel that kernel offset ``(i, j)`` of channel ``c`` reads for each output."""
    kh, kw = kernel
    if layout == "nchw":
        n, c = xp.shape[:2]
        sn, sc, sh, sw = xp.strides
        shape = (n, c, kh, kw, *out_hw)
        strides = (sn, sc, dilation[0] * sh, dilation[1] * sw, stride[0] * sh, stride[1] * sw)
        flat: tuple[int, ...] = (n, c * kh * kw, out_hw[0] * out_hw[1])
    else:
        c, n = xp.shape[0], xp.shape[3]
        sc, sh, sw, sn = xp.strides
        shape = (c, kh, kw, *out_hw, n)
        strides = (sc, dilation[0] * sh, dilation[1] * sw, stride[0] * sh, stride[1] * sw, sn)
        flat = (c * kh * kw, out_hw[0] * out_hw[1] * n)
    out = scratch(name, shape, xp.dtype)
    np.copyto(out, as_strided(xp, shape, strides, writeable=False))
    return out.reshape(flat)


def col2im(dcol: np.ndarray, layout: Layout, n: int, c: int, image_hw: Pair, kernel: Pair, pad: Pair,
           stride: Pair, dilation: Pair, out_hw: Pair) -> np.ndarray:
    """Adjoint of :func:`columns` and :func:`padded`: sum the column gradients (in the layout's
    column shape) back into the image gradient, returned as an (N, C, H, W) view."""
    h, w = image_hw
    extra = _extra(image_hw, kernel, pad, stride, dilation)
    hp, wp = h + 2 * pad[0] + extra[0], w + 2 * pad[1] + extra[1]
    ho, wo = out_hw
    kh, kw = kernel
    if layout == "nchw":
        cols = dcol.reshape(n, c, kh, kw, ho, wo)
        planes = np.zeros((n, c, hp, wp), dtype=dcol.dtype)
    else:
        # (C, kh, kw, Ho, Wo, N) and (C, Hp, Wp, N), viewed with the image axis first
        cols = dcol.reshape(c, kh, kw, ho, wo, n).transpose(5, 0, 1, 2, 3, 4)
        planes = np.zeros((c, hp, wp, n), dtype=dcol.dtype).transpose(3, 0, 1, 2)
    for i in range(kh):
        h0 = i * dilation[0]
        rows = slice(h0, h0 + stride[0] * (ho - 1) + 1, stride[0])
        for j in range(kw):
            w0 = j * dilation[1]
            planes[:, :, rows, w0:w0 + stride[1] * (wo - 1) + 1:stride[1]] += cols[:, :, i, j]  # no pixel twice
    return planes[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + w]


def _extra(image_hw: Pair, kernel: Pair, pad: Pair, stride: Pair, dilation: Pair) -> Pair:
    """The high-side overhang per axis (:func:`pycaffe_lite.conv.geometry.overhang`)."""
    return (overhang(image_hw[0], kernel[0], pad[0], stride[0], dilation[0]),
            overhang(image_hw[1], kernel[1], pad[1], stride[1], dilation[1]))


PASSES = ("forward", "weight", "data")  # the top, the weight (and bias) gradient, the bottom gradient


def _parts(passes: set[str], channels: int, image_hw: Pair, num_output: int, group: int, kernel: Pair, pad: Pair,
           stride: Pair, dilation: Pair, layout: Layout | None) -> tuple[dict[str, int], dict[str, int]]:
    """(per image, fixed) element counts of what :func:`forward` / :func:`backward` allocate for
    ``passes``, by name: ``scratch:<name>`` for the :func:`scratch` buffers (kept per thread for
    reuse, so shared by every convolution), ``temporary`` for what is freed after the call."""
    h, w = image_hw
    out_hw = out_shape(h, w, kernel, pad, stride, dilation)
    layout = layout or layout_for(out_hw)
    extra = _extra(image_hw, kernel, pad, stride, dilation)
    plane = channels * (h + 2 * pad[0] + extra[0]) * (w + 2 * pad[1] + extra[1])
    p = out_hw[0] * out_hw[1]
    weights = num_output * (channels // group) * kernel[0] * kernel[1]
    copies_x = layout == "hwn" or any(pad) or any(extra)
    hwn = layout == "hwn"
    per = {"scratch:x": plane if copies_x and passes & {"forward", "weight"} else 0,
           "scratch:cols": channels * kernel[0] * kernel[1] * p if passes else 0,
           "scratch:y": num_output * p if hwn and "forward" in passes else 0,
           "scratch:dy": num_output * p if hwn and passes & {"weight", "data"} else 0,
           "scratch:dwt": weights if not hwn and "weight" in passes else 0,
           "temporary": plane if "data" in passes else 0}  # col2im's planes
    fixed = {"scratch:dwt": weights if hwn and "weight" in passes else 0,
             "temporary": weights if "weight" in passes else 0}  # the summed weight gradient
    return per, fixed


def scratch_bytes(passes: Iterable[str], channels: int, image_hw: Pair, num_output: int, group: int, kernel: Pair,
                  pad: Pair, stride: Pair, dilation: Pair, itemsize: int, layout: Layout | None = None,
                  ) -> tuple[int, int]:
    """(fixed, per image) bytes of host memory that :func:`forward` ("forward") and :func:`backward`
    ("weight", "data") allocate for ``passes`` on one chunk of images: the named :func:`scratch`
    buffers (each the largest the passes ask for; they stay allocated for reuse) and col2im's planes."""
    per, fixed = _parts(set(passes), channels, image_hw, num_output, group, kernel, pad, stride, dilation, layout)
    return sum(fixed.values()) * itemsize, sum(per.values()) * itemsize


def images_per_chunk(num: int, fixed: int, per_image: int, budget: int | None = None) -> int:
    """How many of ``num`` images one chunk takes so that ``fixed + chunk*per_image`` bytes stay
    within ``budget`` (default :data:`WORKSPACE_BYTES`); at least 1 (one image's buffers are needed).
    The chunks are as even as their count allows (the last is never a small remainder)."""
    budget = WORKSPACE_BYTES if budget is None else budget
    if per_image <= 0 or num <= 0:
        return max(num, 1)
    most = max(1, min(num, (budget - fixed) // per_image))
    return -(-num // -(-num // most))  # as many chunks as needed, of even sizes (64 by 61: 32 + 32)


def chunk_buffers(num: int, passes: Iterable[str], channels: int, image_hw: Pair, num_output: int, group: int,
                  kernel: Pair, pad: Pair, stride: Pair, dilation: Pair, itemsize: int) -> dict[str, int]:
    """Bytes by buffer name (see :func:`_parts`) that :func:`forward`/:func:`backward` allocate for
    ``passes`` on a batch of ``num`` images: one chunk's worth (:func:`images_per_chunk`)."""
    per, fixed = _parts(set(passes), channels, image_hw, num_output, group, kernel, pad, stride, dilation, None)
    step = images_per_chunk(num, sum(fixed.values()) * itemsize, sum(per.values()) * itemsize)
    return {name: (fixed.get(name, 0) + step * per.get(name, 0)) * itemsize for name in {*per, *fixed}}


def chunk_bytes(num: int, passes: Iterable[str], channels: int, image_hw: Pair, num_output: int, group: int,
                kernel: Pair, pad: Pair, stride: Pair, dilation: Pair, itemsize: int) -> int:
    """The total of :func:`chunk_buffers`: what one convolution's CPU passes allocate."""
    return sum(chunk_buffers(num, passes, channels, image_hw, num_output, group, kernel, pad, stride, dilation,
                             itemsize).values())


def held_bytes(workspaces: Iterable[dict[str, int]]) -> int:
    """Host memory the CPU convolutions of a net hold at most, from each one's :func:`chunk_buffers`
    (or cpu_nd's): the ``scratch:`` buffers are shared by name and grow to the largest any of them
    asks for, so those maxima add up; the temporaries of one call at a time come on top."""
    shared: dict[str, int] = {}
    temporary = 0
    for parts in workspaces:
        for name, n in parts.items():
            if name.startswith("scratch:"):
                shared[name] = max(shared.get(name, 0), n)
            else:
                temporary = max(temporary, n)
    return sum(shared.values()) + temporary


def forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, kernel: Pair, pad: Pair, stride: Pair,
            dilation: Pair, group: int, out: np.ndarray, layout: Layout | None = None) -> None:
    """Convolve x (N, C, H, W) with weight (M, C/G, kh, kw) (+ bias (M,)) into ``out`` (N, M, Ho, Wo).

    ``layout`` defaults to :func:`layout_for` the output plane (tests force each one). The images
    are done in chunks (:func:`images_per_chunk`)."""
    n, c, h, w = x.shape
    fixed, per = scratch_bytes(("forward",), c, (h, w), weight.shape[0], group, kernel, pad, stride, dilation,
                               x.itemsize, layout)
    step = images_per_chunk(n, fixed, per)
    for s in range(0, n, step):
        _forward(x[s:s + step], weight, bias, kernel, pad, stride, dilation, group, out[s:s + step], layout)


def _forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, kernel: Pair, pad: Pair, stride: Pair,
             dilation: Pair, group: int, out: np.ndarray, layout: Layout | None) -> None:
    n, c, h, w = x.shape
    m = weight.shape[0]
    mg = m // group
    out_hw = out_shape(h, w, kernel, pad, stride, dilation)
    layout = layout or layout_for(out_hw)
    extra = _extra((h, w), kernel, pad, stride, dilation)
    cols = columns(padded(x, pad, layout, "x", extra), layout, kernel, stride, dilation, out_hw)
    wg = weight.reshape(group, mg, -1)
    if layout == "nchw":
        p = out_hw[0] * out_hw[1]
        np.matmul(wg, cols.reshape(n, group, -1, p), out=out.reshape(n, group, mg, p))
        if bias is not None:
            out += bias[:, None, None]
        return
    p = cols.shape[1]
    y = scratch("y", (group, mg, p), x.dtype)
    np.matmul(wg, cols.reshape(group, -1, p), out=y)
    y = y.reshape(m, *out_hw, n).transpose(3, 0, 1, 2)
    if bias is None:
        out[...] = y
    else:
        np.add(y, bias[:, None, None], out=out)


def backward(x: np.ndarray | None, weight: np.ndarray, dy: np.ndarray, kernel: Pair, pad: Pair, stride: Pair,
             dilation: Pair, group: int, dweight: np.ndarray | None = None, dbias: np.ndarray | None = None,
             dx: np.ndarray | None = None, layout: Layout | None = None) -> None:
    """Gradients of :func:`forward` for the top diff dy (N, M, Ho, Wo).

    Accumulates (+=) into ``dweight`` (M, C/G, kh, kw) and ``dbias`` (M,) and assigns ``dx``
    (N, C, H, W); each is skipped when None. ``x`` (N, C, H, W) is read only for ``dweight`` (it may
    be None without it). ``layout`` as in :func:`forward`; the images are done in chunks
    (:func:`images_per_chunk`).
    """
    image = dx if x is None else x
    assert image is not None, "backward needs x or dx (the image shape)"
    n, c, h, w = image.shape
    passes = (["weight"] if dweight is not None else []) + (["data"] if dx is not None else [])
    fixed, per = scratch_bytes(passes, c, (h, w), weight.shape[0], group, kernel, pad, stride, dilation,
                               image.itemsize, layout)
    step = images_per_chunk(n, fixed, per)
    for s in range(0, n, step):
        part = slice(s, s + step)
        _backward(None if x is None else x[part], weight, dy[part], kernel, pad, stride, dilation, group, dweight,
                  dbias, None if dx is None else dx[part], layout, image.shape[1:])


def _backward(x: np.ndarray | None, weight: np.ndarray, dy: np.ndarray, kernel: Pair, pad: Pair, stride: Pair,
              dilation: Pair, group: int, dweight: np.ndarray | None, dbias: np.ndarray | None,
              dx: np.ndarray | None, layout: Layout | None, image_chw: tuple[int, ...]) -> None:
    n = dy.shape[0]
    c, h, w = image_chw
    m = weight.shape[0]
    mg = m // group
    out_hw = out_shape(h, w, kernel, pad, stride, dilation)
    layout = layout or layout_for(out_hw)
    extra = _extra((h, w), kernel, pad, stride, dilation)
    wg = weight.reshape(group, mg, -1)
    kg = wg.shape[2]
    if layout == "nchw":
        p = out_hw[0] * out_hw[1]
        dyg: np.ndarray = dy.reshape(n, group, mg, p)
        if dbias is not None:
            dbias += dyg.sum(axis=3).sum(axis=0).reshape(m)
        if dweight is not None:
            assert x is not None, "dweight needs x"
            cols = columns(padded(x, pad, layout, "x", extra), layout, kernel, stride, dilation, out_hw)
            # per image: dW[g]ᵀ (Kg, Mg) = cols[n, g] (Kg, P) · dy[n, g]ᵀ (P, Mg); then sum the images
            dwt = scratch("dwt", (n, group, kg, mg), dy.dtype)
            np.matmul(cols.reshape(n, group, kg, p), dyg.transpose(0, 1, 3, 2), out=dwt)
            dweight += dwt.sum(axis=0).transpose(0, 2, 1).reshape(dweight.shape)
        if dx is not None:
            dcol = scratch("cols", (n, group, kg, p), dy.dtype)
            np.matmul(wg.transpose(0, 2, 1), dyg, out=dcol)
            dx[...] = col2im(dcol, layout, n, c, (h, w), kernel, pad, stride, dilation, out_hw)
        return
    dyt = padded(dy, (0, 0), layout, "dy")  # (M, Ho, Wo, N): the column order
    p = dyt.size // m
    dyg = dyt.reshape(group, mg, p)
    if dbias is not None:
        dbias += dyt.reshape(m, p).sum(axis=1)
    if dweight is not None:
        assert x is not None, "dweight needs x"
        cols = columns(padded(x, pad, layout, "x", extra), layout, kernel, stride, dilation, out_hw)
        # dW[g]ᵀ (Kg, Mg) = cols[g] (Kg, N*P) · dy[g]ᵀ (N*P, Mg): the faster GEMM orientation here
        dwt = scratch("dwt", (group, kg, mg), dy.dtype)
        np.matmul(cols.reshape(group, kg, p), dyg.transpose(0, 2, 1), out=dwt)
        dweight += dwt.transpose(0, 2, 1).reshape(dweight.shape)
    if dx is not None:
        dcol = scratch("cols", (group, kg, p), dy.dtype)
        np.matmul(wg.transpose(0, 2, 1), dyg, out=dcol)
        dx[...] = col2im(dcol, layout, n, c, (h, w), kernel, pad, stride, dilation, out_hw)
