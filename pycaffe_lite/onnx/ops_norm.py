"""Converters of the normalizing and affine layers: BatchNorm, Scale, Bias, MVN, Softmax."""

from __future__ import annotations

import numpy as np

from .graph import LayerContext
from .registry import exports


@exports("BatchNorm")
def batch_norm(ctx: LayerContext) -> list[str]:
    """Global statistics (the TEST default): BatchNormalization with mean = blob0 / s and
    variance = blob1 / s, s the third blob (Caffe's moving-average scale factor; s = 0 gives 0),
    unit scale, zero bias and the layer's eps. Batch statistics (``use_global_stats: false``):
    the mean and variance over (N, spatial) computed in the graph."""
    x = ctx.bottoms[0]
    shape = ctx.bottom_shapes[0]
    eps = float(ctx.layer.eps)
    c = shape[1]
    if ctx.layer.use_global_stats:
        s = float(ctx.param(2).reshape(-1)[0])
        factor = 0.0 if s == 0 else 1.0 / s
        mean_v, var_v = ctx.param(0) * factor, ctx.param(1) * factor
        return [ctx.op("BatchNormalization", [x, ctx.const("gamma", np.ones(c)), ctx.const("beta", np.zeros(c)),
                                              ctx.const("mean", mean_v), ctx.const("var", var_v)],
                       ctx.out(0), epsilon=eps)]
    axes = [0] + list(range(2, len(shape)))
    mean = ctx.reduce("ReduceMean", x, axes, True)
    xc = ctx.op("Sub", [x, mean])
    var = ctx.reduce("ReduceMean", ctx.op("Mul", [xc, xc]), axes, True)
    std = ctx.op("Sqrt", [ctx.op("Add", [var, ctx.const("eps", eps)])])
    return [ctx.op("Div", [xc, std], ctx.out(0))]


def _operand_shape(ctx: LayerContext, axis: int, operand_shape: tuple[int, ...]) -> list[int]:
    """Broadcast shape of a Scale/Bias operand covering ``operand_shape`` from ``axis``."""
    ndim = len(ctx.bottom_shapes[0])
    if not operand_shape:
        return []
    start = axis + ndim if axis < 0 else axis
    return list(operand_shape) + [1] * (ndim - start - len(operand_shape))


def _operand(ctx: LayerContext, axis: int, index: int | None, what: str) -> str:
    """The Scale/Bias operand: param blob ``index`` as a constant, or bottom 1 reshaped."""
    if index is None:  # from bottom 1
        shape = ctx.bottom_shapes[1]
        bshape = _operand_shape(ctx, axis, shape)
        if len(bshape) == len(shape):
            return ctx.bottoms[1]
        return ctx.reshape(ctx.bottoms[1], bshape, shape if axis == 0 else None)
    blob = ctx.param(index)
    return ctx.const(what, blob.reshape(_operand_shape(ctx, axis, blob.shape)))


@exports("Scale")
def scale(ctx: LayerContext) -> list[str]:
    p = ctx.lp.scale_param
    from_bottom = len(ctx.bottoms) > 1
    s = _operand(ctx, p.axis, None if from_bottom else 0, "scale")
    if ctx.layer.bias_index is None:
        return [ctx.op("Mul", [ctx.bottoms[0], s], ctx.out(0))]
    b = _operand(ctx, p.axis, ctx.layer.bias_index, "bias")
    return [ctx.op("Add", [ctx.op("Mul", [ctx.bottoms[0], s]), b], ctx.out(0))]


@exports("Bias")
def bias(ctx: LayerContext) -> list[str]:
    p = ctx.lp.bias_param
    b = _operand(ctx, p.axis, None if len(ctx.bottoms) > 1 else 0, "bias")
    return [ctx.op("Add", [ctx.bottoms[0], b], ctx.out(0))]


@exports("MVN")
def mvn(ctx: LayerContext) -> list[str]:
    """x - mean (per item, or per item and channel); with normalize_variance divided by
    sqrt(mean of the squares) + eps (Caffe adds eps to the standard deviation)."""
    L = ctx.layer
    x = ctx.bottoms[0]
    ndim = len(ctx.bottom_shapes[0])
    axes = list(range(1 if L.across_channels else 2, ndim))
    if not axes:  # each row holds one value: x - mean is 0
        return [ctx.op("Mul", [x, ctx.const("zero", 0.0)], ctx.out(0))]
    if not L.normalize_variance:
        return [ctx.op("Sub", [x, ctx.reduce("ReduceMean", x, axes, True)], ctx.out(0))]
    xc = ctx.op("Sub", [x, ctx.reduce("ReduceMean", x, axes, True)])
    var = ctx.reduce("ReduceMean", ctx.op("Mul", [xc, xc]), axes, True)
    std = ctx.op("Add", [ctx.op("Sqrt", [var]), ctx.const("eps", float(L.eps))])
    return [ctx.op("Div", [xc, std], ctx.out(0))]


@exports("Softmax")
def softmax(ctx: LayerContext) -> list[str]:
    return [ctx.op("Softmax", [ctx.bottoms[0]], ctx.out(0), axis=int(ctx.layer.axis))]
