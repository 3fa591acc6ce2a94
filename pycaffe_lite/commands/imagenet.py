"""Classify color images with an ImageNet-style deploy net, as BVLC's ``python/classify.py``.

Each image is loaded as RGB in [0, 1], resized to ``images_dim`` (BVLC's default 256x256), then
either cut into BVLC's 10 crops (4 corners and the center, and their mirror images; the class scores
are averaged) or, with ``center_only``, its center crop of the net's input size. The crops go
through pycaffe's Transformer: (H, W, K) -> (K, H, W), ``channel_swap`` (BVLC's default 2,1,0: RGB
to BGR), ``raw_scale`` (default 255: pixel values 0..255), the mean subtracted (a per-channel list,
or a ``.binaryproto`` / ``.npy`` mean image: one larger than the crop is center-cropped, as Caffe's
data layer does; one of another size is reduced to its per-channel means), then ``input_scale``.
Labels come from a text file with one line per class (e.g. ``synset_words.txt``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import io as caffe_io
from ..classifier import Classifier
from ..errors import CaffeError, DataError, NetError
from ..proto.protoio import check_regular_file, read_binary
from ..schema import caffe_pb2


@dataclass
class Prediction:
    source: str
    scores: np.ndarray  # (num_classes,) the averaged output
    top: list[tuple[int, float]]  # (class, score) best first


def load_mean(spec: str, channels: int, crop: Sequence[int]) -> np.ndarray:
    """A mean for the Transformer from ``spec``: "104,117,123" (per channel), or a ``.npy`` /
    ``.binaryproto`` mean image (K, H, W) fitted to ``crop`` (center-cropped when larger, reduced to
    per-channel means otherwise)."""

    if not os.path.exists(spec) and all(part.strip() for part in spec.split(",")):
        try:
            values = np.array([float(v) for v in spec.split(",")], np.float32)
        except ValueError:
            raise DataError(f"mean '{spec}': neither a file nor comma-separated numbers") from None
        if len(values) == 1:
            values = np.repeat(values, channels)
        if len(values) != channels:
            raise DataError(f"mean '{spec}': {len(values)} values for a net input of {channels} channels")
        return values
    check_regular_file(spec, "mean file", DataError)
    if spec.endswith(".npy"):
        try:
            mean = np.load(spec, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DataError(f"{spec}: cannot read the mean as a .npy array: {exc}") from None
    else:
        blob = read_binary(spec, caffe_pb2.BlobProto(), "mean file (binaryproto)")
        mean = caffe_io.blobproto_to_array(blob)
        if mean.ndim == 4:
            mean = mean[0]
    mean = np.asarray(mean, np.float32)
    if mean.ndim == 1:
        return mean
    if mean.ndim == 2:
        mean = mean[None]
    if mean.ndim != 3 or mean.shape[0] != channels:
        raise DataError(f"{spec}: mean of shape {mean.shape} does not fit a net input of {channels} channels")
    h, w = int(crop[0]), int(crop[1])
    if mean.shape[1:] == (h, w):
        return mean
    if mean.shape[1] >= h and mean.shape[2] >= w:
        top, left = (mean.shape[1] - h) // 2, (mean.shape[2] - w) // 2
        return np.ascontiguousarray(mean[:, top:top + h, left:left + w])
    return mean.reshape(channels, -1).mean(1)


def load_labels(path: str) -> list[str]:
    check_regular_file(path, "labels file", DataError)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return [line.rstrip("\n") for line in fh]
    except OSError as exc:
        raise DataError(f"{path}: cannot read the labels file: {exc.strerror}") from None


def classify_images(
    model: str | os.PathLike,
    weights: str | os.PathLike,
    images: Sequence[str | os.PathLike],
    *,
    images_dim: Sequence[int] = (256, 256),
    mean: str | None = None,
    raw_scale: float | None = 255.0,
    input_scale: float | None = None,
    channel_swap: Sequence[int] | None = (2, 1, 0),
    center_only: bool = False,
    top_k: int = 5,
    allow_missing: bool = False,
    errors: list[tuple[str, str]] | None = None,
) -> list[Prediction]:
    """Class scores and the ``top_k`` classes of each image (see the module docstring). With an
    ``errors`` list, an unreadable image or one whose scores are not finite is appended there as
    (path, message) and skipped."""

    try:
        clf = Classifier(model, weights, image_dims=images_dim, raw_scale=raw_scale, input_scale=input_scale,
                         channel_swap=channel_swap, allow_missing=allow_missing)
    except ValueError as exc:  # the Transformer's option checks
        raise DataError(f"{model}: {exc}") from None
    in_ = clf.inputs[0]
    shape = clf.blobs[in_].data.shape
    if len(shape) != 4:
        raise NetError(f"net '{clf.name}': input '{in_}' has shape {shape}; expected (N, K, H, W)")
    channels, crop = shape[1], shape[2:]
    if any(int(d) < int(c) for d, c in zip(images_dim, crop)):
        raise DataError(f"images_dim {tuple(images_dim)} is smaller than the net's input {tuple(crop)}")
    if mean is not None:
        try:
            clf.transformer.set_mean(in_, load_mean(mean, channels, crop))
        except ValueError as exc:
            raise DataError(f"mean '{mean}': {exc}") from None
    results: list[Prediction] = []
    for path in images:
        try:
            img = caffe_io.load_image(path, color=channels == 3)
            scores = clf.predict([img], oversample=not center_only)[0]
        except (OSError, CaffeError) as exc:
            if errors is None:
                raise
            errors.append((str(path), str(exc)))
            continue
        if not np.isfinite(scores).all():
            msg = (f"{path}: the net's scores are not finite ({int((~np.isfinite(scores)).sum())} of {scores.size} "
                   "are NaN or infinite): the weights or the image hold NaN/Inf values")
            if errors is None:
                raise NetError(msg)
            errors.append((str(path), msg))
            continue
        order = np.argsort(-scores, kind="stable")[: max(1, top_k)]
        results.append(Prediction(str(path), scores, [(int(i), float(scores[i])) for i in order]))
    return results
