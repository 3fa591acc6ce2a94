"""Classify digit images with a deploy net (LeNet): ``classify_digits(model, weights, images)``.

Each image (a PNG/JPEG path or a 2-d uint8 array) is converted to grayscale, resized to the net's
input height and width, optionally inverted (MNIST digits are light on a dark background; with
``invert="auto"`` an image whose border is bright is inverted), and multiplied by ``scale``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import common
from ..errors import CaffeError, DataError, NetError
from ..io import oversized_image
from ..net import Net
from ..optional import require

MNIST_SCALE = 0.00390625


@dataclass
class DigitPrediction:
    source: str  # file name, or "array[i]"
    label: int  # index of the highest probability
    probs: np.ndarray  # (num_classes,) output of the net's probability blob


def load_image(path: str | os.PathLike, size: tuple[int, int], channels: int = 1) -> np.ndarray:
    """A uint8 ``(channels, H, W)`` array from an image file (grayscale, or BGR when channels=3)."""
    Image = require("PIL.Image", feature=f"{path}: reading images")
    try:
        with Image.open(path) as img:
            img = img.convert("L" if channels == 1 else "RGB")
            img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            arr = np.asarray(img, dtype=np.uint8)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read image: {exc}") from None
    except Image.DecompressionBombError as exc:
        raise oversized_image(path, exc) from None
    if channels == 1:
        return arr[None]
    return np.ascontiguousarray(arr[:, :, ::-1].transpose(2, 0, 1))


def _array_image(arr: np.ndarray, size: tuple[int, int], channels: int, where: str) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[0] != channels:
        raise DataError(f"{where}: expected a (H, W) or ({channels}, H, W) array, got shape {arr.shape}")
    if arr.shape[1:] != tuple(size):
        Image = require("PIL.Image", feature=f"{where}: resizing arrays")
        arr = np.stack([
            np.asarray(Image.fromarray(np.asarray(ch, dtype=np.uint8)).resize((size[1], size[0]),
                                                                             Image.Resampling.BILINEAR))
            for ch in arr
        ])
    return arr


def _should_invert(img: np.ndarray, invert: bool | str) -> bool:
    if invert == "auto":
        border = np.concatenate([img[:, 0].ravel(), img[:, -1].ravel(), img[:, :, 0].ravel(), img[:, :, -1].ravel()])
        return float(border.mean()) > 127.5
    return bool(invert)


def classify_digits(
    model,
    weights: str | os.PathLike | None = None,
    images: Sequence[str | os.PathLike | np.ndarray] = (),
    scale: float = MNIST_SCALE,
    invert: bool | str = "auto",
    batch_size: int = 256,
    prob_blob: str | None = None,
    allow_missing: bool = False,
    errors: list[tuple[str, str]] | None = None,
) -> list[DigitPrediction]:
    """Predict a class for every image. ``model`` is a deploy prototxt path (with ``weights``, a
    .caffemodel) or an already built :class:`~pycaffe_lite.Net`. The net's single input blob gives
    the image size; the probabilities are read from ``prob_blob`` (default: "prob" if the net has
    it, else its last output). ``weights`` must cover every learnable layer unless ``allow_missing``.
    With an ``errors`` list, an unreadable image is appended there as (path, message) and skipped
    instead of failing the whole batch."""

    if isinstance(model, Net):
        net = model
    else:
        net = Net(model, common.TEST)
        if weights is not None:
            net.copy_from(weights, allow_missing=allow_missing)
    if len(net.inputs) != 1:
        raise NetError(f"net '{net.name}': expected exactly one input blob, it has {net.inputs}")
    in_blob = net.blobs[net.inputs[0]]
    if in_blob.num_axes != 4:
        raise NetError(f"net '{net.name}': input '{net.inputs[0]}' has shape {in_blob.shape}; expected (N, C, H, W)")
    _, channels, h, w = in_blob.shape
    if prob_blob is None:
        prob_blob = "prob" if "prob" in net.blobs else net.outputs[-1]
    if prob_blob not in net.blobs:
        raise NetError(f"net '{net.name}': no blob named '{prob_blob}' (outputs: {net.outputs})")
    arrays, names = [], []
    for i, img in enumerate(images):
        if isinstance(img, np.ndarray):
            names.append(f"array[{i}]")
            arr = _array_image(img, (h, w), channels, names[-1])
        else:
            try:
                arr = load_image(img, (h, w), channels)
            except CaffeError as exc:
                if errors is None:
                    raise
                errors.append((str(img), str(exc)))
                continue
            names.append(str(img))
        if _should_invert(arr, invert):
            arr = 255 - arr
        arrays.append(arr)
    results: list[DigitPrediction] = []
    for start in range(0, len(arrays), batch_size):
        chunk = np.stack(arrays[start : start + batch_size]).astype(in_blob.dtype) * in_blob.dtype.type(scale)
        if in_blob.shape != chunk.shape:
            in_blob.reshape(chunk.shape)
            net.reshape()
        in_blob.data[...] = chunk
        net.forward()
        probs = np.array(net.blobs[prob_blob].data).reshape(len(chunk), -1)
        for j, p in enumerate(probs):
            results.append(DigitPrediction(names[start + j], int(np.argmax(p)), p.copy()))
    return results
