"""Converters of the element-wise (neuron) layers."""

from __future__ import annotations

import math

from onnx import TensorProto

from .graph import LayerContext
from .registry import exports


def _one(ctx: LayerContext, op_type: str, **attrs) -> list[str]:
    return [ctx.op(op_type, [ctx.bottoms[0]], ctx.out(0), **attrs)]


@exports("ReLU")
def relu(ctx: LayerContext) -> list[str]:
    slope = float(ctx.lp.relu_param.negative_slope)
    return _one(ctx, "LeakyRelu", alpha=slope) if slope != 0 else _one(ctx, "Relu")


@exports("Sigmoid")
def sigmoid(ctx: LayerContext) -> list[str]:
    return _one(ctx, "Sigmoid")


@exports("TanH")
def tanh(ctx: LayerContext) -> list[str]:
    return _one(ctx, "Tanh")


@exports("AbsVal")
def absval(ctx: LayerContext) -> list[str]:
    return _one(ctx, "Abs")


@exports("BNLL")
def bnll(ctx: LayerContext) -> list[str]:
    return _one(ctx, "Softplus")  # log(1 + exp(x))


@exports("ELU")
def elu(ctx: LayerContext) -> list[str]:
    return _one(ctx, "Elu", alpha=float(ctx.lp.elu_param.alpha))


@exports("PReLU")
def prelu(ctx: LayerContext) -> list[str]:
    slope = ctx.param(0)
    ndim = len(ctx.bottom_shapes[0])
    if slope.size > 1 or not ctx.lp.prelu_param.channel_shared:
        slope = slope.reshape([-1] + [1] * (ndim - 2))  # per channel (axis 1)
    return [ctx.op("PRelu", [ctx.bottoms[0], ctx.const("slope", slope)], ctx.out(0))]


def _affine(ctx: LayerContext, x: str, scale: float, shift: float) -> str:
    if scale != 1:
        x = ctx.op("Mul", [x, ctx.const("scale", scale)])
    if shift != 0:
        x = ctx.op("Add", [x, ctx.const("shift", shift)])
    return x


@exports("Power")
def power(ctx: LayerContext) -> list[str]:
    """(shift + scale * x) ^ power."""
    p = ctx.lp.power_param
    pw, scale, shift = float(p.power), float(p.scale), float(p.shift)
    if pw == 0:
        ones = ctx.op("Mul", [ctx.bottoms[0], ctx.const("zero", 0.0)])
        return [ctx.op("Add", [ones, ctx.const("one", 1.0)], ctx.out(0))]
    if pw == 1:
        if scale == 1 and shift == 0:
            return [ctx.op("Identity", [ctx.bottoms[0]], ctx.out(0))]
        if shift == 0:
            return [ctx.op("Mul", [ctx.bottoms[0], ctx.const("scale", scale)], ctx.out(0))]
        y = ctx.op("Mul", [ctx.bottoms[0], ctx.const("scale", scale)]) if scale != 1 else ctx.bottoms[0]
        return [ctx.op("Add", [y, ctx.const("shift", shift)], ctx.out(0))]
    base = _affine(ctx, ctx.bottoms[0], scale, shift)
    return [ctx.op("Pow", [base, ctx.const("power", pw)], ctx.out(0))]


@exports("Exp")
def exp(ctx: LayerContext) -> list[str]:
    """base ^ (shift + scale * x) = base^shift * exp(scale * ln(base) * x)."""
    p = ctx.lp.exp_param
    base, scale, shift = float(p.base), float(p.scale), float(p.shift)
    log_base = 1.0 if base == -1 else math.log(base)
    inner, outer = scale * log_base, math.exp(shift * log_base)
    x = ctx.op("Mul", [ctx.bottoms[0], ctx.const("inner", inner)]) if inner != 1 else ctx.bottoms[0]
    if outer == 1:
        return [ctx.op("Exp", [x], ctx.out(0))]
    return [ctx.op("Mul", [ctx.op("Exp", [x]), ctx.const("outer", outer)], ctx.out(0))]


@exports("Log")
def log(ctx: LayerContext) -> list[str]:
    """log_base(shift + scale * x)."""
    p = ctx.lp.log_param
    base, scale, shift = float(p.base), float(p.scale), float(p.shift)
    y = _affine(ctx, ctx.bottoms[0], scale, shift)
    if base == -1:
        return [ctx.op("Log", [y], ctx.out(0))]
    return [ctx.op("Mul", [ctx.op("Log", [y]), ctx.const("inv_log_base", 1.0 / math.log(base))], ctx.out(0))]


@exports("Threshold")
def threshold(ctx: LayerContext) -> list[str]:
    above = ctx.op("Greater", [ctx.bottoms[0], ctx.const("threshold", float(ctx.lp.threshold_param.threshold))])
    return [ctx.op("Cast", [above], ctx.out(0), to=TensorProto.FLOAT)]


@exports("Clip")
def clip(ctx: LayerContext) -> list[str]:
    lo, hi = float(ctx.lp.clip_param.min), float(ctx.lp.clip_param.max)
    if lo <= hi:
        return [ctx.op("Clip", [ctx.bottoms[0], ctx.const("min", lo), ctx.const("max", hi)], ctx.out(0))]
    # min > max: Caffe's max(min, min(x, max)) gives min everywhere (ONNX's Clip would give max).
    y = ctx.op("Min", [ctx.bottoms[0], ctx.const("max", hi)])
    return [ctx.op("Max", [y, ctx.const("min", lo)], ctx.out(0))]


@exports("Swish")
def swish(ctx: LayerContext) -> list[str]:
    beta = float(ctx.lp.swish_param.beta)
    x = ctx.bottoms[0]
    bx = ctx.op("Mul", [x, ctx.const("beta", beta)]) if beta != 1 else x
    return [ctx.op("Mul", [x, ctx.op("Sigmoid", [bx])], ctx.out(0))]
