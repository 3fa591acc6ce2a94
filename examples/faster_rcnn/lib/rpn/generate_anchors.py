"""Reference anchors: every aspect ratio, then every scale, of a base_size x base_size box at (0, 0)."""

from __future__ import annotations

import numpy as np


def _shape(anchor):
    w = anchor[2] - anchor[0] + 1
    h = anchor[3] - anchor[1] + 1
    return w, h, anchor[0] + 0.5 * (w - 1), anchor[1] + 0.5 * (h - 1)


def _boxes(ws, hs, cx, cy):
    ws, hs = ws[:, None], hs[:, None]
    return np.hstack([cx - 0.5 * (ws - 1), cy - 0.5 * (hs - 1), cx + 0.5 * (ws - 1), cy + 0.5 * (hs - 1)])


def generate_anchors(base_size=16, ratios=(0.5, 1, 2), scales=2 ** np.arange(3, 6)) -> np.ndarray:
    """(len(ratios) * len(scales), 4) anchors x1, y1, x2, y2, ratio-major, all centred on the base
    box's centre. Widths for a ratio r (height / width) keep the base area: ``round(sqrt(area / r))``,
    heights ``round(width * r)`` (numpy rounding, halves to even, as the published anchors)."""
    base = np.array([0, 0, base_size - 1, base_size - 1], dtype=np.float64)
    w, h, cx, cy = _shape(base)
    ratios = np.asarray(ratios, np.float64)
    ws = np.round(np.sqrt(w * h / ratios))
    hs = np.round(ws * ratios)
    per_ratio = _boxes(ws, hs, cx, cy)
    out = []
    for a in per_ratio:
        aw, ah, acx, acy = _shape(a)
        out.append(_boxes(aw * np.asarray(scales, np.float64), ah * np.asarray(scales, np.float64), acx, acy))
    return np.vstack(out)


def shifted_anchors(anchors: np.ndarray, height: int, width: int, stride: int) -> np.ndarray:
    """All anchors of a (height, width) feature map: (height * width * A, 4), position-major
    (row by row), anchors innermost."""
    sx = np.arange(width) * stride
    sy = np.arange(height) * stride
    gx, gy = np.meshgrid(sx, sy)
    shifts = np.stack([gx.ravel(), gy.ravel(), gx.ravel(), gy.ravel()], axis=1)
    return (anchors[None, :, :] + shifts[:, None, :]).reshape(-1, 4)
