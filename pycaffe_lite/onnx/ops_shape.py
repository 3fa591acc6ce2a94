"""Converters of the layers that move, join, pick or reduce values: Concat, Slice, Split, Flatten,
Reshape, Tile, Dropout, Eltwise, ArgMax, Reduction, Embed, Parameter."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..schema import caffe_pb2
from .graph import LayerContext
from .registry import exports

EltOp = caffe_pb2.EltwiseParameter
RedOp = caffe_pb2.ReductionParameter


@exports("Concat")
def concat(ctx: LayerContext) -> list[str]:
    if len(ctx.bottoms) == 1:
        return [ctx.op("Identity", ctx.bottoms, ctx.out(0))]
    return [ctx.op("Concat", ctx.bottoms, ctx.out(0), axis=int(ctx.layer.axis))]


@exports("Slice")
def slice_(ctx: LayerContext) -> list[str]:
    axis = int(ctx.layer.axis)
    sizes = [s[axis] for s in ctx.top_shapes]
    outs = [ctx.out(i) for i in range(len(ctx.top_shapes))]
    if len(outs) == 1:
        return [ctx.op("Identity", ctx.bottoms, outs[0])]
    return ctx.ops("Split", [ctx.bottoms[0], ctx.ints("split", sizes)], outs, axis=axis)


@exports("Split")
def split(ctx: LayerContext) -> list[str]:
    """Every top is the bottom's value (no node)."""
    return [ctx.bottoms[0]] * len(ctx.top_shapes)


@exports("Dropout")
def dropout(ctx: LayerContext) -> list[str]:
    """The TEST-time identity (no node); times ``1 - dropout_ratio`` when ``scale_train`` is false."""
    layer = ctx.layer
    if layer.scale_train:
        return [ctx.bottoms[0]]
    return [ctx.op("Mul", [ctx.bottoms[0], ctx.const("keep", 1.0 - layer.threshold)], ctx.out(0))]


@exports("Flatten")
def flatten(ctx: LayerContext) -> list[str]:
    top, bottom = ctx.top_shapes[0], ctx.bottom_shapes[0]
    p = ctx.lp.flatten_param
    if len(top) == 2 and bottom[0] == top[0] and (p.axis == 1 or p.axis == 1 - len(bottom)):
        return [ctx.op("Flatten", ctx.bottoms, ctx.out(0), axis=1)]
    return [ctx.reshape(ctx.bottoms[0], top, bottom, ctx.out(0))]


@exports("Reshape")
def reshape(ctx: LayerContext) -> list[str]:
    """The top shape as computed by the layer (its 0 and -1 resolved), batch kept dynamic when asked."""
    return [ctx.reshape(ctx.bottoms[0], ctx.top_shapes[0], ctx.bottom_shapes[0], ctx.out(0))]


@exports("Tile")
def tile(ctx: LayerContext) -> list[str]:
    reps = [1] * len(ctx.bottom_shapes[0])
    reps[ctx.layer.axis] = int(ctx.layer.tiles)
    return [ctx.op("Tile", [ctx.bottoms[0], ctx.ints("repeats", reps)], ctx.out(0))]


@exports("Eltwise")
def eltwise(ctx: LayerContext) -> list[str]:
    op = ctx.layer.op
    xs = list(ctx.bottoms)
    if op == EltOp.PROD:
        y = xs[0]
        for i, x in enumerate(xs[1:]):
            y = ctx.op("Mul", [y, x], ctx.out(0) if i == len(xs) - 2 else None)
        return [y]
    if op == EltOp.MAX:
        return [ctx.op("Max", xs, ctx.out(0))]
    coeffs = [float(c) for c in ctx.layer.coeffs]
    terms = [x if c == 1 else ctx.op("Mul", [x, ctx.const(f"coeff{i}", c)]) for i, (x, c) in enumerate(zip(xs, coeffs))]
    return [ctx.op("Sum", terms, ctx.out(0))]


@exports("ArgMax")
def argmax(ctx: LayerContext) -> list[str]:
    """TopK (ties: ONNX Runtime ranks the smaller index first, Caffe the larger; values that tie
    exactly are the only difference). Indices are returned as floats, as Caffe stores them."""
    L = ctx.layer
    k = ctx.ints("k", [int(L.top_k)])
    top = ctx.top_shapes[0]
    if L.has_axis:
        outs = [ctx.tmp("values"), ctx.tmp("indices")]
        ctx.ops("TopK", [ctx.bottoms[0], k], outs, axis=int(L.axis), largest=1, sorted=1)
        if L.out_max_val:
            return [ctx.op("Identity", [outs[0]], ctx.out(0))]
        return [ctx.op("Cast", [outs[1]], ctx.out(0), to=TensorProto.FLOAT)]
    flat = ctx.op("Flatten", ctx.bottoms, axis=1)
    outs = [ctx.tmp("values"), ctx.tmp("indices")]
    ctx.ops("TopK", [flat, k], outs, axis=1, largest=1, sorted=1)
    idx = ctx.op("Cast", [outs[1]], to=TensorProto.FLOAT)
    parts = [idx, outs[0]] if L.out_max_val else [idx]
    y = ctx.op("Concat", parts, axis=1) if len(parts) > 1 else idx
    return [ctx.reshape(y, top, ctx.bottom_shapes[0], ctx.out(0))]


@exports("Reduction")
def reduction(ctx: LayerContext) -> list[str]:
    L = ctx.layer
    shape = ctx.bottom_shapes[0]
    axis = int(L.axis)
    x = ctx.reshape(ctx.bottoms[0], list(shape[:axis]) + [int(np.prod(shape[axis:]))], shape)
    op = {RedOp.SUM: "ReduceSum", RedOp.ASUM: "ReduceL1", RedOp.SUMSQ: "ReduceSumSquare",
          RedOp.MEAN: "ReduceMean"}[L.op]
    coeff = float(L.coeff)
    if coeff == 1:
        return [ctx.reduce(op, x, [axis], False, ctx.out(0))]
    return [ctx.op("Mul", [ctx.reduce(op, x, [axis], False), ctx.const("coeff", coeff)], ctx.out(0))]


@exports("Embed")
def embed(ctx: LayerContext) -> list[str]:
    """Gather rows of the (input_dim, num_output) table at the bottom's values (cast to int64),
    plus the bias."""
    idx = ctx.op("Cast", ctx.bottoms, to=TensorProto.INT64)
    w = ctx.const("weight", ctx.param(0))
    if not ctx.layer.bias_term:
        return [ctx.op("Gather", [w, idx], ctx.out(0), axis=0)]
    y = ctx.op("Gather", [w, idx], axis=0)
    return [ctx.op("Add", [y, ctx.const("bias", ctx.param(1))], ctx.out(0))]


@exports("Parameter")
def parameter(ctx: LayerContext) -> list[str]:
    return [ctx.op("Identity", [ctx.const("value", ctx.param(0))], ctx.out(0))]
