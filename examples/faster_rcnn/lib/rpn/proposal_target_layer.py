"""ProposalTargetLayer: sample proposals and their detection targets (py-faster-rcnn's
rpn.proposal_target_layer, rewritten).

Bottoms: ``rpn_rois`` (R, 5) and ``gt_boxes`` (G, 5). Tops: ``rois`` (B, 5), ``labels`` (B,),
``bbox_targets``, ``bbox_inside_weights``, ``bbox_outside_weights`` (B, 4 * num_classes), with
``param_str`` ``'num_classes': K``. The ground-truth boxes join the proposals; of ``BATCH_SIZE``
samples up to ``FG_FRACTION`` are objects (IoU >= ``FG_THRESH`` with a ground-truth box; labelled with
its class), the rest background (IoU in [``BG_THRESH_LO``, ``BG_THRESH_HI``); label 0), chosen at
random. Targets are normalized by ``BBOX_NORMALIZE_MEANS`` / ``STDS`` and placed in the label's four
columns, where the inside weights are ``BBOX_INSIDE_WEIGHTS`` and the outside weights 1.
"""

from __future__ import annotations

import numpy as np
from fast_rcnn.bbox_transform import bbox_overlaps, bbox_transform
from fast_rcnn.config import cfg, parse_param_str

import pycaffe_lite as caffe


class ProposalTargetLayer(caffe.Layer):
    def setup(self, bottom, top):
        self._num_classes = int(parse_param_str(self.param_str)["num_classes"])
        top[0].reshape(1, 5)
        top[1].reshape(1)
        for t in top[2:5]:
            t.reshape(1, self._num_classes * 4)

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        opts = cfg.TRAIN
        rois = np.asarray(bottom[0].data, np.float64).reshape(-1, 5)
        gt = np.asarray(bottom[1].data, np.float64).reshape(-1, 5)
        all_rois = np.vstack([rois, np.hstack([np.zeros((len(gt), 1)), gt[:, :4]])])
        per_image = opts.BATCH_SIZE // opts.IMS_PER_BATCH
        fg_per_image = int(np.round(opts.FG_FRACTION * per_image))
        if len(gt):
            overlaps = bbox_overlaps(all_rois[:, 1:5], gt[:, :4])
            assign = overlaps.argmax(axis=1)
            max_ov = overlaps.max(axis=1)
            labels = gt[assign, 4]
        else:
            assign = np.zeros(len(all_rois), np.int64)
            max_ov = np.zeros(len(all_rois))
            labels = np.zeros(len(all_rois))
        fg = np.flatnonzero(max_ov >= opts.FG_THRESH)
        n_fg = min(fg_per_image, len(fg))
        if len(fg) > n_fg:
            fg = np.random.choice(fg, size=n_fg, replace=False)
        bg = np.flatnonzero((max_ov < opts.BG_THRESH_HI) & (max_ov >= opts.BG_THRESH_LO))
        n_bg = min(per_image - n_fg, len(bg))
        if len(bg) > n_bg:
            bg = np.random.choice(bg, size=n_bg, replace=False)
        keep = np.concatenate([fg, bg]).astype(np.int64)
        labels = labels[keep].copy()
        labels[n_fg:] = 0
        sampled = all_rois[keep]
        if len(gt):
            targets = bbox_transform(sampled[:, 1:5], gt[assign[keep], :4])
        else:
            targets = np.zeros((len(keep), 4))
        if opts.BBOX_NORMALIZE_TARGETS_PRECOMPUTED:
            targets = (targets - np.array(opts.BBOX_NORMALIZE_MEANS)) / np.array(opts.BBOX_NORMALIZE_STDS)
        k = self._num_classes
        bbox_targets = np.zeros((len(keep), 4 * k))
        inside = np.zeros((len(keep), 4 * k))
        for i in np.flatnonzero(labels > 0):
            c = int(labels[i])
            bbox_targets[i, 4 * c:4 * c + 4] = targets[i]
            inside[i, 4 * c:4 * c + 4] = opts.BBOX_INSIDE_WEIGHTS
        outputs = (sampled, labels, bbox_targets, inside, (inside > 0).astype(np.float64))
        for t, v in zip(top, outputs):
            t.reshape(*v.shape)
            t.data[...] = v

    def backward(self, top, propagate_down, bottom):
        pass
