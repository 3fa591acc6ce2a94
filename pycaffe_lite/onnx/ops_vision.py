"""Converters of the spatial layers: Convolution, Deconvolution, Pooling, SPP, LRN, InnerProduct, Crop."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..schema import caffe_pb2
from .graph import LayerContext
from .registry import exports

PP = caffe_pb2.PoolingParameter
LRNP = caffe_pb2.LRNParameter


def _conv_common(ctx: LayerContext) -> dict:
    """Conv / ConvTranspose attributes from the layer's geometry (2-D or N-D: one entry per
    spatial axis; the 2-D path's ``geo`` and the N-D path's ``geo_nd`` agree for 2-D)."""
    geo = ctx.layer.geo_nd
    if ctx.layer.axis != 1:
        raise ctx.error(f"channel axis {ctx.layer.axis}: ONNX convolutions take the channels at axis 1")
    axes = len(geo.kernel)
    for s in ctx.bottom_shapes:
        if len(s) != axes + 2:
            raise ctx.error(f"bottom shape {s}: expected (N, C) and {axes} spatial axes")
    return dict(kernel_shape=list(geo.kernel), strides=list(geo.stride), dilations=list(geo.dilation),
                pads=list(geo.pad) * 2, group=int(ctx.layer.group))


@exports("Convolution")
def convolution(ctx: LayerContext) -> list[str]:
    attrs = _conv_common(ctx)
    w = ctx.const("weight", ctx.param(0))
    inputs = [w] + ([ctx.const("bias", ctx.param(1))] if ctx.layer.bias_term else [])
    return [ctx.op("Conv", [x, *inputs], ctx.out(i), **attrs) for i, x in enumerate(ctx.bottoms)]


@exports("Deconvolution")
def deconvolution(ctx: LayerContext) -> list[str]:
    """ConvTranspose: Caffe's deconvolution weight (C, num_output/group, kh, kw) is ONNX's layout;
    the output size ``stride*(H-1) + dilation*(k-1) + 1 - 2*pad`` is ConvTranspose's with these
    pads (bilinear-upsampling deconvolutions, grouped with fixed weights, are ordinary ones)."""
    attrs = _conv_common(ctx)
    w = ctx.const("weight", ctx.param(0))
    inputs = [w] + ([ctx.const("bias", ctx.param(1))] if ctx.layer.bias_term else [])
    return [ctx.op("ConvTranspose", [x, *inputs], ctx.out(i), **attrs) for i, x in enumerate(ctx.bottoms)]


def _pad_after(ctx: LayerContext, in_shape: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
               pad: Sequence[int], pooled: Sequence[int]) -> list[int]:
    """Padding after the input so that ONNX's floor rule gives Caffe's pooled size, every window
    inside the padded input."""
    after = [max(0, (p - 1) * s + k - b - n) for p, s, k, b, n in zip(pooled, stride, kernel, pad, in_shape)]
    for k, b, a in zip(kernel, pad, after):
        if b >= k or a >= k:
            raise ctx.error(f"pooling window {k} with padding {b}/{a}: a window would hold no input")
    return after


def caffe_pool(ctx: LayerContext, x: str, ave: bool, in_hw: Sequence[int], kernel: Sequence[int],
               stride: Sequence[int], pad: Sequence[int], pooled: Sequence[int], out: str | None) -> str:
    """Pooling with Caffe's output size and divisor, over any number of spatial axes.

    The pooled size (ceil rounding, last window dropped when it would start in the padding) is
    given; the padding after the input is chosen so that ONNX's floor rule yields exactly that
    size with every window inside the padded input. MAX: MaxPool with those explicit pads (padding
    never wins). AVE: zeros padded explicitly, AveragePool without pads (divides by the kernel
    volume), then a constant factor kernel volume / Caffe's divisor per output position, the
    window clipped to the input plus its padding (counting the padding, not the overhang of the
    last, ceil-rounded window).
    """
    after = _pad_after(ctx, in_hw, kernel, stride, pad, pooled)
    if not ave:
        return ctx.op("MaxPool", [x], out, kernel_shape=list(kernel), strides=list(stride),
                      pads=list(pad) + after)
    if any(pad) or any(after):
        pads = ctx.ints("pads", [0, 0, *pad, 0, 0, *after])
        x = ctx.op("Pad", [x, pads], mode="constant")
    area = np.ones(())
    for p, s, k, b, n in zip(pooled, stride, kernel, pad, in_hw):
        start = np.arange(p) * s - b
        area = np.multiply.outer(area, np.minimum(start + k, n + b) - start)
    factor = float(np.prod(kernel)) / area
    if np.all(factor == 1):
        return ctx.op("AveragePool", [x], out, kernel_shape=list(kernel), strides=list(stride))
    y = ctx.op("AveragePool", [x], kernel_shape=list(kernel), strides=list(stride))
    return ctx.op("Mul", [y, ctx.const("divisor_fix", factor.reshape(1, 1, *area.shape))], out)


def _stochastic_test(ctx: LayerContext, g: _PoolGeometry) -> str:
    """STOCHASTIC pooling in the TEST phase: each window's sum of squares over its sum (0 where the
    sum is not positive); no padding, zeros past the end for ceil-rounded windows."""
    after = _pad_after(ctx, g.in_shape, g.kernel, g.stride, g.pad, g.pooled)
    x = ctx.bottoms[0]
    if any(after):
        x = ctx.op("Pad", [x, ctx.ints("pads", [0] * (2 + len(after)) + [0, 0, *after])], mode="constant")
    k, st = list(g.kernel), list(g.stride)
    total = ctx.op("AveragePool", [x], kernel_shape=k, strides=st)
    squares = ctx.op("AveragePool", [ctx.op("Mul", [x, x])], kernel_shape=k, strides=st)
    zero = ctx.const("zero", 0.0)
    positive = ctx.op("Greater", [total, zero])
    safe = ctx.op("Where", [positive, total, ctx.const("one", 1.0)])
    return ctx.op("Where", [positive, ctx.op("Div", [squares, safe]), zero], ctx.out(0))


class _PoolGeometry:
    """The pooling layer's geometry, 2-D path or N-D path (``layer.nd``)."""

    def __init__(self, layer) -> None:
        src = layer.nd if layer.nd is not None else layer
        self.method, self.global_pooling = src.method, bool(src.global_pooling)
        self.in_shape = tuple(src.in_shape if layer.nd is not None else layer.in_hw)
        self.kernel, self.stride = tuple(src.kernel), tuple(src.stride)
        self.pad, self.pooled = tuple(src.pad), tuple(src.pooled)


@exports("Pooling")
def pooling(ctx: LayerContext) -> list[str]:
    g = _PoolGeometry(ctx.layer)
    if len(g.kernel) > 3:
        raise ctx.error(f"{len(g.kernel)} spatial axes: ONNX Runtime pools over 1 to 3 axes")
    ave = g.method == PP.AVE
    x = ctx.bottoms[0]
    if len(ctx.out_names) > 1:
        if g.method != PP.MAX or g.global_pooling:
            raise ctx.error("a mask top is exported for MAX pooling with a kernel (not global) only")
        return max_pool_with_mask(ctx, g)
    if g.method == PP.STOCHASTIC:
        if ctx.layer.phase == caffe_pb2.TRAIN:  # samples at random: no ONNX equivalent
            raise ctx.error("STOCHASTIC pooling samples in the TRAIN phase; only its TEST form is exported")
        return [_stochastic_test(ctx, g)]
    if g.global_pooling:
        return [ctx.op("GlobalAveragePool" if ave else "GlobalMaxPool", [x], ctx.out(0))]
    return [caffe_pool(ctx, x, ave, g.in_shape, g.kernel, g.stride, g.pad, g.pooled, ctx.out(0))]


def max_pool_with_mask(ctx: LayerContext, g: _PoolGeometry) -> list[str]:
    """MAX pooling and its mask top (SegNet's unpooling switches): MaxPool's second output counts
    over the whole (N, C, *spatial) input, row-major, the first maximum of a window on ties, as
    Caffe; modulo the plane size it is Caffe's in-plane index (``h · W + w`` in 2-D), as a float."""
    after = _pad_after(ctx, g.in_shape, g.kernel, g.stride, g.pad, g.pooled)
    ind = ctx.tmp("indices")
    ctx.ops("MaxPool", [ctx.bottoms[0]], [ctx.out(0), ind], kernel_shape=list(g.kernel), strides=list(g.stride),
            pads=list(g.pad) + after)
    plane = ctx.op("Mod", [ind, ctx.const("plane", np.array(int(np.prod(g.in_shape))), np.int64)])
    return [ctx.out(0), ctx.op("Cast", [plane], ctx.out(1), to=1)]


@exports("SPP")
def spp(ctx: LayerContext) -> list[str]:
    """Each pyramid level as the layer's own internal Caffe pooling, flattened and concatenated."""
    ave = ctx.lp.spp_param.pool == caffe_pb2.SPPParameter.AVE
    pools = list(ctx.layer.pools)
    parts = []
    for pool in pools:
        out = ctx.out(0) if len(pools) == 1 else None
        y = caffe_pool(ctx, ctx.bottoms[0], ave, pool.in_hw, pool.kernel, pool.stride, pool.pad, pool.pooled, out)
        if len(pools) == 1:
            return [y]
        parts.append(ctx.op("Flatten", [y], axis=1))
    return [ctx.op("Concat", parts, ctx.out(0), axis=1)]


@exports("LRN")
def lrn(ctx: LayerContext) -> list[str]:
    p = ctx.lp.lrn_param
    size, alpha, beta = int(p.local_size), float(p.alpha), float(p.beta)
    x = ctx.bottoms[0]
    if p.norm_region == LRNP.ACROSS_CHANNELS:
        # ONNX's LRN is Caffe's: bias + alpha/size * (sum of squares over `size` channels).
        return [ctx.op("LRN", [x], ctx.out(0), size=size, alpha=alpha, beta=beta, bias=float(p.k))]
    # WITHIN_CHANNEL, as Caffe builds it: x^2, AVE pooling (size x size, stride 1, pad (size-1)/2,
    # Caffe's divisor), then (1 + alpha * mean)^-beta, times x. k is not used.
    n, c, h, w = ctx.bottom_shapes[0]
    pad = (size - 1) // 2
    pooled = [-(-(s + 2 * pad - size) // 1) + 1 for s in (h, w)]
    sq = ctx.op("Mul", [x, x])
    mean = caffe_pool(ctx, sq, True, (h, w), (size, size), (1, 1), (pad, pad), pooled, None)
    scale = ctx.op("Add", [ctx.op("Mul", [mean, ctx.const("alpha", alpha)]), ctx.const("one", 1.0)])
    return [ctx.op("Mul", [x, ctx.op("Pow", [scale, ctx.const("neg_beta", -beta)])], ctx.out(0))]


@exports("InnerProduct")
def inner_product(ctx: LayerContext) -> list[str]:
    L = ctx.layer
    shape = ctx.bottom_shapes[0]
    axis = L.axis
    w = ctx.param(0)
    if ctx.lp.inner_product_param.transpose:
        w = w.T  # stored (K, N)
    w = w.reshape(w.shape[0], -1)  # (N, K)
    bias = ctx.param(1).reshape(-1) if ctx.lp.inner_product_param.bias_term else None
    x = ctx.bottoms[0]
    if axis == 1:
        if len(shape) != 2:
            x = ctx.op("Flatten", [x], axis=1)
        inputs = [x, ctx.const("weight", w)] + ([ctx.const("bias", bias)] if bias is not None else [])
        return [ctx.op("Gemm", inputs, ctx.out(0), transB=1)]
    k = int(np.prod(shape[axis:]))
    x = ctx.reshape(x, list(shape[:axis]) + [k], shape)
    if bias is None:
        return [ctx.op("MatMul", [x, ctx.const("weight_t", w.T)], ctx.out(0))]
    y = ctx.op("MatMul", [x, ctx.const("weight_t", w.T)])
    return [ctx.op("Add", [y, ctx.const("bias", bias)], ctx.out(0))]


@exports("Crop")
def crop(ctx: LayerContext) -> list[str]:
    offsets = list(ctx.layer.offsets)
    top = ctx.top_shapes[0]
    axes = [i for i in range(len(top)) if offsets[i] != 0 or top[i] != ctx.bottom_shapes[0][i]]
    if not axes:
        return [ctx.op("Identity", [ctx.bottoms[0]], ctx.out(0))]
    starts = [offsets[i] for i in axes]
    ends = [offsets[i] + top[i] for i in axes]
    return [ctx.op("Slice", [ctx.bottoms[0], ctx.ints("starts", starts), ctx.ints("ends", ends),
                             ctx.ints("axes", axes)], ctx.out(0))]
