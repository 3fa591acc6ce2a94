"""Converters of the popular forks' layers (SSD, PSPNet/DeepLab, Faster R-CNN, ShuffleNet, YOLO
ports, MobileNet ports). They read the forks' own parameter fields (``permute_param``,
``norm_param``, ``interp_param``, ...) and the shapes the built layer computed, and take effect
when the layer type is registered in the framework; every export still passes through the
ONNX Runtime check, so a converter that disagrees with the layer is caught at its layer.

BVLC's recurrent layers (RNN, LSTM) are here too, as a ``Scan`` over the time steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .graph import LayerContext
from .ops_landed import scatter_planes
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
    SegNet's two-bottom Upsample (max-unpooling): each value scattered into a zero plane at its
    mask position (``ScatterElements``, the later value kept where two name one position)."""
    if len(ctx.bottoms) == 2:
        n, c, h, w = ctx.bottom_shapes[0]
        ho, wo = ctx.top_shapes[0][2:]
        target = ctx.shape_target([n, c, h * w], ctx.bottom_shapes[0])
        idx = ctx.op("Reshape", [ctx.op("Cast", [ctx.bottoms[1]], to=7), target])
        return [scatter_planes(ctx, ctx.bottoms[0], idx, (ho, wo), ctx.out(0))]
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
    value = np.array(ctx.top_blobs[0].math_data(), dtype=np.float32)
    return [ctx.op("Identity", [ctx.const("priors", value, exact=True)], ctx.out(0))]  # never float16


CORNER, CENTER_SIZE, CORNER_SIZE = 1, 2, 3  # SSD's PriorBoxParameter.CodeType


def _decode(ctx: LayerContext, loc: str, prior: str, code: int, in_target: bool) -> str:
    """The boxes ``(N, P, 4)`` from the location predictions ``(N, P, 4)`` and the priors
    ``(2, P, 4)`` (boxes, variances), in the layer's order of operations (bbox.decode)."""

    def part(x: str, axis: int, k: int) -> str:
        return ctx.op("Slice", [x, ctx.ints("s", [k]), ctx.ints("e", [k + 1]), ctx.ints("a", [axis])])

    pbox = ctx.op("Squeeze", [part(prior, 0, 0), ctx.ints("axes0", [0])])  # (P, 4)
    pvar = ctx.op("Squeeze", [part(prior, 0, 1), ctx.ints("axes0", [0])])
    t = loc if in_target else ctx.op("Mul", [loc, pvar])
    if code == CORNER:
        return ctx.op("Add", [pbox, t])
    x0, y0, x1, y1 = (part(pbox, 1, k) for k in range(4))  # (P, 1) each
    pw, ph = ctx.op("Sub", [x1, x0]), ctx.op("Sub", [y1, y0])
    if code == CORNER_SIZE:
        return ctx.op("Add", [pbox, ctx.op("Mul", [t, ctx.op("Concat", [pw, ph, pw, ph], axis=1)])])
    two = ctx.const("two", 2.0)
    pcx = ctx.op("Div", [ctx.op("Add", [x0, x1]), two])
    pcy = ctx.op("Div", [ctx.op("Add", [y0, y1]), two])
    t0, t1, t2, t3 = (part(t, 2, k) for k in range(4))  # (N, P, 1) each
    cx = ctx.op("Add", [ctx.op("Mul", [t0, pw]), pcx])
    cy = ctx.op("Add", [ctx.op("Mul", [t1, ph]), pcy])
    hw = ctx.op("Div", [ctx.op("Mul", [ctx.op("Exp", [t2]), pw]), two])
    hh = ctx.op("Div", [ctx.op("Mul", [ctx.op("Exp", [t3]), ph]), two])
    return ctx.op("Concat", [ctx.op("Sub", [cx, hw]), ctx.op("Sub", [cy, hh]),
                             ctx.op("Add", [cx, hw]), ctx.op("Add", [cy, hh])], axis=2)


def _stable_order(ctx: LayerContext, key: str, largest: bool) -> str:
    """The permutation sorting the 1-D ``key`` (ascending, or descending with ``largest``); equal
    keys keep their order (ONNX Runtime's TopK ranks the lower index first on ties)."""
    k = ctx.op("Shape", [key])
    order = ctx.tmp("order")
    ctx.ops("TopK", [key, k], [ctx.tmp("sorted"), order], axis=0, largest=int(largest), sorted=1)
    return order


@exports("DetectionOutput")
def detection_output(ctx: LayerContext) -> list[str]:
    """SSD's DetectionOutput at any batch, every image inside the graph at once: decode the boxes,
    per image and class the ``top_k`` best scores (TopK), greedy NMS above ``confidence_threshold``
    (``NonMaxSuppression``, each image and class its own batch entry), then per image the
    ``keep_top_k`` best over all classes (ties: lower class, then NMS order), the rows ordered by
    image, label, then score, as ``[image, label, score, xmin, ymin, xmax, ymax]`` in a
    (1, 1, rows, 7) top; no detection in the whole batch gives one row ``[i, -1, ..., -1]`` per
    image. The number of rows is data-dependent.

    The orders are stable sorts (TopK over the whole vector): NMS's output, grouped by entry in
    selection order, sorted by score (descending) and then by image, ranks each detection within
    its image for ``keep_top_k``; the kept ones sorted by entry (image, class) give the layer's
    row order."""
    p = ctx.lp.detection_output_param
    nms = p.nms_param
    loc_shape, conf_shape, prior_shape = ctx.bottom_shapes[:3]
    if not p.share_location:
        raise ctx.error("share_location: false is not exported")
    if float(getattr(nms, "eta", 1.0)) != 1.0:
        raise ctx.error("adaptive NMS (eta < 1) has no ONNX equivalent")
    code = int(p.code_type)
    if code not in (CORNER, CENTER_SIZE, CORNER_SIZE):
        raise ctx.error(f"code_type {code}: only CORNER, CENTER_SIZE and CORNER_SIZE are exported")
    num_classes = int(p.num_classes)
    priors = int(np.prod(prior_shape[2:])) // 4
    classes = [c for c in range(num_classes) if c != int(p.background_label_id)]
    nc = len(classes)
    top_k = int(nms.top_k) if nms.HasField("top_k") and int(nms.top_k) > -1 else priors
    top_k = min(top_k, priors)
    keep_top_k = int(p.keep_top_k)
    # unset: every score passes (the layer's -FLT_MAX)
    threshold = float(p.confidence_threshold) if p.HasField("confidence_threshold") else float(np.finfo(np.float32).min)
    if not classes or top_k == 0:
        raise ctx.error("no class other than the background, or top_k 0: nothing to detect")

    def i64(what: str, v: int) -> str:
        return ctx.const(what, v, np.int64)

    def col(x: str, k: int) -> str:  # column k of a (S, m) value, as (S,)
        return ctx.op("Squeeze", [ctx.op("Slice", [x, ctx.ints("s", [k]), ctx.ints("e", [k + 1]), ctx.ints("a", [1])]),
                                  ctx.ints("axes1", [1])])

    loc = ctx.op("Reshape", [ctx.bottoms[0], ctx.ints("loc_shape", [-1, priors, 4])])
    prior = ctx.op("Reshape", [ctx.bottoms[2], ctx.ints("prior_shape", [2, priors, 4])])
    box = _decode(ctx, loc, prior, code, bool(p.variance_encoded_in_target))  # (N, P, 4)
    images = ctx.op("Squeeze", [ctx.op("Slice", [ctx.op("Shape", [loc]), ctx.ints("s", [0]), ctx.ints("e", [1])]),
                                ctx.ints("axes0", [0])])  # N, a scalar
    conf = ctx.op("Reshape", [ctx.bottoms[1], ctx.ints("conf_shape", [-1, priors, num_classes])])
    conf = ctx.op("Transpose", [conf], perm=[0, 2, 1])
    conf = ctx.op("Gather", [conf, ctx.ints("classes", classes)], axis=1)  # (N, C', P)
    vals, idx = ctx.tmp("cand_scores"), ctx.tmp("cand_index")
    ctx.ops("TopK", [conf, ctx.ints("top_k", [top_k])], [vals, idx], axis=2, largest=1, sorted=1)
    # the candidates' boxes, (N·C', k, 4): entry b = image · C' + class entry
    flat_idx = ctx.op("Reshape", [idx, ctx.ints("nk1", [0, -1, 1])])  # (N, C'·k, 1)
    cand = ctx.op("GatherND", [box, flat_idx], batch_dims=1)
    cand = ctx.op("Reshape", [cand, ctx.ints("cand_shape", [-1, top_k, 4])])
    vals = ctx.op("Reshape", [vals, ctx.ints("entry_k", [-1, top_k])])  # (N·C', k)
    idx = ctx.op("Reshape", [idx, ctx.ints("entry_k", [-1, top_k])])
    # NMS ranks by position, not score: top_k - j for candidate j (TopK's order: the layer's, equal
    # scores lower prior first) where the score passes the threshold, else -1 (below NMS's 0): equal
    # scores are then taken in the layer's order whatever the runtime's NMS does with ties
    rank = ctx.op("Sub", [ctx.const("k_f", float(top_k)),
                          ctx.op("Cast", [ctx.op("Range", [i64("r0", 0), i64("k_i", top_k), i64("r1", 1)])], to=1)])
    passing = ctx.op("Greater", [vals, ctx.const("score_thr", threshold)])
    rank = ctx.op("Where", [passing, rank, ctx.const("below", -1.0)])
    sel = ctx.op("NonMaxSuppression", [cand, ctx.op("Unsqueeze", [rank, ctx.ints("axes1", [1])]),
                                       ctx.ints("max_out", [top_k]), ctx.const("iou", float(nms.nms_threshold)),
                                       ctx.const("zero_thr", 0.0)])
    bj = ctx.op("Gather", [sel, ctx.ints("bj", [0, 2])], axis=1)  # (S, 2): entry, candidate
    entry = col(bj, 0)
    score = ctx.op("GatherND", [vals, bj])  # (S,)
    prior_idx = ctx.op("GatherND", [idx, bj])
    image = ctx.op("Div", [entry, i64("classes_n", nc)])
    # keep_top_k per image: rank by score within the image (stable sorts: score, then image)
    order = _stable_order(ctx, score, True)
    order = ctx.op("Gather", [order, _stable_order(ctx, ctx.op("Gather", [image, order], axis=0), False)], axis=0)
    if keep_top_k > -1:
        img_sorted = ctx.op("Gather", [image, order], axis=0)
        ids = ctx.op("Range", [i64("r0", 0), images, i64("r1", 1)])
        hits = ctx.op("Equal", [ctx.op("Unsqueeze", [img_sorted, ctx.ints("axes1", [1])]),
                                ctx.op("Unsqueeze", [ids, ctx.ints("axes0", [0])])])  # (S, N)
        counts = ctx.op("ReduceSum", [ctx.op("Cast", [hits], to=7), ctx.ints("axes0", [0])], keepdims=0)
        starts = ctx.op("CumSum", [counts, i64("axis0", 0)], exclusive=1)
        n_sel = ctx.op("Squeeze", [ctx.op("Shape", [score]), ctx.ints("axes0", [0])])
        pos = ctx.op("Range", [i64("r0", 0), n_sel, i64("r1", 1)])
        rank = ctx.op("Sub", [pos, ctx.op("Gather", [starts, img_sorted], axis=0)])
        order = ctx.op("Compress", [order, ctx.op("Less", [rank, i64("keep_top_k", keep_top_k)])], axis=0)
    order = ctx.op("Gather", [order, _stable_order(ctx, ctx.op("Gather", [entry, order], axis=0), False)], axis=0)
    entry = ctx.op("Gather", [entry, order], axis=0)
    image = ctx.op("Gather", [image, order], axis=0)
    label = ctx.op("Gather", [ctx.ints("labels", classes), ctx.op("Mod", [entry, i64("classes_n", nc)])], axis=0)
    flat_prior = ctx.op("Add", [ctx.op("Mul", [image, i64("priors_n", priors)]),
                                ctx.op("Gather", [prior_idx, order], axis=0)])
    boxes = ctx.op("Gather", [ctx.op("Reshape", [box, ctx.ints("flat_box", [-1, 4])]), flat_prior], axis=0)
    cols = [ctx.op("Cast", [image], to=1), ctx.op("Cast", [label], to=1), ctx.op("Gather", [score, order], axis=0)]
    cols = [ctx.op("Unsqueeze", [c, ctx.ints("axes1", [1])]) for c in cols]
    table = ctx.op("Concat", [*cols, boxes], axis=1)  # (D, 7)
    # no detection in the whole batch: one row [i, -1, ..., -1] per image
    ids = ctx.op("Cast", [ctx.op("Range", [i64("r0", 0), images, i64("r1", 1)])], to=1)
    minus = ctx.op("Expand", [ctx.const("minus_one", np.full((1, 6), -1.0, np.float32)),
                              ctx.op("Concat", [ctx.op("Unsqueeze", [images, ctx.ints("axes0", [0])]),
                                                ctx.ints("six", [6])], axis=0)])
    empty = ctx.op("Concat", [ctx.op("Unsqueeze", [ids, ctx.ints("axes1", [1])]), minus], axis=1)  # (N, 7)
    d = ctx.op("Shape", [entry])
    n_rows = ctx.op("Where", [ctx.op("Equal", [d, ctx.ints("zero1", [0])]),
                              ctx.op("Unsqueeze", [images, ctx.ints("axes0", [0])]), d])
    table = ctx.op("Slice", [ctx.op("Concat", [table, empty], axis=0), ctx.ints("zero0", [0]), n_rows,
                             ctx.ints("axis0", [0])])
    return [ctx.op("Reshape", [table, ctx.ints("out_shape", [1, 1, -1, 7])], ctx.out(0))]


@exports("RNN", "LSTM")
def recurrent(ctx: LayerContext) -> list[str]:
    """BVLC's RNN and LSTM as a ``Scan`` over the T steps; the body is one step of the unrolled net
    (``h_conted = cont_t * h``, the recurrent product, the gates; LSTM's forget gate times
    ``cont_t``); the input products ``W·x_t + b`` (and the static input's) are computed for every
    step before the Scan, RNN's output layer after it. With ``expose_hidden`` the initial state is
    the h0 (c0) bottoms and the final state the extra tops: exact. Without it the export starts from
    zero state, which is the layer's own state on its first forward and makes no difference
    whenever ``cont`` is 0 at step 1 (each forward starts its sequences, the usual deploy case); a
    later forward that continues the previous one's sequences (cont 1 at step 1) differs."""
    from onnx import TensorProto, helper

    L = ctx.layer
    lstm = ctx.type == "LSTM"
    D = int(ctx.lp.recurrent_param.num_output)
    T, N = ctx.bottom_shapes[0][:2]
    n_state = 2 if lstm else 1
    k = 2
    x = ctx.op("Reshape", [ctx.bottoms[0], ctx.ints("x_shape", [0, 0, -1])])  # (T, N, K), either may vary
    w_x, b_x = ctx.param(0), ctx.param(1).reshape(-1)
    pre = ctx.op("Add", [ctx.op("MatMul", [x, ctx.const("W_x_t", w_x.T)]), ctx.const("b_x", b_x)])  # (T, N, G)
    p = 2
    if L.static_input:
        xs = ctx.op("Flatten", [ctx.bottoms[k]], axis=1)
        pre = ctx.op("Add", [pre, ctx.op("MatMul", [xs, ctx.const("W_static_t", ctx.param(p).T)])])
        k, p = k + 1, p + 1
    w_h = ctx.param(p)  # (G, D)
    if L.expose_hidden:
        states = [ctx.op("Squeeze", [b, ctx.ints("axes0", [0])]) for b in ctx.bottoms[k:k + n_state]]
    else:
        if ctx.dynamic_batch:
            batch = ctx.op("Slice", [ctx.op("Shape", [ctx.bottoms[1]]), ctx.ints("s1", [1]), ctx.ints("e2", [2])])
            zshape = ctx.op("Concat", [batch, ctx.ints("d", [D])], axis=0)
        else:
            zshape = ctx.ints("state_shape", [N, D])
        from onnx import numpy_helper

        zero = ctx.op("ConstantOfShape", [zshape], value=numpy_helper.from_array(np.zeros(1, np.float32)))
        states = [zero] * n_state
        ctx.notes.append(f"layer '{ctx.name}' ({ctx.type}): exported from zero initial state; equal to Caffe "
                         "wherever cont is 0 at step 1 (see docs/onnx.md)")
    # the body: one step
    w_h_t = ctx.const("W_h_t", w_h.T)
    name = ctx.name
    nodes = []

    def v(local: str) -> str:  # body values are named apart from the outer graph's
        return f"{name}/step/{local}"

    def node(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [v(out)], name=v(out), **attrs))
        return v(out)

    def info(n: str):
        return helper.make_tensor_value_info(n, TensorProto.FLOAT, None)

    body_in = [v(n) for n in ["h_prev"] + (["c_prev"] if lstm else []) + ["pre_t", "cont_t"]]
    flag = node("Unsqueeze", [v("cont_t"), ctx.ints("axes1", [1])], "flag")
    hc = node("Mul", [v("h_prev"), flag], "h_conted")
    a = node("Add", [node("MatMul", [hc, w_h_t], "W_h_h"), v("pre_t")], "gate_input")
    if lstm:
        parts = [node("Slice", [a, ctx.ints("s", [j * D]), ctx.ints("e", [(j + 1) * D]), ctx.ints("a", [1])], f"g{j}")
                 for j in range(4)]
        i_g, f_g, o_g = (node("Sigmoid", [parts[j]], f"sig{j}") for j in range(3))
        g_g = node("Tanh", [parts[3]], "cand")
        f_g = node("Where", [node("Equal", [flag, ctx.const("zero", 0.0)], "reset"), ctx.const("zero_f", 0.0),
                             node("Mul", [flag, f_g], "f_cont")], "forget")
        c = node("Add", [node("Mul", [f_g, v("c_prev")], "fc"), node("Mul", [i_g, g_g], "ig")], "c_next")
        h = node("Mul", [o_g, node("Tanh", [c], "tanh_c")], "h_next")
        body_out = [h, c, node("Identity", [h], "h_out")]
    else:
        h = node("Tanh", [a], "h_next")
        body_out = [h, node("Identity", [h], "h_out")]
    body = helper.make_graph(nodes, f"{name}_step", [info(n) for n in body_in], [info(n) for n in body_out])
    finals = [ctx.tmp("h_T")] + ([ctx.tmp("c_T")] if lstm else [])
    seq = ctx.tmp("h_seq")
    ctx.ops("Scan", [*states, pre, ctx.bottoms[1]], [*finals, seq], body=body, num_scan_inputs=2)
    if lstm:
        outs = [ctx.op("Identity", [seq], ctx.out(0))]
    else:
        w_o, b_o = ctx.param(p + 1), ctx.param(p + 2).reshape(-1)
        o = ctx.op("Add", [ctx.op("MatMul", [seq, ctx.const("W_o_t", w_o.T)]), ctx.const("b_o", b_o)])
        outs = [ctx.op("Tanh", [o], ctx.out(0))]
    for j, f in enumerate(finals[:len(ctx.out_names) - 1]):
        outs.append(ctx.op("Unsqueeze", [f, ctx.ints("axes0", [0])], ctx.out(j + 1)))
    return outs


@exports("BReLU")
def brelu(ctx: LayerContext) -> list[str]:
    """DehazeNet's bounded ReLU ``min(max(x, minval), maxval)``: ONNX's Clip is the same formula
    (maxval everywhere when minval > maxval, as ours)."""
    p = ctx.lp.brelu_param
    return [ctx.op("Clip", [ctx.bottoms[0], ctx.const("min", float(p.minval)), ctx.const("max", float(p.maxval))],
                   ctx.out(0))]


@exports("ContinuationIndicator")
def continuation_indicator(ctx: LayerContext) -> list[str]:
    """A T x N constant (0 at t = 0, 1 after): its values depend on ``time_step`` and ``batch_size`` only."""
    p = ctx.lp.continuation_indicator_param
    values = np.ones((int(p.time_step), int(p.batch_size)), np.float32)
    values[0] = 0
    return [ctx.op("Identity", [ctx.const("indicator", values, exact=True)], ctx.out(0))]
