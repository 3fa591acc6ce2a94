"""Box arithmetic in Fast R-CNN's pixel convention (a box [x1, y1, x2, y2] is x2 - x1 + 1 wide)."""

from __future__ import annotations

import numpy as np


def _centres(boxes):
    w = boxes[:, 2] - boxes[:, 0] + 1.0
    h = boxes[:, 3] - boxes[:, 1] + 1.0
    return w, h, boxes[:, 0] + 0.5 * w, boxes[:, 1] + 0.5 * h


def bbox_transform(ex_rois: np.ndarray, gt_rois: np.ndarray) -> np.ndarray:
    """Regression targets (dx, dy, dw, dh) taking each ``ex_rois`` box to its ``gt_rois`` box."""
    ew, eh, ex, ey = _centres(ex_rois)
    gw, gh, gx, gy = _centres(gt_rois)
    return np.stack([(gx - ex) / ew, (gy - ey) / eh, np.log(gw / ew), np.log(gh / eh)], axis=1)


def bbox_transform_inv(boxes: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """Apply deltas (N, 4k) (k classes) to boxes (N, 4); returns (N, 4k) boxes."""
    if boxes.shape[0] == 0:
        return np.zeros((0, deltas.shape[1]), deltas.dtype)
    w, h, cx, cy = _centres(boxes.astype(deltas.dtype, copy=False))
    dx, dy, dw, dh = deltas[:, 0::4], deltas[:, 1::4], deltas[:, 2::4], deltas[:, 3::4]
    px = dx * w[:, None] + cx[:, None]
    py = dy * h[:, None] + cy[:, None]
    pw = np.exp(dw) * w[:, None]
    ph = np.exp(dh) * h[:, None]
    out = np.zeros(deltas.shape, deltas.dtype)
    out[:, 0::4] = px - 0.5 * pw
    out[:, 1::4] = py - 0.5 * ph
    out[:, 2::4] = px + 0.5 * pw
    out[:, 3::4] = py + 0.5 * ph
    return out


def clip_boxes(boxes: np.ndarray, im_shape) -> np.ndarray:
    """Clip (N, 4k) boxes to an image of shape (height, width, ...), in place; returns them."""
    h, w = im_shape[0], im_shape[1]
    boxes[:, 0::4] = np.clip(boxes[:, 0::4], 0, w - 1)
    boxes[:, 1::4] = np.clip(boxes[:, 1::4], 0, h - 1)
    boxes[:, 2::4] = np.clip(boxes[:, 2::4], 0, w - 1)
    boxes[:, 3::4] = np.clip(boxes[:, 3::4], 0, h - 1)
    return boxes


def bbox_overlaps(boxes: np.ndarray, query: np.ndarray) -> np.ndarray:
    """IoU (N, K) of ``boxes`` (N, 4) with ``query`` (K, 4) (what py-faster-rcnn builds with Cython)."""
    b = boxes.astype(np.float64)
    q = query.astype(np.float64)
    iw = np.minimum(b[:, None, 2], q[None, :, 2]) - np.maximum(b[:, None, 0], q[None, :, 0]) + 1
    ih = np.minimum(b[:, None, 3], q[None, :, 3]) - np.maximum(b[:, None, 1], q[None, :, 1]) + 1
    inter = np.clip(iw, 0, None) * np.clip(ih, 0, None)
    area_b = (b[:, 2] - b[:, 0] + 1) * (b[:, 3] - b[:, 1] + 1)
    area_q = (q[:, 2] - q[:, 0] + 1) * (q[:, 3] - q[:, 1] + 1)
    union = area_b[:, None] + area_q[None, :] - inter
    return np.where(inter > 0, inter / np.where(union > 0, union, 1), 0.0)
