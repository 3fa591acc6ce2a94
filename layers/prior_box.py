"""PriorBox (SSD fork, weiliu89/caffe): the default boxes of one feature map.

Bottoms: the feature map ``(N, C, H, W)`` and the image ``(N, C', H_img, W_img)`` (its size is used
unless ``img_size`` / ``img_h``+``img_w`` are given). Top ``(1, 2, H·W·P·4)``: channel 0 the boxes
``(xmin, ymin, xmax, ymax)`` relative to the image, channel 1 their variances. P priors per cell,
in the fork's order for each min_size: the square of side ``min_size``, then (with max_size) the
square of side ``sqrt(min_size·max_size)``, then one box per other aspect ratio r (width
``min_size·sqrt(r)``, height ``min_size/sqrt(r)``); aspect ratios are 1, then each given one not
seen yet followed by its inverse when ``flip``. As in the fork, min and max sizes are truncated
to integers before use. Cell centres ``((w + offset)·step_w, (h + offset)·step_h)`` with the step
from ``step`` / ``step_h``+``step_w`` or image size / feature size. ``clip`` clamps to [0, 1].
Variance: one value for all four coordinates, four values, or the default 0.1.
``denser_prior_boxes`` (TextBoxes++): each prior is followed by a copy moved down by half a cell, its
centre at ``(h + 1)·step_h`` (2P priors per cell).
The top depends only on shapes; GPU mode computes it on the host.
"""

from __future__ import annotations

import math

import numpy as np

from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("PriorBox")
class PriorBoxLayer(Layer):
    traits = Traits()  # CPU code only (its GPU path runs it on host copies)
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.prior_box_param
        if not p.min_size:
            raise self.error("prior_box_param needs at least one min_size")
        self.min_sizes = list(p.min_size)
        if any(s <= 0 for s in self.min_sizes):
            raise self.error(f"min_size must be positive, got {self.min_sizes}")
        self.aspect_ratios = [1.0]
        for ar in p.aspect_ratio:
            if ar <= 0:
                raise self.error(f"aspect_ratio must be positive, got {ar}")
            if any(abs(ar - a) < 1e-6 for a in self.aspect_ratios):
                continue
            self.aspect_ratios.append(ar)
            if p.flip:
                self.aspect_ratios.append(1.0 / ar)
        self.max_sizes = list(p.max_size)
        if self.max_sizes:
            if len(self.max_sizes) != len(self.min_sizes):
                raise self.error(f"{len(self.max_sizes)} max_size values for {len(self.min_sizes)} min_size "
                                 "values: give one per min_size or none")
            for lo, hi in zip(self.min_sizes, self.max_sizes):
                if hi <= lo:
                    raise self.error(f"max_size {hi} must be greater than min_size {lo}")
        self.num_priors = len(self.aspect_ratios) * len(self.min_sizes) + len(self.max_sizes)
        var = list(p.variance)
        if len(var) > 1 and len(var) != 4:
            raise self.error(f"give one variance or four, got {len(var)}")
        if any(v <= 0 for v in var):
            raise self.error(f"variances must be positive, got {var}")
        self.variance = var or [0.1]
        self.img_h, self.img_w = self._pair(p, "img_size", "img_h", "img_w", 0, " x ")
        self.step_h, self.step_w = self._pair(p, "step", "step_h", "step_w", 0.0, ", ")
        self.offset = p.offset
        self.clip = p.clip
        self.denser = p.denser_prior_boxes
        if self.denser:
            self.num_priors *= 2

    def _pair(self, p, single: str, h: str, w: str, default, sep: str) -> tuple:
        """The fork's ``single`` value or its ``h``/``w`` pair (not both), positive; ``default`` when
        neither is given."""
        if p.HasField(h) or p.HasField(w):
            if p.HasField(single):
                raise self.error(f"give {single} or {h}/{w}, not both")
            vh, vw = getattr(p, h), getattr(p, w)
            if vh <= 0 or vw <= 0:
                raise self.error(f"{h} and {w} must be positive, got {vh}{sep}{vw}")
            return vh, vw
        if p.HasField(single):
            if getattr(p, single) <= 0:
                raise self.error(f"{single} must be positive")
            return getattr(p, single), getattr(p, single)
        return default, default

    def reshape(self, bottom, top):
        for i, b in enumerate(bottom):
            if b.num_axes != 4:
                raise self.error(f"bottom {i} must be 4-D (N, C, H, W), got shape {b.shape}")
        h, w = bottom[0].shape[2:]
        top[0].reshape((1, 2, h * w * self.num_priors * 4))

    def priors(self, layer_h: int, layer_w: int, img_h: int, img_w: int) -> np.ndarray:
        """Boxes ``[layer_h, layer_w, P, 4]`` (before clipping), in float64."""
        if self.img_h and self.img_w:
            img_h, img_w = self.img_h, self.img_w
        if self.step_h and self.step_w:
            step_h, step_w = float(np.float32(self.step_h)), float(np.float32(self.step_w))
        else:
            step_h, step_w = float(np.float32(img_h / layer_h)), float(np.float32(img_w / layer_w))
        sizes: list[tuple[float, float]] = []  # (width, height) of each prior in a cell
        for s, min_size in enumerate(self.min_sizes):
            lo = int(min_size)
            sizes.append((lo, lo))
            if self.max_sizes:
                side = math.sqrt(lo * int(self.max_sizes[s]))
                sizes.append((side, side))
            for ar in self.aspect_ratios:
                if abs(ar - 1.0) < 1e-6:
                    continue
                sizes.append((lo * math.sqrt(ar), lo / math.sqrt(ar)))
        wh = np.array(sizes, np.float64).astype(np.float32).astype(np.float64)
        cx = ((np.arange(layer_w) + self.offset) * step_w).astype(np.float32).astype(np.float64)
        cy = ((np.arange(layer_h) + self.offset) * step_h).astype(np.float32).astype(np.float64)
        centres = [cy]
        if self.denser:  # TextBoxes++: a second prior per size, half a cell lower
            centres.append(((np.arange(layer_h) + 1.0) * step_h).astype(np.float32).astype(np.float64))
        out = np.empty((layer_h, layer_w, len(sizes), len(centres), 4))
        for k, ys in enumerate(centres):
            out[..., k, 0] = (cx[None, :, None] - wh[None, None, :, 0] / 2) / img_w
            out[..., k, 1] = (ys[:, None, None] - wh[None, None, :, 1] / 2) / img_h
            out[..., k, 2] = (cx[None, :, None] + wh[None, None, :, 0] / 2) / img_w
            out[..., k, 3] = (ys[:, None, None] + wh[None, None, :, 1] / 2) / img_h
        return out.reshape(layer_h, layer_w, len(sizes) * len(centres), 4)

    def forward_cpu(self, bottom, top):
        h, w = bottom[0].shape[2:]
        boxes = self.priors(h, w, bottom[1].shape[2], bottom[1].shape[3]).reshape(-1)
        if self.clip:
            boxes = np.clip(boxes, 0, 1)
        out = top[0].mutable_cpu_data()
        out[0, 0] = boxes
        out[0, 1] = np.tile(np.asarray(self.variance, np.float64), len(boxes) // len(self.variance))
