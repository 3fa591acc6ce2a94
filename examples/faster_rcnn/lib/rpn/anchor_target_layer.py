"""AnchorTargetLayer: RPN training targets (py-faster-rcnn's rpn.anchor_target_layer, rewritten).

Bottoms: ``rpn_cls_score`` (1, 2A, H, W) (only its size is read), ``gt_boxes`` (G, 5) = x1, y1, x2,
y2, class, ``im_info`` (1, 3), ``data``. Tops: ``rpn_labels`` (1, 1, A*H, W) (1 object, 0
background, -1 ignored), ``rpn_bbox_targets``, ``rpn_bbox_inside_weights`` and
``rpn_bbox_outside_weights`` (1, 4A, H, W). Anchors must lie inside the image (``allowed_border``,
default 0). An anchor is background below ``RPN_NEGATIVE_OVERLAP`` IoU with every ground-truth box,
object at ``RPN_POSITIVE_OVERLAP`` or above, and each ground-truth box's best anchors are objects;
then at most ``RPN_FG_FRACTION * RPN_BATCHSIZE`` objects and ``RPN_BATCHSIZE`` examples in all are
kept, chosen at random (``numpy.random``). Outside weights are ``1 / examples`` (``RPN_POSITIVE_WEIGHT``
< 0) or split between the classes by that weight.
"""

from __future__ import annotations

import numpy as np
from fast_rcnn.bbox_transform import bbox_overlaps, bbox_transform
from fast_rcnn.config import cfg, parse_param_str

import pycaffe_lite as caffe

from .generate_anchors import generate_anchors, shifted_anchors


class AnchorTargetLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = parse_param_str(self.param_str)
        self._anchors = generate_anchors(scales=np.asarray(params.get("scales", (8, 16, 32)), np.float64))
        self._num_anchors = self._anchors.shape[0]
        self._feat_stride = int(params["feat_stride"])
        self._allowed_border = params.get("allowed_border", 0)
        height, width = bottom[0].data.shape[-2:]
        a = self._num_anchors
        top[0].reshape(1, 1, a * height, width)
        for t in top[1:4]:
            t.reshape(1, a * 4, height, width)

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        opts = cfg.TRAIN
        height, width = bottom[0].data.shape[-2:]
        gt_boxes = np.asarray(bottom[1].data, np.float64).reshape(-1, 5)
        im_info = np.asarray(bottom[2].data)[0]
        a = self._num_anchors
        all_anchors = shifted_anchors(self._anchors, height, width, self._feat_stride)
        total = all_anchors.shape[0]
        b = self._allowed_border
        inside = np.flatnonzero((all_anchors[:, 0] >= -b) & (all_anchors[:, 1] >= -b)
                                & (all_anchors[:, 2] < im_info[1] + b) & (all_anchors[:, 3] < im_info[0] + b))
        anchors = all_anchors[inside]
        labels = np.full(len(inside), -1.0)
        if len(gt_boxes) and len(inside):
            overlaps = bbox_overlaps(anchors, gt_boxes[:, :4])
            argmax = overlaps.argmax(axis=1)
            max_overlaps = overlaps[np.arange(len(inside)), argmax]
            gt_max = overlaps.max(axis=0)
            best_for_gt = np.flatnonzero((overlaps == gt_max[None, :]).any(axis=1) & (overlaps.max(axis=1) > 0))
        else:
            argmax = np.zeros(len(inside), np.int64)
            max_overlaps = np.zeros(len(inside))
            best_for_gt = np.zeros(0, np.int64)
        if not opts.RPN_CLOBBER_POSITIVES:
            labels[max_overlaps < opts.RPN_NEGATIVE_OVERLAP] = 0
        labels[best_for_gt] = 1
        labels[max_overlaps >= opts.RPN_POSITIVE_OVERLAP] = 1
        if opts.RPN_CLOBBER_POSITIVES:
            labels[max_overlaps < opts.RPN_NEGATIVE_OVERLAP] = 0
        num_fg = int(opts.RPN_FG_FRACTION * opts.RPN_BATCHSIZE)
        fg = np.flatnonzero(labels == 1)
        if len(fg) > num_fg:
            labels[np.random.choice(fg, size=len(fg) - num_fg, replace=False)] = -1
        num_bg = opts.RPN_BATCHSIZE - int(np.sum(labels == 1))
        bg = np.flatnonzero(labels == 0)
        if len(bg) > num_bg:
            labels[np.random.choice(bg, size=len(bg) - num_bg, replace=False)] = -1

        targets = np.zeros((len(inside), 4))
        if len(gt_boxes) and len(inside):
            targets = bbox_transform(anchors, gt_boxes[argmax, :4])
        inside_w = np.zeros((len(inside), 4))
        inside_w[labels == 1] = opts.RPN_BBOX_INSIDE_WEIGHTS
        outside_w = np.zeros((len(inside), 4))
        if opts.RPN_POSITIVE_WEIGHT < 0:
            examples = max(int(np.sum(labels >= 0)), 1)
            pos_w = neg_w = 1.0 / examples
        else:
            pos_w = opts.RPN_POSITIVE_WEIGHT / max(np.sum(labels == 1), 1)
            neg_w = (1.0 - opts.RPN_POSITIVE_WEIGHT) / max(np.sum(labels == 0), 1)
        outside_w[labels == 1] = pos_w
        outside_w[labels == 0] = neg_w

        def unmap(values, fill):
            out = np.full((total,) + values.shape[1:], fill, np.float64)
            out[inside] = values
            return out

        labels = unmap(labels, -1).reshape(1, height, width, a).transpose(0, 3, 1, 2)
        top[0].reshape(1, 1, a * height, width)
        top[0].data[...] = labels.reshape(1, 1, a * height, width)
        for t, v in zip(top[1:4], (targets, inside_w, outside_w)):
            t.reshape(1, a * 4, height, width)
            t.data[...] = unmap(v, 0).reshape(1, height, width, a * 4).transpose(0, 3, 1, 2)

    def backward(self, top, propagate_down, bottom):
        pass
