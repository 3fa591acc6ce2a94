"""DetectionOutput (SSD fork, weiliu89/caffe): decode, per-class NMS and keep_top_k.

Bottoms: location predictions ``(N, P·L·4)`` (L = 1 with ``share_location``, else num_classes;
layout ``[prior][loc class][4]``), confidences ``(N, P·C)`` (``[prior][class]``, already
softmaxed), priors ``(1, 2, P·4)`` (PriorBox's top: boxes, then variances); extra axes of the first
two bottoms are allowed as long as their counts per sample fit. Top ``(1, 1, D, 7)``: one row
``[image, label, score, xmin, ymin, xmax, ymax]`` per detection, images in order, labels ascending
within an image, scores descending within a label; with no detection at all, one row per image
``[i, -1, -1, -1, -1, -1, -1]``.

Per image and non-background class: boxes decoded with ``code_type`` (not clipped), candidates
with score > ``confidence_threshold``, the ``nms_param.top_k`` best of them, greedy NMS with
``nms_threshold`` and ``eta``; then, when the image has more than ``keep_top_k`` detections, only
the ``keep_top_k`` highest-scoring ones over all classes stay (ties: lower class, then NMS order).
The fork's file-saving options (``save_output_param``, ``visualize``) are accepted and ignored.

``clip`` (OpenCV's SSD face detector): the decoded boxes are clamped to [0, 1] before NMS (and so in
the top). ``use_polygon`` (TextBoxes++): 12 location values per prior and location class, the box's
4 then 8 quadrilateral offsets ``(x1, y1, ..., x4, y4)``, each corner decoded against the prior's
corner (top-left, top-right, bottom-right, bottom-left: ``x = corner_x + var[0]·dx·prior_width``,
``y = corner_y + var[1]·dy·prior_height``; CENTER_SIZE with variances in the priors only, the one
coding TextBoxes++ decodes); NMS runs on the boxes, and each top row has 15 values, the 7 above and
the quadrilateral. These two run on the host in GPU mode.

GPU: decoding and the selection run on the device (``bbox.cu``: one block per image and class
for threshold, top_k and NMS, one block per image for keep_top_k); the host reads the kept
counts once per batch to size the top. The result equals the CPU path's.
"""

from __future__ import annotations

import logging

import numpy as np

from pycaffe_lite import bbox
from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, Traits, register_layer

log = logging.getLogger("pycaffe_lite")


@register_layer("DetectionOutput")
class DetectionOutputLayer(Layer):
    traits = Traits()  # its output size depends on the data (host reads): never captured
    exact_num_bottom_blobs = 3
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.detection_output_param
        if not p.HasField("num_classes"):
            raise self.error("detection_output_param.num_classes is required")
        self.num_classes = p.num_classes
        if self.num_classes < 1:
            raise self.error("num_classes must be at least 1")
        self.share_location = p.share_location
        self.num_loc_classes = 1 if self.share_location else self.num_classes
        self.background = p.background_label_id
        self.code_type = p.code_type
        self.variance_in_target = p.variance_encoded_in_target
        self.keep_top_k = p.keep_top_k
        self.confidence_threshold = p.confidence_threshold if p.HasField("confidence_threshold") \
            else -float(np.finfo(np.float32).max)
        self.nms_threshold = p.nms_param.nms_threshold
        if self.nms_threshold < 0:
            raise self.error(f"nms_threshold must be non-negative, got {self.nms_threshold}")
        self.eta = p.nms_param.eta
        if not 0 < self.eta <= 1:
            raise self.error(f"nms_param.eta must be in (0, 1], got {self.eta}")
        self.top_k = p.nms_param.top_k if p.nms_param.HasField("top_k") else -1
        self.clip = p.clip
        self.use_polygon = p.use_polygon
        if self.use_polygon and (self.code_type != bbox.CENTER_SIZE or self.variance_in_target):
            raise self.error("use_polygon decodes quadrilaterals for code_type CENTER_SIZE with "
                             "variance_encoded_in_target false only (as TextBoxes++)")
        self.loc_values = 12 if self.use_polygon else 4
        self.row = 15 if self.use_polygon else 7
        self._gpu_state: dict = {}
        self.scratch = Blob((), self.dtype)

    def reshape(self, bottom, top):
        num = bottom[0].shape[0] if bottom[0].num_axes else 0
        if bottom[1].shape[0] != num:
            raise self.error(f"location bottom has {num} images but confidence bottom "
                             f"{bottom[1].shape[0]} (shapes {bottom[0].shape} and {bottom[1].shape})")
        if bottom[2].num_axes < 3 or bottom[2].shape[1] != 2 or bottom[2].shape[2] % 4:
            raise self.error(f"prior bottom must be (1, 2, P*4) as PriorBox writes, got {bottom[2].shape}")
        self.num_priors = bottom[2].shape[2] // 4
        per = self.loc_values
        if bottom[0].count_range(1) != self.num_priors * self.num_loc_classes * per:
            raise self.error(f"location bottom {bottom[0].shape} has {bottom[0].count_range(1)} values per "
                             f"image; {self.num_priors} priors x {self.num_loc_classes} location classes x {per} "
                             f"needs {self.num_priors * self.num_loc_classes * per}"
                             + ("" if self.use_polygon else
                                " (12 per prior: TextBoxes++'s quadrilaterals need use_polygon: true)"
                                if bottom[0].count_range(1) == self.num_priors * self.num_loc_classes * 12 else ""))
        if bottom[1].count_range(1) != self.num_priors * self.num_classes:
            raise self.error(f"confidence bottom {bottom[1].shape} has {bottom[1].count_range(1)} values per "
                             f"image; {self.num_priors} priors x {self.num_classes} classes needs "
                             f"{self.num_priors * self.num_classes}")
        top[0].reshape((1, 1, 1, self.row))

    # -- the fork's algorithm on the host -----------------------------------------------------
    def _loc(self, bottom) -> np.ndarray:
        num = bottom[0].shape[0]
        loc = bottom[0].cpu_data().reshape(num, self.num_priors, self.num_loc_classes, self.loc_values)
        return np.moveaxis(loc, 2, 1)  # [N, L, P, 4 or 12]

    def _decoded(self, bottom):
        prior = bottom[2].cpu_data().reshape(2, -1, 4)
        return bbox.decode(prior[0], prior[1], self._loc(bottom)[..., :4], self.code_type, self.variance_in_target,
                           clip_boxes=self.clip)

    def _quads(self, bottom) -> np.ndarray:
        """TextBoxes++'s quadrilaterals ``[N, L, P, 8]``: corner k of the prior plus its offset
        scaled by the variance and the prior's size (corners clockwise from the top-left)."""
        prior = bottom[2].cpu_data().reshape(2, -1, 4).astype(np.float64)
        box, var = prior[0], prior[1]
        pw, ph = box[:, 2] - box[:, 0], box[:, 3] - box[:, 1]
        corners = box[:, [0, 1, 2, 1, 2, 3, 0, 3]]  # (x1, y1) top-left ... (x4, y4) bottom-left
        scale = np.stack([var[:, 0] * pw, var[:, 1] * ph] * 4, axis=-1)
        return (corners + self._loc(bottom)[..., 4:] * scale).astype(self.dtype)

    def select(self, boxes: np.ndarray, conf: np.ndarray) -> list[dict[int, list[int]]]:
        """Kept prior indices per image and label: boxes ``[N, L, P, 4]``, conf ``[N, P, C]``."""
        results = []
        for i in range(conf.shape[0]):
            indices: dict[int, list[int]] = {}
            num_det = 0
            for c in range(self.num_classes):
                if c == self.background:
                    continue
                b = boxes[i, 0 if self.share_location else c]
                kept = bbox.nms(b, conf[i, :, c], self.confidence_threshold, self.nms_threshold,
                                self.eta, self.top_k)
                indices[c] = kept
                num_det += len(kept)
            if -1 < self.keep_top_k < num_det:
                pairs = [(conf[i, j, c], c, j) for c in sorted(indices) for j in indices[c]]
                order = sorted(range(len(pairs)), key=lambda k: -pairs[k][0])[: self.keep_top_k]
                new: dict[int, list[int]] = {}
                for k in order:
                    new.setdefault(pairs[k][1], []).append(pairs[k][2])
                indices = new
            results.append(indices)
        return results

    def write_top(self, top, boxes, conf, results, quads: np.ndarray | None = None) -> None:
        num = conf.shape[0]
        rows = []
        for i, indices in enumerate(results):
            for c in sorted(indices):
                loc = 0 if self.share_location else c
                b = boxes[i, loc]
                for j in indices[c]:
                    rows.append([i, c, conf[i, j, c], *b[j]] + ([] if quads is None else list(quads[i, loc, j])))
        if not rows:
            log.info("layer '%s': no detections", self.name)
            out = np.full((num, self.row), -1.0)
            out[:, 0] = np.arange(num)
        else:
            out = np.asarray(rows, np.float64)
        top[0].reshape((1, 1, len(out), self.row))
        top[0].mutable_cpu_data()[...] = out.reshape(top[0].shape)

    def forward_cpu(self, bottom, top):
        num = bottom[0].shape[0]
        boxes = self._decoded(bottom)
        conf = bottom[1].cpu_data().reshape(num, self.num_priors, self.num_classes)
        self.write_top(top, boxes, conf, self.select(boxes, conf), self._quads(bottom) if self.use_polygon else None)

    # -- the same selection on the device (kernels in pycaffe_lite/bbox.cu) ------------------
    def forward_gpu(self, bottom, top):
        num, npri, ncls, nloc = bottom[0].shape[0], self.num_priors, self.num_classes, self.num_loc_classes
        if num == 0 or npri == 0 or self.clip or self.use_polygon:  # the kernels decode SSD's 4 values unclipped
            self.forward_cpu(bottom, top)
            return
        dt, it = self.dtype, np.dtype(np.int32).itemsize
        slots = num * ncls * npri
        (decoded, cand, kept, kept_count, offsets, ent_score, ent_key, mask, sel_count,
         row_offset) = backend.workspace(num * nloc * npri * 4 * dt.itemsize, slots * it, slots * it,
                                         num * ncls * it, num * (ncls + 1) * it, slots * dt.itemsize, slots * it,
                                         slots * it, num * ncls * it, num * ncls * it)
        backend.kernel(bbox.KERNELS, "bbox_decode", dt)(num * npri * nloc, npri, nloc, int(self.code_type),
                                             int(self.variance_in_target), bottom[0].gpu_data(),
                                             bottom[2].gpu_data(), decoded)
        conf = bottom[1].gpu_data()
        backend.kernel(bbox.KERNELS, "bbox_nms", dt)(
            npri, ncls, nloc, self.background, self.confidence_threshold, self.nms_threshold, self.eta,
            self.top_k, decoded, conf, cand, kept, kept_count, grid=num * ncls, block=256)
        backend.kernel(bbox.KERNELS, "bbox_keep_top_k", dt)(
            npri, ncls, self.keep_top_k, conf, kept, kept_count, offsets, ent_score, ent_key, mask, sel_count,
            grid=num, block=256)
        counts = np.empty(num * ncls, np.int32)
        backend.memcpy_dtoh(counts, sel_count)  # the one read-back per batch: how many rows
        total = int(counts.sum())
        if total == 0:
            log.info("layer '%s': no detections", self.name)
            out = np.full((num, 7), -1.0)
            out[:, 0] = np.arange(num)
            top[0].reshape((1, 1, num, 7))
            top[0].mutable_cpu_data()[...] = out.reshape(top[0].shape)
            return
        starts = np.zeros(num * ncls, np.int32)
        starts[1:] = np.cumsum(counts)[:-1]
        backend.memcpy_htod(row_offset, starts)
        top[0].reshape((1, 1, total, 7))
        backend.kernel(bbox.KERNELS, "bbox_write_rows", dt)(
            npri, ncls, nloc, decoded, conf, kept, kept_count, mask, row_offset, top[0].mutable_gpu_data(),
            grid=num * ncls, block=32)
