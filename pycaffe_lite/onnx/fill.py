"""Weights for an export checked without trained ones (``export_onnx`` without ``--weights``).

The layers' own fillers give the weights, but a normalization's statistics start as Caffe leaves
them: BatchNorm's mean, variance and moving-average factor all 0 (global statistics then divide by
``sqrt(eps)``, about 316 per layer, and a deep net's forward overflows to inf / NaN; with ``eps: 0``
at once), the forks' BN variance 0. :func:`unit_statistics` gives them the statistics of a
normalized input instead (mean 0, variance 1, factor 1), so that each normalization is close to
the identity and the reference stays finite. Only blobs that the filler left in that state are
touched.
"""

from __future__ import annotations

import numpy as np


def unit_statistics(net) -> list[str]:
    """Set the running statistics of every BatchNorm (mean 0, variance 1, moving-average factor 1)
    and of every BN with fixed statistics (mean 0, variance 1) in ``net``; returns a note per layer."""
    notes = []
    for layer in net.layers:
        if layer.type == "BatchNorm" and len(layer.blobs) >= 3:
            mean, var, factor = layer.blobs[:3]
            if np.any(factor.cpu_data()) or np.any(var.cpu_data()):
                continue
            mean.mutable_cpu_data()[...] = 0
            var.mutable_cpu_data()[...] = 1
            factor.mutable_cpu_data()[...] = 1
        elif layer.type == "BN" and len(layer.blobs) == 4:
            mean, var = layer.blobs[2:4]
            if np.any(var.cpu_data()):
                continue
            mean.mutable_cpu_data()[...] = 0
            var.mutable_cpu_data()[...] = 1
        else:
            continue
        notes.append(f"layer '{layer.name}' ({layer.type}): no weights given; statistics set to mean 0, variance 1")
    return notes
