"""Normalization statistics for an export checked without trained weights (``export_onnx``
without ``--weights``).

The layers' own fillers give the weights, but a normalization's statistics start as Caffe leaves
them: BatchNorm's mean, variance and moving-average factor all 0 (global statistics then divide by
``sqrt(eps)``, about 316 per layer, so a deep net's forward overflows to inf / NaN, and with
``eps: 0`` divides by zero at once), the forks' BN variance 0. A trained net's statistics are those
of the values each normalization sees, so that its output has zero mean and unit variance per
channel. :func:`fill_statistics` gives the untouched ones exactly that: one forward on a random
input (the check's kind) measures each normalization's input, layer after layer (a layer sees the
values the normalizations before it already produce), and sets mean and (biased) variance per
channel, factor 1; a channel whose variance is 0 or not finite gets mean 0, variance 1. The
reference forward then stays finite and its values keep the ranges a trained net has, so the
rounding differences of two runtimes stay at float32's relative level.
"""

from __future__ import annotations

import numpy as np

from ..blob import to_math
from .check import caffe_forward, random_feeds
from .registry import DATA_LAYERS


def _untouched(layer) -> bool:
    """A normalization on fixed statistics whose statistics were never set."""
    if layer.type == "BatchNorm" and len(layer.blobs) >= 3 and layer.use_global_stats:
        return not (np.any(layer.blobs[2].math_data()) or np.any(layer.blobs[1].math_data())
                    or np.any(layer.blobs[0].math_data()))
    if layer.type == "BN" and len(layer.blobs) == 4 and not layer.segnet and not layer.batch_stats:
        mean, var = layer.blobs[2].math_data(), layer.blobs[3].math_data()
        return not np.any(mean) and (not np.any(var) or bool(np.all(var == 1)))  # 1: a new frozen BN
    return False


def _set(layer, mean: np.ndarray, var: np.ndarray) -> None:
    if layer.type == "BatchNorm":
        layer.blobs[0].set_math_data(mean.reshape(layer.blobs[0].shape))
        layer.blobs[1].set_math_data(var.reshape(layer.blobs[1].shape))
        layer.blobs[2].set_math_data(np.ones(1))
    else:  # (stored rounded where a half net keeps them in half)
        layer.blobs[2].set_math_data(mean.reshape(layer.blobs[2].shape))
        layer.blobs[3].set_math_data(var.reshape(layer.blobs[3].shape))


def unit_statistics(net) -> list[str]:
    """Mean 0, variance 1 (and factor 1) for every untouched BatchNorm / fixed-statistics BN of
    ``net``; returns a note per layer."""
    notes = []
    for layer in net.layers:
        if _untouched(layer):
            c = layer.blobs[0].count if layer.type == "BatchNorm" else layer.blobs[2].count
            _set(layer, np.zeros(c), np.ones(c))
            notes.append(f"layer '{layer.name}' ({layer.type}): no weights given; statistics set to mean 0, "
                         "variance 1")
    return notes


def input_shapes(net) -> dict[str, tuple[int, ...]]:
    """The net's input blobs (Input layers and data layers without bottoms) and their shapes."""
    shapes = {}
    for i, layer in enumerate(net.layers):
        if (layer.type == "Input" or layer.type in DATA_LAYERS) and not net.bottom_names_of(i):
            for t in net.top_names_of(i):
                shapes[t] = tuple(net.blobs[t].shape)
    return shapes


def fill_statistics(net, seed: int = 1) -> list[str]:
    """Statistics measured on a random standard-normal input (seeded by ``seed``) for every
    untouched BatchNorm / fixed-statistics BN of ``net`` (module docstring); returns a note per
    layer. Raises what the net's forward raises."""
    targets = {i for i, layer in enumerate(net.layers) if _untouched(layer)}
    if not targets:
        return []
    notes = []

    def measure(i: int) -> None:
        if i not in targets:
            return
        layer = net.layers[i]
        x = np.asarray(to_math(net.bottom_vecs[i][0].cpu_data()), np.float64)  # (half storage as values)
        c = x.shape[1] if x.ndim > 1 else 1
        v = x.reshape(x.shape[0], c, -1)
        with np.errstate(all="ignore"):
            mean, var = v.mean(axis=(0, 2)), v.var(axis=(0, 2))
        bad = ~np.isfinite(mean) | ~np.isfinite(var) | (var <= 0)
        mean[bad], var[bad] = 0.0, 1.0
        _set(layer, mean, var)
        notes.append(f"layer '{layer.name}' ({layer.type}): no weights given; statistics measured on a random "
                     f"input ({int(bad.sum())} of {c} channels constant: mean 0, variance 1)")

    caffe_forward(net, random_feeds(net, input_shapes(net), seed), lambda i, j, value: None, before=measure)
    return notes
