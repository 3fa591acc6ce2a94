"""Spatial coordinate maps between net_spec tops (pycaffe's ``caffe.coord_map``, used by FCN's scripts).

A map is a triple ``(axis, scale, shift)``: a coordinate ``x`` of the input of a layer lands at
``scale * x + shift`` in its output, along the spatial axes starting at ``axis`` (``None``: the
layer does not move coordinates, e.g. ReLU). ``scale`` and ``shift`` are numpy arrays with one entry
per spatial axis (or one for all). :func:`coord_map_from_to` relates two tops through their common
ancestor; :func:`crop` builds the ``Crop`` layer that aligns one top with another (FCN's
``crop(n.upscore, n.data)``).

Convolution-like layers (Convolution, Pooling, Im2col) with kernel extent ``k = (kernel - 1) *
dilation + 1``, stride ``s`` and padding ``p`` map ``x -> x / s + (p - (k - 1) / 2) / s``;
Deconvolution maps the other way, ``x -> s * x + (k - 1) / 2 - p``; Crop with ``offset`` o on the
axes from ``crop_param.axis`` shifts by ``-o``.
"""

from __future__ import annotations

import numpy as np

from . import layers as L

# Layers whose output coordinates are their input's (element-wise and normalization layers).
PASS_THROUGH_LAYERS = [
    "AbsVal", "BatchNorm", "Bias", "BNLL", "Dropout", "Eltwise", "ELU", "Log", "LRN", "Exp", "MVN",
    "Power", "ReLU", "PReLU", "Scale", "Sigmoid", "Split", "TanH", "Threshold",
]

IDENTITY = (None, 1, 0)


class UndefinedMapException(Exception):
    """The layer has no coordinate mapping (e.g. InnerProduct)."""


class AxisMismatchException(Exception):
    """Two maps act on different spatial axes and cannot be composed."""


def _vector(value) -> np.ndarray:
    return np.array(value, ndmin=1)


def conv_params(fn) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """``(axis, stride, kernel extent, pad)`` of a Convolution/Deconvolution/Im2col/Pooling Function.

    Parameters may be given inside ``convolution_param=dict(...)`` or directly as keywords
    (net_spec puts them in the layer's own parameter message). The legacy ``*_h``/``*_w`` forms are
    refused (an AssertionError, as pycaffe).
    """
    params = fn.params.get("convolution_param", fn.params)
    legacy = {"pad_h", "pad_w", "kernel_h", "kernel_w", "stride_h", "stride_w"} & set(fn.params)
    assert not legacy, "cropping does not support legacy _h/_w params"
    kernel = _vector(params["kernel_size"])
    dilation = _vector(params.get("dilation", 1))
    extent = (kernel - 1) * dilation + 1
    return params.get("axis", 1), _vector(params.get("stride", 1)), extent, _vector(params.get("pad", 0))


def crop_params(fn) -> tuple[int, np.ndarray]:
    """``(axis, offset)`` of a Crop Function (defaults: axis 2, offset 0)."""
    params = fn.params.get("crop_param", fn.params)
    return params.get("axis", 2), _vector(params.get("offset", 0))


def coord_map(fn) -> tuple:
    """The map ``(axis, scale, shift)`` from a layer's (first) input to its output."""
    kind = fn.type_name
    if kind in ("Convolution", "Pooling", "Im2col"):
        axis, stride, extent, pad = conv_params(fn)
        return axis, 1 / stride, (pad - (extent - 1) / 2) / stride
    if kind == "Deconvolution":
        axis, stride, extent, pad = conv_params(fn)
        return axis, stride, (extent - 1) / 2 - pad
    if kind in PASS_THROUGH_LAYERS:
        return IDENTITY
    if kind == "Crop":
        axis, offset = crop_params(fn)
        return axis - 1, 1, -offset  # the map's axis is the last axis left alone
    raise UndefinedMapException


def compose(base_map: tuple, next_map: tuple) -> tuple:
    """``base_map`` (a1, b1) followed by ``next_map`` (a2, b2), written as one map: the scales
    multiply and the further shift is scaled by the first scale (``a1 a2``, ``a1 b2 + b1``)."""
    ax1, a1, b1 = base_map
    ax2, a2, b2 = next_map
    if ax1 is not None and ax2 is not None and ax1 != ax2:
        raise AxisMismatchException
    axis = ax2 if ax1 is None else ax1
    return axis, a1 * a2, a1 * b2 + b1


def inverse(coord_map: tuple) -> tuple:
    """The inverse map (``x -> (x - b) / a``)."""
    axis, a, b = coord_map
    return axis, 1 / a, -b / a


def _mappable_bottoms(top) -> tuple:
    # Every bottom of a layer shares its mapping, except Crop's second (reference) bottom.
    bottoms = top.fn.inputs
    return bottoms[:1] if top.fn.type_name == "Crop" else bottoms


def _ancestor_maps(start) -> dict:
    """Every ancestor of ``start`` reached through mappable layers -> its map to ``start``."""
    maps = {start: IDENTITY}
    pending = [start]
    while pending:
        top = pending.pop()
        try:
            step = coord_map(top.fn)
        except UndefinedMapException:
            continue
        for bottom in _mappable_bottoms(top):
            maps[bottom] = compose(maps[top], step)
            pending.append(bottom)
    return maps


def coord_map_from_to(top_from, top_to) -> tuple:
    """The map taking coordinates of ``top_from`` to coordinates of ``top_to``.

    Both tops are walked back to a common ancestor blob; the map is ``to``'s map composed with the
    inverse of ``from``'s. RuntimeError when they share no ancestor through spatial layers.
    """
    from_maps = _ancestor_maps(top_from)
    to_maps = {top_to: IDENTITY}
    pending = [top_to]
    while pending:
        top = pending.pop()
        if top in from_maps:
            return compose(to_maps[top], inverse(from_maps[top]))
        try:
            step = coord_map(top.fn)
        except UndefinedMapException:
            continue
        for bottom in _mappable_bottoms(top):
            to_maps[bottom] = compose(to_maps[top], step)
            pending.append(bottom)
    raise RuntimeError("Could not compute map between tops; are they connected by spatial layers?")


def crop(top_from, top_to):
    """A ``Crop`` layer (net_spec Top) cutting ``top_from`` to the region of ``top_to``.

    The map between them must have scale 1 and a non-positive integral shift (AssertionError
    otherwise, as pycaffe).
    """
    axis, scale, shift = coord_map_from_to(top_from, top_to)
    assert (np.asarray(scale) == 1).all(), f"scale mismatch on crop (a = {scale})"
    assert (np.asarray(shift) <= 0).all(), f"cannot crop negative offset (b = {shift})"
    assert (np.round(shift) == shift).all(), f"cannot crop noninteger offset (b = {shift})"
    offset = [int(v) for v in -np.round(_vector(shift)).astype(int)]
    return L.Crop(top_from, top_to, crop_param=dict(axis=axis + 1, offset=offset))
