"""ProposalLayer: RPN outputs -> object proposals (py-faster-rcnn's rpn.proposal_layer, rewritten).

Bottoms: ``rpn_cls_prob_reshape`` (1, 2A, H, W) (background scores, then foreground), ``rpn_bbox_pred``
(1, 4A, H, W), ``im_info`` (1, 3) = [height, width, scale] of the network input. Tops: ``rois``
(R, 5) = [0, x1, y1, x2, y2] and optionally their scores (R, 1). ``param_str``: ``'feat_stride': 16``
(also ``'scales'`` and ``'ratios'`` of the anchors). Per image: decode every anchor's deltas, clip to
the image, drop boxes smaller than ``RPN_MIN_SIZE * scale``, keep the ``RPN_PRE_NMS_TOP_N`` best,
NMS at ``RPN_NMS_THRESH``, keep ``RPN_POST_NMS_TOP_N`` (cfg.TRAIN or cfg.TEST by the net's phase).
"""

from __future__ import annotations

import numpy as np
from fast_rcnn.bbox_transform import bbox_transform_inv, clip_boxes
from fast_rcnn.config import cfg, parse_param_str
from nms import nms

import pycaffe_lite as caffe

from .generate_anchors import generate_anchors, shifted_anchors


class ProposalLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = parse_param_str(self.param_str)
        self._feat_stride = int(params["feat_stride"])
        scales = np.asarray(params.get("scales", (8, 16, 32)), np.float64)
        ratios = params.get("ratios", (0.5, 1, 2))
        self._anchors = generate_anchors(scales=scales, ratios=ratios)
        self._num_anchors = self._anchors.shape[0]
        if len(bottom) != 3:
            raise ValueError("ProposalLayer needs 3 bottoms: rpn_cls_prob_reshape, rpn_bbox_pred, im_info")
        top[0].reshape(1, 5)
        if len(top) > 1:
            top[1].reshape(1, 1)

    def reshape(self, bottom, top):
        pass  # the tops are sized in forward

    def forward(self, bottom, top):
        if bottom[0].data.shape[0] != 1:
            raise ValueError("ProposalLayer: only single-image batches are supported")
        opts = cfg.TRAIN if self.phase == caffe.TRAIN else cfg.TEST
        a = self._num_anchors
        scores = np.asarray(bottom[0].data)[:, a:, :, :]
        deltas = np.asarray(bottom[1].data)
        im_info = np.asarray(bottom[2].data)[0]
        height, width = scores.shape[-2:]
        anchors = shifted_anchors(self._anchors, height, width, self._feat_stride)
        # (1, 4A, H, W) -> (H * W * A, 4) and (1, A, H, W) -> (H * W * A,): anchors innermost.
        deltas = deltas.transpose(0, 2, 3, 1).reshape(-1, 4).astype(np.float64)
        scores = scores.transpose(0, 2, 3, 1).reshape(-1).astype(np.float64)
        proposals = clip_boxes(bbox_transform_inv(anchors, deltas), im_info[:2])
        keep = _min_size(proposals, opts.RPN_MIN_SIZE * im_info[2])
        proposals, scores = proposals[keep], scores[keep]
        order = np.argsort(-scores, kind="stable")
        if opts.RPN_PRE_NMS_TOP_N > 0:
            order = order[:opts.RPN_PRE_NMS_TOP_N]
        proposals, scores = proposals[order], scores[order]
        keep = nms(proposals, scores, opts.RPN_NMS_THRESH)
        if opts.RPN_POST_NMS_TOP_N > 0:
            keep = keep[:opts.RPN_POST_NMS_TOP_N]
        proposals, scores = proposals[keep], scores[keep]
        rois = np.hstack([np.zeros((len(proposals), 1)), proposals])
        top[0].reshape(*rois.shape)
        top[0].data[...] = rois
        if len(top) > 1:
            top[1].reshape(len(scores), 1)
            top[1].data[...] = scores[:, None]

    def backward(self, top, propagate_down, bottom):
        pass  # proposals take no gradient


def _min_size(boxes, min_size):
    w = boxes[:, 2] - boxes[:, 0] + 1
    h = boxes[:, 3] - boxes[:, 1] + 1
    return np.flatnonzero((w >= min_size) & (h >= min_size))
