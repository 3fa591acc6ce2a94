"""Detector: classify windows of images, optionally with context padding (BVLC's
``caffe.Detector``). Selective-search proposals (``detect_selective_search``) come, as in BVLC, from
the external ``selective_search_ijcv_with_python`` module, which runs MATLAB."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np

from . import io as caffe_io
from .classifier import input_transformer
from .common import TEST
from .errors import MissingDependencyError
from .net import Net


class Detector(Net):
    """``Detector(model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None,
    channel_swap=None, context_pad=None)``. Windows are (ymin, xmin, ymax, xmax) in pixels."""

    def __init__(
        self,
        model_file: str | os.PathLike,
        pretrained_file: str | os.PathLike | None,
        mean: np.ndarray | None = None,
        input_scale: float | None = None,
        raw_scale: float | None = None,
        channel_swap: Sequence[int] | None = None,
        context_pad: int | None = None,
    ) -> None:
        Net.__init__(self, model_file, pretrained_file, TEST)
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows: Iterable[tuple[str, Sequence[Sequence[int]]]]) -> list[dict]:
        """Classify each window of each image (file name, list of windows), warped to the net's
        input size. Returns [{'window', 'prediction', 'filename'}] in input order."""
        listed = [(fname, [np.asarray(w) for w in windows]) for fname, windows in images_windows]
        window_inputs = []
        for fname, windows in listed:
            image = caffe_io.load_image(fname).astype(np.float32)
            for window in windows:
                window_inputs.append(self.crop(image, window))
        if not window_inputs:
            return []
        in_ = self.inputs[0]
        in_dims = self.blobs[in_].data.shape[2:]
        caffe_in = np.zeros((len(window_inputs), window_inputs[0].shape[2]) + tuple(in_dims), dtype=np.float32)
        for ix, window_in in enumerate(window_inputs):
            caffe_in[ix] = self.transformer.preprocess(in_, window_in)
        out = self.forward_all(**{in_: caffe_in})
        predictions = out[self.outputs[0]]
        predictions = predictions.reshape(len(predictions), -1)
        detections = []
        ix = 0
        for fname, windows in listed:
            for window in windows:
                detections.append({"window": window, "prediction": predictions[ix], "filename": fname})
                ix += 1
        return detections

    def detect_selective_search(self, image_fnames: Iterable[str | os.PathLike]) -> list[dict]:
        """Propose windows with selective search, then :meth:`detect_windows` on them (BVLC's R-CNN path).

        The proposals come from the external Python module ``selective_search_ijcv_with_python``
        (its ``get_windows(files, cmd='selective_search_rcnn')`` runs MATLAB); without it a
        MissingDependencyError says what to install. Paths are made absolute for MATLAB.
        """
        try:
            import selective_search_ijcv_with_python as selective_search  # type: ignore[import-not-found]
        except ImportError:
            raise MissingDependencyError(
                "Detector.detect_selective_search needs the external 'selective_search_ijcv_with_python' module "
                "(https://github.com/sergeyk/selective_search_ijcv_with_python, on PYTHONPATH) and MATLAB "
                "to run it; or compute windows yourself and call detect_windows([(filename, windows), ...])"
            ) from None
        files = [os.path.abspath(f) for f in image_fnames]
        windows = selective_search.get_windows(files, cmd="selective_search_rcnn")
        return self.detect_windows(zip(files, windows))

    def crop(self, im: np.ndarray, window: Sequence[int] | np.ndarray) -> np.ndarray:
        """The window of ``im``; with ``context_pad`` the window grows so that, once warped to the
        net's input size, ``context_pad`` pixels of context surround it (mean-filled off-image)."""
        window = np.asarray(window)
        crop = im[int(window[0]) : int(window[2]), int(window[1]) : int(window[3])]
        if not self.context_pad:
            return crop
        crop_size = self.blobs[self.inputs[0]].width  # square inputs assumed, as in Caffe
        scale = crop_size / (1.0 * crop_size - self.context_pad * 2)
        half_h = (window[2] - window[0] + 1) / 2.0
        half_w = (window[3] - window[1] + 1) / 2.0
        center = (window[0] + half_h, window[1] + half_w)
        box = np.round(np.tile(center, 2) + scale * np.array((-half_h, -half_w, half_h, half_w)))
        scale_h = crop_size / (box[2] - box[0] + 1)
        scale_w = crop_size / (box[3] - box[1] + 1)
        pad_y = int(round(max(0, -box[0]) * scale_h))  # context falling off the image
        pad_x = int(round(max(0, -box[1]) * scale_w))
        im_h, im_w = im.shape[:2]
        box = np.clip(box, 0.0, [im_h, im_w, im_h, im_w])
        clip_h, clip_w = box[2] - box[0] + 1, box[3] - box[1] + 1
        if clip_h <= 0 or clip_w <= 0:
            raise ValueError(f"window {tuple(window)} lies outside the image ({im_h}x{im_w})")
        crop_h = min(int(round(clip_h * scale_h)), crop_size - pad_y)
        crop_w = min(int(round(clip_w * scale_w)), crop_size - pad_x)
        context = im[int(box[0]) : int(box[2]), int(box[1]) : int(box[3])]
        context = caffe_io.resize_image(context, (crop_h, crop_w))
        out = np.ones(self.crop_dims, dtype=np.float32) * self.crop_mean
        out[pad_y : pad_y + crop_h, pad_x : pad_x + crop_w] = context
        return out

    def configure_crop(self, context_pad: int | None) -> None:
        """Crop size (H, W, K) from the net input, and the mean in image space for padding."""
        in_ = self.inputs[0]
        transpose = self.transformer.transpose[in_]
        inv_transpose = np.argsort(transpose)
        self.crop_dims = np.array(self.blobs[in_].data.shape[1:])[inv_transpose]
        self.context_pad = context_pad
        if not context_pad:
            return
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = np.zeros(self.crop_dims, dtype=np.float32)
            return
        crop_mean = np.broadcast_to(mean, self.blobs[in_].data.shape[1:]).transpose(inv_transpose).copy()
        channel_swap = self.transformer.channel_swap.get(in_)
        if channel_swap is not None:
            crop_mean = crop_mean[:, :, np.argsort(channel_swap)]
        raw_scale = self.transformer.raw_scale.get(in_)
        if raw_scale is not None:
            crop_mean = crop_mean / raw_scale
        self.crop_mean = crop_mean.astype(np.float32)
