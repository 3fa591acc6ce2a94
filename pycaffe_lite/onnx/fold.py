"""Optional folding of BatchNorm (global statistics) and a following Scale into the convolution
before them, or of a BatchNorm + Scale pair into one ``BatchNormalization`` (``fold_bn=True``).

A group is a Convolution (one bottom, one top) followed directly by a BatchNorm reading its top,
optionally followed directly by a Scale (param operand on the channel axis) reading the
BatchNorm's top; or a BatchNorm followed directly by such a Scale. Caffe inserts Split layers when
a blob has several readers, so a layer reading an intermediate blob of the group by that name is
the group's next member. Per channel ``A``, ``B`` with ``y = A x + B``:

    BatchNorm: A = 1 / sqrt(var / s + eps), B = -(mean / s) A   (s = 0 gives mean = var = 0)
    Scale:     A <- gamma A, B <- gamma B + beta
    Conv:      W'[c] = W[c] A_c, b'_c = b_c A_c + B_c
"""

from __future__ import annotations

import numpy as np

from .graph import LayerContext
from .ops_vision import _conv_common


def _bn_ok(net, j: int, blob: str) -> bool:
    layer = net.layers[j]
    return (layer.type == "BatchNorm" and net.bottom_names_of(j) == [blob] and len(net.top_names_of(j)) == 1
            and bool(layer.use_global_stats))


def _scale_ok(net, j: int, blob: str) -> bool:
    layer = net.layers[j]
    if layer.type != "Scale" or net.bottom_names_of(j) != [blob] or len(net.top_names_of(j)) != 1:
        return False
    shape = tuple(net.bottom_vecs[j][0].shape)
    return len(shape) >= 2 and tuple(layer.blobs[0].shape) == (shape[1],) and layer.outer == shape[0]


# Convolution and the forks' depthwise types (Convolution layers with group = channels)
CONV_TYPES = frozenset({"Convolution", "DepthwiseConvolution", "ConvolutionDepthwise"})


def plan(net) -> dict[int, list[int]]:
    """{head layer index: the following layer indices folded into it}."""
    groups: dict[int, list[int]] = {}
    n = len(net.layers)
    for i, layer in enumerate(net.layers):
        if any(i in members for members in groups.values()):
            continue
        tops = net.top_names_of(i)
        if len(tops) != 1:
            continue
        members: list[int] = []
        blob = tops[0]
        if layer.type in CONV_TYPES and len(net.bottom_names_of(i)) == 1 and i + 1 < n and _bn_ok(net, i + 1, blob):
            members.append(i + 1)
            blob = net.top_names_of(i + 1)[0]
        if (layer.type == "BatchNorm" and layer.use_global_stats) or members:
            j = i + 1 + len(members)
            if j < n and _scale_ok(net, j, blob):
                members.append(j)
        if members:
            groups[i] = members
    return groups


def _bn_affine(layer) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(mean, var, A, B) of a BatchNorm on its global statistics."""
    mean, var, s = (np.array(b.math_data(), np.float64).reshape(-1) for b in layer.blobs[:3])
    f = 0.0 if s[0] == 0 else 1.0 / s[0]
    mean, var = mean * f, var * f
    a = 1.0 / np.sqrt(var + float(layer.eps))
    return mean, var, a, -mean * a


def convert(ctx: LayerContext, members: list) -> list[str]:
    """The group's output (one value, named as the last member's top)."""
    head = ctx.layer
    c = ctx.top_shapes[0][1] if head.type in CONV_TYPES else ctx.bottom_shapes[0][1]
    A, B = np.ones(c), np.zeros(c)
    bn = next((m for m in members if m.type == "BatchNorm"), head if head.type == "BatchNorm" else None)
    scale = next((m for m in members if m.type == "Scale"), None)
    if bn is not None:
        mean, var, A, B = _bn_affine(bn)
    gamma = np.array(scale.blobs[0].math_data(), np.float64).reshape(-1) if scale is not None else np.ones(c)
    beta = (np.array(scale.blobs[scale.bias_index].math_data(), np.float64).reshape(-1)
            if scale is not None and scale.bias_index is not None else np.zeros(c))
    A, B = gamma * A, gamma * B + beta
    if head.type == "BatchNorm":
        return [ctx.op("BatchNormalization", [ctx.bottoms[0], ctx.const("gamma", gamma), ctx.const("beta", beta),
                                              ctx.const("mean", mean), ctx.const("var", var)],
                       ctx.out(0), epsilon=float(head.eps))]

    attrs = _conv_common(ctx)
    w = ctx.param(0)
    w = w * A.reshape((-1,) + (1,) * (w.ndim - 1))
    b = (ctx.param(1).reshape(-1) if head.bias_term else np.zeros(c)) * A + B
    return [ctx.op("Conv", [ctx.bottoms[0], ctx.const("weight_folded", w), ctx.const("bias_folded", b)],
                   ctx.out(0), **attrs)]
