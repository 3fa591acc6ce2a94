"""Greedy NMS in numpy (see the package docstring for the conventions)."""

from __future__ import annotations

import numpy as np


def score_order(scores: np.ndarray) -> np.ndarray:
    """Indices by descending score, ties in index order."""
    return np.argsort(-np.asarray(scores, np.float64).ravel(), kind="stable")


def cpu_nms(boxes, scores, threshold: float) -> np.ndarray:
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    order = score_order(scores)
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        rest = order[1:]
        w = np.maximum(0.0, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]) + 1)
        h = np.maximum(0.0, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]) + 1)
        inter = w * h
        iou = inter / (areas[i] + areas[rest] - inter)
        order = rest[iou <= threshold]
    return np.array(keep, dtype=np.int64)
