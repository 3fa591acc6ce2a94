"""DetectionEvaluate (SSD fork, weiliu89/caffe): true/false positives of detections for mAP.

Bottoms: detections ``(1, 1, D, 7)`` (DetectionOutput's top) and ground truth ``(1, 1, G, 8)``
(AnnotatedData's label top). Top ``(1, 1, K + D', 5)`` in the fork's format: first one row per
non-background class ``[-1, class, number of ground truths, -1, -1]`` (difficult ones counted only
with ``evaluate_difficult_gt``), then one row per valid detection ``[image, class, score, tp, fp]``,
per image and class in ascending order, scores descending. A detection is a true positive when
its best-overlapping ground truth of its class has overlap >= ``overlap_threshold`` and was not
claimed by a higher-scoring detection; a claimed one makes it a false positive; a difficult best
match (without ``evaluate_difficult_gt``) gives ``tp = fp = 0``. With ``name_size_file`` (lines
``name height width``, one per test image in order) boxes are compared in pixels of each
original image (overlaps count the end pixels, as the fork's), mapped back through
``resize_param`` when given. The solver's ``eval_type: "detection"`` summarises these rows into mAP
(:func:`pycaffe_lite.bbox.mean_average_precision`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite import bbox
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

RP = caffe_pb2.ResizeParameter


def _pixel_iou(a, b):
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return 0.0
    iw = min(a[2], b[2]) - max(a[0], b[0]) + 1
    ih = min(a[3], b[3]) - max(a[1], b[1]) + 1
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    sa = bbox.size(np.asarray(a, np.float32), normalized=False)
    sb = bbox.size(np.asarray(b, np.float32), normalized=False)
    return float(inter / (sa + sb - inter))


@register_layer("DetectionEvaluate")
class DetectionEvaluateLayer(Layer):
    traits = Traits()  # CPU code only (its GPU path runs it on host copies)
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.detection_evaluate_param
        if not p.HasField("num_classes"):
            raise self.error("detection_evaluate_param.num_classes is required")
        self.num_classes = p.num_classes
        self.background = p.background_label_id
        self.overlap_threshold = p.overlap_threshold
        if self.overlap_threshold <= 0:
            raise self.error(f"overlap_threshold must be positive, got {self.overlap_threshold}")
        self.evaluate_difficult = p.evaluate_difficult_gt
        self.sizes: list[tuple[int, int]] = []
        if p.HasField("name_size_file"):
            try:
                words = Path(p.name_size_file).read_text().split()
            except OSError as exc:
                raise self.error(f"cannot read name_size_file {p.name_size_file}: {exc.strerror}") from None
            self.sizes = [(int(words[k + 1]), int(words[k + 2])) for k in range(0, len(words) - 2, 3)]
        self.resize = p.resize_param if p.HasField("resize_param") else None
        self.count = 0

    def allow_force_backward(self, bottom_index: int) -> bool:
        return False

    def reshape(self, bottom, top):
        for b, width, what in ((bottom[0], 7, "detection"), (bottom[1], 8, "ground-truth")):
            if b.num_axes != 4 or b.shape[0] != 1 or b.shape[1] != 1 or b.shape[3] != width:
                raise self.error(f"{what} bottom must be (1, 1, n, {width}), got {b.shape}")
        det = bottom[0].cpu_data().reshape(-1, 7)
        num_pos_classes = self.num_classes if self.background == -1 else self.num_classes - 1
        top[0].reshape((1, 1, num_pos_classes + int((det[:, 1] != -1).sum()), 5))

    def _output_box(self, box, hw):
        """The fork's OutputBBox: a relative box in pixels of the original image of size ``hw``."""
        h, w = hw
        b = np.asarray(box, np.float32)
        r = self.resize
        if r is not None and r.resize_mode == RP.FIT_LARGE_SIZE_AND_PAD:
            aspect, raspect = w / h, r.width / r.height
            if aspect > raspect:
                pad = (r.height - r.width / aspect) / 2
                src = np.array([0, pad / r.height, 1, 1 - pad / r.height], np.float32)
            else:
                pad = (r.width - r.height * aspect) / 2
                src = np.array([pad / r.width, 0, 1 - pad / r.width, 1], np.float32)
            proj = bbox.project(src, b)
            b = proj if proj is not None else np.zeros(4, np.float32)
        elif r is not None and r.resize_mode == RP.FIT_SMALL_SIZE and r.height_scale and r.width_scale:
            s = b * np.array([r.width_scale, r.height_scale] * 2, np.float32)
            return np.clip(s, 0, np.array([w, h, w, h], np.float32))
        b = bbox.clip(b)
        return b * np.array([w, h, w, h], np.float32)

    def _gather(self, det: np.ndarray, gt_rows: np.ndarray) -> tuple[dict, dict]:
        """Detections ``{image: {label: [(score, box)]}}`` and ground truth ``{image: {label: [(box,
        difficult)]}}`` from the bottoms' rows (image -1 ends or pads them)."""
        detections: dict[int, dict[int, list]] = {}
        for r in det:
            item, label = int(r[0]), int(r[1])
            if item == -1:
                continue
            if label == self.background:
                raise self.error(f"detection of image {item} has the background label {label}")
            detections.setdefault(item, {}).setdefault(label, []).append((float(r[2]), r[3:7].astype(np.float32)))
        gts: dict[int, dict[int, list]] = {}
        for r in gt_rows:
            item = int(r[0])
            if item == -1:
                break
            label = int(r[1])
            if label == self.background:
                raise self.error(f"ground truth of image {item} has the background label {label}")
            gts.setdefault(item, {}).setdefault(label, []).append((r[3:7].astype(np.float32), bool(r[7])))
        return detections, gts

    def _match(self, item: int, label: int, dets: list, gt: list | None, hw) -> list[list]:
        """The fork's rows ``[image, label, score, tp, fp]`` of one image's detections of one label,
        matched greedily by score to the ground truth (each ground-truth box once)."""
        if gt is None:
            return [[item, label, s, 0, 1] for s, _ in dets]
        pixel = hw is not None
        gt_boxes = [self._output_box(b, hw) if pixel else b for b, _ in gt]
        visited = [False] * len(gt)
        rows = []
        for k in sorted(range(len(dets)), key=lambda k: -dets[k][0]):
            score, box = dets[k]
            box = self._output_box(box, hw) if pixel else box
            ovs = [_pixel_iou(box, g) for g in gt_boxes] if pixel else list(bbox.iou(box[None], np.stack(gt_boxes))[0])
            jmax = int(np.argmax(ovs))
            row = [item, label, score, 0, 1]
            if ovs[jmax] >= np.float32(self.overlap_threshold):
                if self.evaluate_difficult or not gt[jmax][1]:
                    if not visited[jmax]:
                        row[3:] = [1, 0]
                        visited[jmax] = True
                else:
                    row[3:] = [0, 0]
            rows.append(row)
        return rows

    def forward_cpu(self, bottom, top):
        detections, gts = self._gather(bottom[0].cpu_data().reshape(-1, 7), bottom[1].cpu_data().reshape(-1, 8))
        out = []
        num_pos: dict[int, int] = {}
        for labels in gts.values():
            for label, boxes in labels.items():
                n = len(boxes) if self.evaluate_difficult else sum(not d for _, d in boxes)
                num_pos[label] = num_pos.get(label, 0) + n
        for c in range(self.num_classes):
            if c != self.background:
                out.append([-1, c, num_pos.get(c, 0), -1, -1])
        pixel = bool(self.sizes)
        for item in sorted(detections):
            hw = self.sizes[self.count] if pixel else None
            for label in sorted(detections[item]):
                if label != -1:
                    out += self._match(item, label, detections[item][label], gts.get(item, {}).get(label), hw)
            if pixel:
                self.count = (self.count + 1) % len(self.sizes)
        top[0].reshape((1, 1, len(out), 5))
        top[0].mutable_cpu_data()[...] = np.asarray(out, np.float64).reshape(top[0].shape)
