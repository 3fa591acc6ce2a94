"""Classifier: a Net for image classification with resizing, center crop or 10-crop
oversampling (BVLC's ``caffe.Classifier``)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from . import io as caffe_io
from .common import TEST
from .net import Net


def input_transformer(net: Net, mean: np.ndarray | None, input_scale: float | None, raw_scale: float | None,
                      channel_swap: Sequence[int] | None) -> caffe_io.Transformer:
    """The Transformer of ``net``'s first input as pycaffe's Classifier and Detector set it up:
    (H, W, K) images to (K, H, W), then each option that is given."""
    in_ = net.inputs[0]
    transformer = caffe_io.Transformer({in_: net.blobs[in_].data.shape})
    transformer.set_transpose(in_, (2, 0, 1))
    if mean is not None:
        transformer.set_mean(in_, mean)
    if input_scale is not None:
        transformer.set_input_scale(in_, input_scale)
    if raw_scale is not None:
        transformer.set_raw_scale(in_, raw_scale)
    if channel_swap is not None:
        transformer.set_channel_swap(in_, channel_swap)
    return transformer


class Classifier(Net):
    """``Classifier(model_file, pretrained_file, image_dims=None, mean=None, input_scale=None,
    raw_scale=None, channel_swap=None, allow_missing=False)``: a TEST-phase net whose first input
    takes images. ``pretrained_file`` must hold weights for every learnable layer unless
    ``allow_missing``.

    ``image_dims`` (H, W): size images are resized to before cropping (default: the net's input
    size). ``mean``, ``input_scale``, ``raw_scale``, ``channel_swap`` configure ``self.transformer``.
    """

    def __init__(
        self,
        model_file: str | os.PathLike,
        pretrained_file: str | os.PathLike | None,
        image_dims: Sequence[int] | None = None,
        mean: np.ndarray | None = None,
        input_scale: float | None = None,
        raw_scale: float | None = None,
        channel_swap: Sequence[int] | None = None,
        allow_missing: bool = False,
    ) -> None:
        Net.__init__(self, model_file, TEST)
        if pretrained_file is not None:
            # weights that leave a learnable layer at its filler would classify confidently at random
            self.copy_from(pretrained_file, allow_missing=allow_missing)
        in_ = self.inputs[0]
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.crop_dims = np.array(self.blobs[in_].data.shape[2:])
        self.image_dims = np.array(image_dims) if image_dims is not None and len(image_dims) else self.crop_dims

    def predict(self, inputs: Sequence[np.ndarray], oversample: bool = True) -> np.ndarray:
        """Class scores (N, C) for N images (H, W, K): the mean over 10 crops when
        ``oversample``, else the center crop."""
        if len(inputs) == 0:
            raise ValueError("Classifier.predict needs at least one image")
        input_ = np.zeros(
            (len(inputs), int(self.image_dims[0]), int(self.image_dims[1]), inputs[0].shape[2]),
            dtype=np.float32,
        )
        for ix, in_ in enumerate(inputs):
            input_[ix] = caffe_io.resize_image(in_, self.image_dims)
        if oversample:
            input_ = caffe_io.oversample(input_, self.crop_dims)
        else:
            center = self.image_dims / 2.0
            start = (center - self.crop_dims / 2.0).astype(int)
            end = start + self.crop_dims
            input_ = input_[:, start[0] : end[0], start[1] : end[1], :]
        in_name = self.inputs[0]
        caffe_in = np.zeros(np.array(input_.shape)[[0, 3, 1, 2]], dtype=np.float32)
        for ix, in_ in enumerate(input_):
            caffe_in[ix] = self.transformer.preprocess(in_name, in_)
        out = self.forward_all(**{in_name: caffe_in})
        predictions = out[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1)).mean(1)
        return predictions
