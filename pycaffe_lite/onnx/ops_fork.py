"""Converters of the popular forks' layers (SSD, PSPNet/DeepLab, Faster R-CNN, ShuffleNet, YOLO
ports, MobileNet ports). They read the forks' own parameter fields (``permute_param``,
``norm_param``, ``interp_param``, ...) and the shapes the built layer computed, and take effect
when the layer type is registered in the framework; every export still passes through the
ONNX Runtime check, so a converter that disagrees with the layer is caught at its layer.

Types ONNX cannot express exactly (DetectionOutput's variable-length, per-class NMS output; the
recurrent layers' per-step ``cont`` resets) are registered to raise an error that says why.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .graph import LayerContext
from .registry import exports


@exports("ReLU6")
def relu6(ctx: LayerContext) -> list[str]:
    return [ctx.op("Clip", [ctx.bottoms[0], ctx.const("min", 0.0), ctx.const("max", 6.0)], ctx.out(0))]


@exports("Permute")
def permute(ctx: LayerContext) -> list[str]:
    """SSD's Permute: ``order`` lists the new axis order; axes it omits follow in their order."""
    ndim = len(ctx.bottom_shapes[0])
    order = [int(o) for o in ctx.lp.permute_param.order]
    order += [a for a in range(ndim) if a not in order]
    if order == list(range(ndim)):
        return [ctx.op("Identity", ctx.bottoms, ctx.out(0))]
    return [ctx.op("Transpose", ctx.bottoms, ctx.out(0), perm=order)]


@exports("Normalize")
def normalize(ctx: LayerContext) -> list[str]:
    """SSD's Normalize: x / sqrt(Σx² + eps), the sum over each item (across_spatial) or over the
    channels at each position, times the learned scale (one shared value or one per channel)."""
    p = ctx.lp.norm_param
    x = ctx.bottoms[0]
    ndim = len(ctx.bottom_shapes[0])
    axes = list(range(1, ndim)) if p.across_spatial else [1]
    sq = ctx.reduce("ReduceSumSquare", x, axes, True)
    norm = ctx.op("Sqrt", [ctx.op("Add", [sq, ctx.const("eps", float(p.eps))])])
    y = ctx.op("Div", [x, norm])
    scale = ctx.param(0).reshape(-1)
    if scale.size == 1:
        s = ctx.const("scale", float(scale[0]))
    else:
        s = ctx.const("scale", scale.reshape([-1] + [1] * (ndim - 2)))
    return [ctx.op("Mul", [y, s], ctx.out(0))]


@exports("ShuffleChannel")
def shuffle_channel(ctx: LayerContext) -> list[str]:
    """(N, g·k, H, W) viewed as (N, g, k, H, W), the two group axes swapped, viewed back."""
    shape = ctx.bottom_shapes[0]
    g = int(ctx.lp.shuffle_channel_param.group)
    n, c = shape[0], shape[1]
    if g <= 1:
        return [ctx.op("Identity", ctx.bottoms, ctx.out(0))]
    x = ctx.reshape(ctx.bottoms[0], [n, g, c // g, *shape[2:]], shape)
    t = ctx.op("Transpose", [x], perm=[0, 2, 1, *range(3, len(shape) + 1)])
    return [ctx.reshape(t, shape, shape, ctx.out(0))]


@exports("ROIPooling")
def roi_pooling(ctx: LayerContext) -> list[str]:
    """Fast R-CNN's ROIPooling is ONNX's MaxRoiPool (rois (R, 5): batch index, x1, y1, x2, y2;
    rounded scaled corners, floor/ceil bins, empty bins 0)."""
    p = ctx.lp.roi_pooling_param
    rois = ctx.bottoms[1]
    rshape = ctx.bottom_shapes[1]
    if len(rshape) != 2:
        rois = ctx.op("Reshape", [rois, ctx.ints("shape", [-1, 5])])
    return [ctx.op("MaxRoiPool", [ctx.bottoms[0], rois], ctx.out(0), pooled_shape=[int(p.pooled_h), int(p.pooled_w)],
                   spatial_scale=float(p.spatial_scale))]


@exports("Interp")
def interp(ctx: LayerContext) -> list[str]:
    """PSPNet/DeepLab's Interp: bilinear with corners aligned (input corner pixels map to output
    corners) to the top's size, after cropping ``-pad_beg`` / ``-pad_end`` pixels (pads <= 0)."""
    p = ctx.lp.interp_param
    x = ctx.bottoms[0]
    shape = ctx.bottom_shapes[0]
    beg, end = int(p.pad_beg), int(p.pad_end)
    if beg > 0 or end > 0:
        raise ctx.error("positive pad_beg/pad_end are not supported (nor are they by the layer)")
    if beg or end:
        x = ctx.op("Slice", [x, ctx.ints("starts", [-beg, -beg]), ctx.ints("ends", [shape[2] + end, shape[3] + end]),
                             ctx.ints("axes", [2, 3])])
    return [_resize(ctx, x, "linear", "align_corners")]


@exports("Upsample")
def upsample(ctx: LayerContext) -> list[str]:
    """YOLO ports' Upsample (one bottom): nearest neighbour, ``top[h, w] = bottom[h // s, w // s]``.
    SegNet's two-bottom Upsample (max-unpooling with a mask) is not exported."""
    if len(ctx.bottoms) != 1:
        raise ctx.error("the two-bottom (max-unpooling, SegNet) Upsample is not exported")
    return [_resize(ctx, ctx.bottoms[0], "nearest", "asymmetric")]


def _resize(ctx: LayerContext, x: str, mode: str, coords: str) -> str:
    top = ctx.top_shapes[0]
    sizes = ctx.ints("sizes", [0 if ctx.dynamic_batch else top[0], *top[1:]])
    if ctx.dynamic_batch:  # the batch from the input, the rest fixed
        shape = ctx.op("Shape", [x])
        batch = ctx.op("Slice", [shape, ctx.ints("b0", [0]), ctx.ints("b1", [1])])
        sizes = ctx.op("Concat", [batch, ctx.ints("chw", list(top[1:]))], axis=0)
    attrs: dict[str, Any] = dict(mode=mode, coordinate_transformation_mode=coords)
    if mode == "nearest":
        attrs["nearest_mode"] = "floor"
    return ctx.op("Resize", [x, "", "", sizes], ctx.out(0), **attrs)


@exports("PriorBox")
def prior_box(ctx: LayerContext) -> list[str]:
    """SSD's PriorBox depends only on shapes: its top, computed by the layer, is a constant."""
    if ctx.top_blobs is None or ctx.bottom_blobs is None:
        raise ctx.error("needs the net's blobs to compute its constant priors")
    ctx.layer.forward_cpu(ctx.bottom_blobs, ctx.top_blobs)
    value = np.array(ctx.top_blobs[0].cpu_data(), dtype=np.float32)
    return [ctx.op("Identity", [ctx.const("priors", value)], ctx.out(0))]


@exports("DetectionOutput")
def detection_output(ctx: LayerContext) -> list[str]:
    raise ctx.error("not exportable exactly: SSD's per-class NMS with keep_top_k writes a variable number of "
                    "[image, label, score, box] rows; export the net up to its mbox_loc / mbox_conf_flatten / "
                    "mbox_priorbox tops and decode outside the graph")


@exports("RNN", "LSTM")
def recurrent(ctx: LayerContext) -> list[str]:
    raise ctx.error("not exportable: Caffe's recurrent layers reset their state wherever the 'cont' input is 0, "
                    "which ONNX's RNN/LSTM operators cannot express")
