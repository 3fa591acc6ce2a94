"""Converters of the layer types that landed with the fork and sequence branches: the depthwise
convolution types, Im2col, Axpy, BN (both layouts), BatchReindex, Filter, Reverse, Transpose,
LSTMUnit, CTPN's Lstm, Unpooling / UnPooling (and SegNet's two-bottom Upsample, in ops_fork).

Every one is exact (the same arithmetic up to summation order) or raises an error naming the layer,
its type and why ONNX cannot express that configuration.
"""

from __future__ import annotations

import math

import numpy as np

from .graph import LayerContext
from .ops_vision import convolution
from .registry import exports

INT64_MIN = -(2 ** 63)

# The forks' depthwise types are Convolution layers with group = input channels (the layer computed
# num_output and group when it was set up): Conv with that group.
exports("DepthwiseConvolution", "ConvolutionDepthwise")(convolution)


@exports("Im2col")
def im2col(ctx: LayerContext) -> list[str]:
    """A grouped Conv (group C) with one-hot kernels: output channel ``c·K + k`` copies input channel
    c at kernel offset k (``K`` = prod(kernel), offsets row-major), zeros outside the input."""
    L = ctx.layer
    shape = ctx.bottom_shapes[0]
    axes = len(L.kernel)
    if axes > 3:
        raise ctx.error(f"{axes} spatial axes: ONNX Runtime's Conv takes 1 to 3")
    c, k = int(L.channels), int(math.prod(L.kernel))
    w = np.broadcast_to(np.eye(k, dtype=np.float32), (c, k, k)).reshape(c * k, 1, *L.kernel)
    x = ctx.bottoms[0]
    image = (int(L.num), c, *L.in_shape)
    if tuple(shape) != image:  # leading axes before the channel axis folded into one batch axis
        x = ctx.reshape(x, image, shape)
    top = ctx.top_shapes[0]
    out = ctx.out(0) if tuple(top) == (image[0], c * k, *L.out_shape) else None
    y = ctx.op("Conv", [x, ctx.const("one_hot", w)], out, kernel_shape=list(L.kernel), strides=list(L.stride),
               dilations=list(L.dilation), pads=list(L.pad) * 2, group=c)
    if out is None:
        y = ctx.reshape(y, top, shape, ctx.out(0))
    return [y]


@exports("Axpy")
def axpy(ctx: LayerContext) -> list[str]:
    """``a * x + y`` with ``a`` (N, C) broadcast over x's spatial axes."""
    a, x, y = ctx.bottoms
    xshape = ctx.bottom_shapes[1]
    ashape = [*xshape[:2]] + [1] * (len(xshape) - 2)
    if tuple(ctx.bottom_shapes[0]) != tuple(ashape):
        a = ctx.reshape(a, ashape, ctx.bottom_shapes[0])
    return [ctx.op("Add", [ctx.op("Mul", [a, x]), y], ctx.out(0))]


@exports("BN")
def bn(ctx: LayerContext) -> list[str]:
    """The forks' BN. Fixed statistics (yjxiong/PSPNet in TEST or frozen) and SegNet's INFERENCE are a
    per-channel affine ``A·x + B`` from the blobs; batch statistics (yjxiong in TRAIN, SegNet's LEARN)
    are computed in the graph over (N, spatial), biased variance, then slope and shift applied
    (SegNet's optional mean and variance tops are those statistics)."""
    L = ctx.layer
    x = ctx.bottoms[0]
    shape = ctx.bottom_shapes[0]
    ndim = len(shape)
    cshape = [shape[1]] + [1] * (ndim - 2)
    slope = ctx.param(0).reshape(-1)
    shift = ctx.param(1).reshape(-1)
    if not L.batch_stats:
        if L.segnet:  # INFERENCE: y = scale x + shift
            a, b = slope, shift
        else:
            run_mean, run_var = ctx.param(2).reshape(-1), ctx.param(3).reshape(-1)
            a = slope / np.sqrt(run_var + L.eps)
            b = shift - run_mean * a
        y = ctx.op("Mul", [x, ctx.const("scale", a.reshape(cshape))])
        return [ctx.op("Add", [y, ctx.const("shift", b.reshape(cshape))], ctx.out(0))]
    axes = [0] + list(range(2, ndim))
    mean = ctx.reduce("ReduceMean", x, axes, True)
    xc = ctx.op("Sub", [x, mean])
    var = ctx.reduce("ReduceMean", ctx.op("Mul", [xc, xc]), axes, True)
    inv = ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [var, ctx.const("eps", float(L.eps))])])])
    y = ctx.op("Mul", [ctx.op("Mul", [xc, inv]), ctx.const("slope", slope.reshape(cshape))])
    outs = [ctx.op("Add", [y, ctx.const("bias", shift.reshape(cshape))], ctx.out(0))]
    stat_shape = ctx.ints("stat_shape", [1, shape[1], 1, 1])
    for i, stat in enumerate((mean, var)[:len(ctx.out_names) - 1]):
        outs.append(ctx.op("Reshape", [stat, stat_shape], ctx.out(i + 1)))
    return outs


@exports("BatchReindex")
def batch_reindex(ctx: LayerContext) -> list[str]:
    """``Gather`` on axis 0 with the float indices truncated to int64 (as the layer reads them)."""
    idx = ctx.op("Cast", [ctx.bottoms[1]], to=7)  # INT64
    return [ctx.op("Gather", [ctx.bottoms[0], idx], ctx.out(0), axis=0)]


@exports("Filter")
def filter_(ctx: LayerContext) -> list[str]:
    """``Compress`` on axis 0 with the selector's non-zero entries (the number of items kept is
    data-dependent: the tops' first axis is symbolic)."""
    sel = ctx.bottoms[-1]
    n = ctx.bottom_shapes[-1][0]
    if len(ctx.bottom_shapes[-1]) != 1:
        sel = ctx.op("Reshape", [sel, ctx.ints("sel_shape", [-1 if ctx.dynamic_batch else n])])
    cond = ctx.op("Cast", [sel], to=9)  # BOOL: non-zero (NaN included) is true
    return [ctx.op("Compress", [b, cond], ctx.out(i), axis=0) for i, b in enumerate(ctx.bottoms[:-1])]


@exports("Reverse")
def reverse(ctx: LayerContext) -> list[str]:
    """``Slice`` with step -1 over the whole axis."""
    axis = int(ctx.layer.axis)
    return [ctx.op("Slice", [ctx.bottoms[0], ctx.ints("starts", [-1]), ctx.ints("ends", [INT64_MIN]),
                             ctx.ints("axes", [axis]), ctx.ints("steps", [-1])], ctx.out(0))]


@exports("Transpose")
def transpose(ctx: LayerContext) -> list[str]:
    return [ctx.op("Transpose", [ctx.bottoms[0]], ctx.out(0), perm=[int(d) for d in ctx.layer.dims])]


def _sliced(ctx: LayerContext, x: str, axis: int, size: int, parts: int) -> list[str]:
    return [ctx.op("Slice", [x, ctx.ints("s", [k * size]), ctx.ints("e", [(k + 1) * size]), ctx.ints("a", [axis])])
            for k in range(parts)]


@exports("LSTMUnit")
def lstm_unit(ctx: LayerContext) -> list[str]:
    """One LSTM step: gates (i', f', o', g') sliced from the (1, N, 4D) bottom, ``f`` multiplied by
    ``cont`` (a 0 flag gives f = 0), ``c = f·c_prev + i·g``, ``h = o·tanh(c)``."""
    c_prev, gates, cont = ctx.bottoms
    d = ctx.bottom_shapes[0][2]
    gi, gf, go, gg = _sliced(ctx, gates, 2, d, 4)
    flag = ctx.op("Unsqueeze", [cont, ctx.ints("axes2", [2])])  # (1, N, 1)
    f = ctx.op("Where", [ctx.op("Equal", [flag, ctx.const("zero", 0.0)]), ctx.const("zero_f", 0.0),
                         ctx.op("Mul", [flag, ctx.op("Sigmoid", [gf])])])
    c = ctx.op("Add", [ctx.op("Mul", [f, c_prev]), ctx.op("Mul", [ctx.op("Sigmoid", [gi]), ctx.op("Tanh", [gg])])],
               ctx.out(0))
    h = ctx.op("Mul", [ctx.op("Sigmoid", [go]), ctx.op("Tanh", [c])], ctx.out(1))
    return [c, h]


@exports("Lstm")
def ctpn_lstm(ctx: LayerContext) -> list[str]:
    """CTPN's Lstm without a clip bottom is a plain one-direction LSTM from zero state: ONNX's
    ``LSTM`` with the gate blocks reordered from Caffe's (i, f, o, g) to ONNX's (i, o, f, c)."""
    if len(ctx.bottoms) > 1:
        raise ctx.error("not exportable with a clip bottom: the layer then starts from the state left by the "
                        "previous forward and resets it wherever clip is 0, which ONNX's LSTM cannot express")
    H = int(ctx.layer.H)
    w_i, w_h, b = ctx.param(0), ctx.param(1), ctx.param(2).reshape(-1)
    order = np.concatenate([np.arange(k * H, (k + 1) * H) for k in (0, 2, 1, 3)])
    shape = ctx.bottom_shapes[0]
    x = ctx.bottoms[0]
    if len(shape) != 3:
        x = ctx.op("Reshape", [x, ctx.ints("x_shape", [0, 0, -1])])
    bias = np.concatenate([b[order], np.zeros(4 * H)])[None]
    y = ctx.op("LSTM", [x, ctx.const("W", w_i[order][None]), ctx.const("R", w_h[order][None]), ctx.const("B", bias)],
               hidden_size=H)
    return [ctx.op("Squeeze", [y, ctx.ints("axes1", [1])], ctx.out(0))]


def scatter_planes(ctx: LayerContext, x: str, idx: str, out_hw: tuple[int, int], out: str) -> str:
    """Each (n, c) plane of ``x`` scattered into a zero (Ho, Wo) plane at the flat positions ``idx``
    (int64, the shape of ``x`` viewed (N, C, H·W)); a repeated position keeps the later value."""
    n, c, h, w = ctx.bottom_shapes[0]
    ho, wo = out_hw
    flat = ctx.shape_target([n, c, h * w], ctx.bottom_shapes[0])
    xv = ctx.op("Reshape", [x, flat])
    if ctx.dynamic_batch:
        batch = ctx.op("Slice", [ctx.op("Shape", [x]), ctx.ints("b0", [0]), ctx.ints("b1", [1])])
        zshape = ctx.op("Concat", [batch, ctx.ints("cz", [c, ho * wo])], axis=0)
    else:
        zshape = ctx.ints("zero_shape", [n, c, ho * wo])
    zeros = ctx.op("ConstantOfShape", [zshape], value=_float_tensor(0.0))
    y = ctx.op("ScatterElements", [zeros, idx, xv], axis=2)
    return ctx.reshape(y, [n, c, ho, wo], ctx.bottom_shapes[0], out)


def _float_tensor(v: float):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array([v], np.float32))


@exports("Unpooling", "UnPooling")
def unpooling(ctx: LayerContext) -> list[str]:
    """MAX with the pooling mask (bottom 1 of bottom 0's shape): ``ScatterElements``; MAX with the
    pre-pooling input: its switches from ``MaxPool``'s indices (first maximum on ties in ONNX Runtime,
    as Caffe), then ``ScatterElements``; MAX without bottom 1: scattered at each window's (clipped)
    first cell; AVE / TILE: a grouped ``ConvTranspose`` with constant kernels (AVE: the values divided
    by their window's size first), cropped or zero-padded to the output size."""
    L = ctx.layer
    n, c, h, w = ctx.bottom_shapes[0]
    ho, wo = L.out_hw
    (kh, kw), (sh, sw), (ph, pw) = L.kernel, L.stride, L.pad
    x = ctx.bottoms[0]
    (rs, r0, r1, rspan), (cs, c0, c1, cspan) = L._windows(h, w)
    if L.method == 0:  # MAX
        target = ctx.shape_target([n, c, h * w], ctx.bottom_shapes[0])
        if L.mode == "mask":
            idx = ctx.op("Reshape", [ctx.op("Cast", [ctx.bottoms[1]], to=7), target])
        elif L.mode == "start":
            flat = (np.clip(rs, 0, ho - 1)[:, None] * wo + np.clip(cs, 0, wo - 1)[None, :]).reshape(1, 1, h * w)
            idx = ctx.op("Expand", [ctx.const("switches", flat, np.int64), ctx.op("Shape", [ctx.op("Reshape", [x, target])])])
        else:  # recompute the switches from the pre-pooling input
            if np.any(r1 <= r0) or np.any(c1 <= c0):
                raise ctx.error("a pooling window lies outside the pre-pooling input: switches not exportable")
            ref = ctx.bottoms[1]
            pooled = ctx.tmp("repool")
            ind = ctx.tmp("switch_index")
            after = [max(0, (p - 1) * s + k - b - m) for p, s, k, b, m in
                     zip((h, w), (sh, sw), (kh, kw), (ph, pw), (ho, wo))]
            ctx.ops("MaxPool", [ref], [pooled, ind], kernel_shape=[kh, kw], strides=[sh, sw],
                    pads=[ph, pw, *after])
            got = [(m + b + a - k) // s + 1 for m, b, a, k, s in zip((ho, wo), (ph, pw), after, (kh, kw), (sh, sw))]
            if got != [h, w]:  # the pre-pooling input holds more windows than bottom 0 has cells
                ind = ctx.op("Slice", [ind, ctx.ints("zero2", [0, 0]), ctx.ints("hw", [h, w]), ctx.ints("axes23", [2, 3])])
            # MaxPool's indices count over the whole (N, C, Ho, Wo) tensor: keep the in-plane part
            idx = ctx.op("Reshape", [ctx.op("Mod", [ind, ctx.const("plane", np.array(ho * wo), np.int64)]), target])
        return [scatter_planes(ctx, x, idx, (ho, wo), ctx.out(0))]
    if L.method == 1:  # AVE: each value spread as value / its window's size
        inv_span = 1.0 / (rspan[:, None] * cspan[None, :]).astype(np.float64)
        x = ctx.op("Mul", [x, ctx.const("inv_span", inv_span, exact=True)])
    kernel = np.ones((c, 1, kh, kw), np.float32)
    full = ((h - 1) * sh + kh - ph, (w - 1) * sw + kw - pw)  # ConvTranspose's size, padding cut at the start
    crop = full[0] > ho or full[1] > wo
    pad = full[0] < ho or full[1] < wo
    y = ctx.op("ConvTranspose", [x, ctx.const("ones", kernel)], None if crop or pad else ctx.out(0),
               kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, 0, 0], group=c)
    if crop:
        y = ctx.op("Slice", [y, ctx.ints("zero2", [0, 0]), ctx.ints("ends", [min(ho, full[0]), min(wo, full[1])]),
                             ctx.ints("axes23", [2, 3])], None if pad else ctx.out(0))
    if pad:
        pads = ctx.ints("pads", [0, 0, 0, 0, 0, 0, max(0, ho - full[0]), max(0, wo - full[1])])
        y = ctx.op("Pad", [y, pads], ctx.out(0), mode="constant")
    return [y]
