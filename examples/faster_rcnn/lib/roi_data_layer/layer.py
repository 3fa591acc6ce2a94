"""RoIDataLayer: one image per iteration with its ground-truth boxes (py-faster-rcnn's
roi_data_layer.layer for the end-to-end (RPN) recipe, rewritten).

Tops: ``data`` (1, 3, H, W) (BGR minus ``cfg.PIXEL_MEANS``, scaled so the short side is one of
``cfg.TRAIN.SCALES`` and the long side at most ``MAX_SIZE``), ``im_info`` (1, 3) = [H, W, scale],
``gt_boxes`` (G, 5) = scaled x1, y1, x2, y2, class. ``param_str``: ``'num_classes': K``. Give it a
roidb with :meth:`set_roidb`: a list of dicts with ``image`` (an HxWx3 BGR uint8 array or a file
name), ``boxes`` (G, 4) pixels, ``gt_classes`` (G,) and optionally ``flipped``. Images are visited in
a random order, reshuffled after each pass (``numpy.random``).
"""

from __future__ import annotations

import numpy as np
from fast_rcnn.config import cfg, parse_param_str

import pycaffe_lite as caffe


def prep_image(im: np.ndarray, target: int, max_size: int) -> tuple[np.ndarray, float]:
    """Mean-subtracted float image resized as Fast R-CNN does, and the scale applied."""
    im = im.astype(np.float32) - cfg.PIXEL_MEANS.astype(np.float32)
    short, long = min(im.shape[:2]), max(im.shape[:2])
    scale = float(target) / short
    if round(scale * long) > max_size:
        scale = float(max_size) / long
    size = (int(round(im.shape[0] * scale)), int(round(im.shape[1] * scale)))
    return caffe.io.resize(im, *size).astype(np.float32), scale


class RoIDataLayer(caffe.Layer):
    def setup(self, bottom, top):
        self._num_classes = int(parse_param_str(self.param_str).get("num_classes", 21))
        self._roidb: list[dict] = []
        self._perm = np.zeros(0, np.int64)
        self._cur = 0
        top[0].reshape(1, 3, max(cfg.TRAIN.SCALES), cfg.TRAIN.MAX_SIZE)
        top[1].reshape(1, 3)
        if len(top) > 2:
            top[2].reshape(1, 5)

    def set_roidb(self, roidb):
        self._roidb = list(roidb)
        self._shuffle()

    def _shuffle(self):
        self._perm = np.random.permutation(len(self._roidb))
        self._cur = 0

    def _next(self) -> dict:
        if not self._roidb:
            raise RuntimeError("RoIDataLayer: no roidb (call net.layers[i].set_roidb(roidb) first)")
        if self._cur >= len(self._roidb):
            self._shuffle()
        entry = self._roidb[self._perm[self._cur]]
        self._cur += 1
        return entry

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        entry = self._next()
        im = entry["image"]
        if isinstance(im, str):
            im = caffe.io.load_image(im)[:, :, ::-1] * 255.0  # RGB in [0, 1] -> BGR 0..255
        im = np.asarray(im)
        boxes = np.asarray(entry["boxes"], np.float64).reshape(-1, 4).copy()
        if entry.get("flipped"):
            im = im[:, ::-1]
            w = im.shape[1]
            boxes[:, [0, 2]] = w - boxes[:, [2, 0]] - 1
        target = cfg.TRAIN.SCALES[np.random.randint(len(cfg.TRAIN.SCALES))]
        blob, scale = prep_image(im, target, cfg.TRAIN.MAX_SIZE)
        data = blob.transpose(2, 0, 1)[None]
        top[0].reshape(*data.shape)
        top[0].data[...] = data
        top[1].reshape(1, 3)
        top[1].data[...] = [[data.shape[2], data.shape[3], scale]]
        if len(top) > 2:
            gt = np.hstack([boxes * scale, np.asarray(entry["gt_classes"], np.float64).reshape(-1, 1)])
            top[2].reshape(*gt.shape)
            top[2].data[...] = gt

    def backward(self, top, propagate_down, bottom):
        pass
