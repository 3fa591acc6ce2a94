"""MultiBoxLoss (SSD fork, weiliu89/caffe): SSD's training loss, matching + mining + two losses.

Bottoms: location predictions ``(N, P·L·4)`` (L = 1 with ``share_location``), confidence logits
``(N, P·C)``, priors ``(1, 2, P·4)`` (PriorBox), ground truth ``(1, 1, G, 8)`` rows
``[image, label, instance, xmin, ymin, xmax, ymax, difficult]`` as AnnotatedData writes them
(rows with image -1 are skipped). Top: the loss, shape ``()``.

Per image with ground truth: priors (``use_prior_for_matching``, default) or decoded predictions
are matched to the ground truths (``match_type`` BIPARTITE, or PER_PREDICTION which adds every
prior whose best overlap is >= ``overlap_threshold``). Mining (``mining_type``): MAX_NEGATIVE keeps
the ``neg_pos_ratio``·positives unmatched priors with overlap < ``neg_overlap`` of highest
confidence loss (for background) as negatives; HARD_EXAMPLE keeps the ``sample_size`` priors of
highest loss (loc + conf) and unmatches positives outside them; with ``nms_param`` candidates go
through NMS by loss first; NONE uses every prior of every image for the confidence loss.
Location loss over the positives (SMOOTH_L1 Σ, or L2 Σ d²/2) on the targets ``encode``-d with
``code_type``, times ``loc_weight``; confidence loss over positives and negatives: SOFTMAX
Σ −log p(label) or LOGISTIC Σ sigmoid cross-entropy. Both are divided by the normalizer
(``loss_param.normalization``: VALID = number of positives, FULL = N·P, BATCH_SIZE = N, NONE = 1;
at least 1). A term is included only when the layer's ``propagate_down`` for its bottom is on
(default: loc and conf on, priors and labels off), as in the fork.

Backward writes the location gradient into the matched rows of bottom 0 and the confidence
gradient into the used rows of bottom 1 (zeros elsewhere). Like the fork, with
``encode_variance_in_target`` the location gradient is not divided by the variance again.
Runs on the host in both modes (as the fork's, whose matching and mining are CPU code).
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite import bbox
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

MB = caffe_pb2.MultiBoxLossParameter
FLT_MIN = np.finfo(np.float32).tiny


@register_layer("MultiBoxLoss")
class MultiBoxLossLayer(Layer):
    traits = Traits()  # CPU code only (its GPU path runs it on host copies)
    exact_num_bottom_blobs = 4
    exact_num_top_blobs = 1
    is_loss = True

    def layer_setup(self, bottom, top):
        p = self.layer_param.multibox_loss_param
        self.p = p
        if not p.HasField("num_classes"):
            raise self.error("multibox_loss_param.num_classes is required")
        self.num_classes = p.num_classes
        if self.num_classes < 1:
            raise self.error("num_classes must be at least 1")
        self.share_location = p.share_location
        self.loc_classes = 1 if self.share_location else self.num_classes
        self.background = p.background_label_id
        self.mining = p.mining_type
        if p.HasField("do_neg_mining") and p.do_neg_mining != (self.mining != MB.NONE):
            raise self.error("do_neg_mining (deprecated) contradicts mining_type")
        self.do_mining = self.mining != MB.NONE
        if self.do_mining and not self.share_location:
            raise self.error("mining needs share_location: true (as in the SSD fork)")
        if p.conf_loss_type == MB.SOFTMAX and not 0 <= self.background < self.num_classes:
            raise self.error(f"background_label_id {self.background} must be in [0, {self.num_classes}) "
                             "for the SOFTMAX confidence loss")
        if p.map_object_to_agnostic and self.num_classes != (2 if self.background >= 0 else 1):
            raise self.error("map_object_to_agnostic needs num_classes 2 (1 without a background class)")
        lp = self.layer_param.loss_param
        if not lp.HasField("normalization") and lp.HasField("normalize"):
            self.normalization = caffe_pb2.LossParameter.VALID if lp.normalize else caffe_pb2.LossParameter.BATCH_SIZE
        else:
            self.normalization = lp.normalization
        pd = list(self.layer_param.propagate_down)
        self.use_terms = (pd + [True, True])[:2] if pd else [True, True]

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index < 2

    def reshape(self, bottom, top):
        num = bottom[0].shape[0]
        if bottom[1].shape[0] != num:
            raise self.error(f"location bottom {bottom[0].shape} and confidence bottom {bottom[1].shape} "
                             "differ in the number of images")
        if bottom[2].num_axes < 3 or bottom[2].shape[1] != 2 or bottom[2].shape[2] % 4:
            raise self.error(f"prior bottom must be (1, 2, P*4) as PriorBox writes, got {bottom[2].shape}")
        self.num_priors = bottom[2].shape[2] // 4
        if bottom[0].count_range(1) != self.num_priors * self.loc_classes * 4:
            raise self.error(f"location bottom {bottom[0].shape}: {self.num_priors} priors need "
                             f"{self.num_priors * self.loc_classes * 4} values per image")
        if bottom[1].count_range(1) != self.num_priors * self.num_classes:
            raise self.error(f"confidence bottom {bottom[1].shape}: {self.num_priors} priors x "
                             f"{self.num_classes} classes needs {self.num_priors * self.num_classes} values per image")
        if bottom[3].count % 8:
            raise self.error(f"label bottom must hold rows of 8 values (1, 1, G, 8), got {bottom[3].shape}")
        top[0].reshape(())

    # -- matching and mining ----------------------------------------------------------------
    def _ground_truth(self, label) -> dict[int, list[tuple[int, np.ndarray, bool]]]:
        out: dict[int, list[tuple[int, np.ndarray, bool]]] = {}
        for row in label.reshape(-1, 8):
            item = int(row[0])
            if item == -1:
                continue
            lab = int(row[1])
            if lab == self.background:
                raise self.error(f"ground truth of image {item} has the background label {lab}")
            difficult = bool(row[7])
            if difficult and not self.p.use_difficult_gt:
                continue
            out.setdefault(item, []).append((lab, np.asarray(row[3:7], np.float32), difficult))
        return out

    def _match(self, loc, priors, variances, gts):
        """Per image: {label: indices[P]}, {label: overlaps[P]} (the fork's FindMatches)."""
        p = self.p
        bip = p.match_type == MB.BIPARTITE
        all_idx, all_ov = [], []
        for i in range(loc.shape[0]):
            idx_map: dict[int, np.ndarray] = {}
            ov_map: dict[int, np.ndarray] = {}
            if i in gts:
                gt_boxes = np.stack([g[1] for g in gts[i]])
                gt_labels = np.array([g[0] for g in gts[i]])
                if p.use_prior_for_matching:
                    idx, ov = bbox.match(gt_boxes, priors, bip, p.overlap_threshold, p.ignore_cross_boundary_bbox)
                    if self.share_location:
                        idx_map[-1], ov_map[-1] = idx, ov
                    else:
                        for c in range(self.loc_classes):
                            if c == self.background:
                                continue
                            keep = np.where((idx > -1) & (gt_labels[np.maximum(idx, 0)] == c), idx, -1)
                            idx_map[c], ov_map[c] = np.where(idx == -2, -1, keep), ov
                else:
                    for c in range(self.loc_classes):
                        label = -1 if self.share_location else c
                        if not self.share_location and label == self.background:
                            continue
                        boxes = bbox.decode(priors, variances, loc[i, :, c].astype(np.float32), p.code_type,
                                            p.encode_variance_in_target)
                        if label == -1:
                            sub = np.arange(len(gt_boxes))
                        else:
                            sub = np.flatnonzero(gt_labels == label)
                        idx, ov = bbox.match(gt_boxes[sub], boxes, bip, p.overlap_threshold,
                                             p.ignore_cross_boundary_bbox)
                        if len(sub):
                            idx = np.where(idx >= 0, sub[np.maximum(idx, 0)], idx)
                        idx_map[label], ov_map[label] = idx, ov
            all_idx.append(idx_map)
            all_ov.append(ov_map)
        return all_idx, all_ov

    def _conf_loss(self, conf, labels):
        """Per-prior confidence loss of ``conf [P, C]`` for ``labels [P]`` (fork's ComputeConfLoss)."""
        if self.p.conf_loss_type == MB.SOFTMAX:
            z = conf - conf.max(axis=1, keepdims=True)
            prob = np.exp(z[np.arange(len(labels)), labels]) / np.exp(z).sum(axis=1)
            return -np.log(np.maximum(prob, FLT_MIN))
        target = np.zeros_like(conf)
        target[np.arange(len(labels)), labels] = 1
        return self._logistic(conf, target).sum(axis=1)

    @staticmethod
    def _logistic(x, t):
        pos = (x >= 0).astype(x.dtype)
        return -(x * (t - pos) - np.log1p(np.exp(x - 2 * x * pos)))

    def _gt_label(self, gts, i, g):
        return self.background + 1 if self.p.map_object_to_agnostic else gts[i][g][0]

    def _mine(self, loc, conf, priors, variances, gts, all_idx, all_ov):
        p = self.p
        num_matches = sum(int((v > -1).sum()) for m in all_idx for v in m.values())
        negs: list[list[int]] = [[] for _ in all_idx]
        if not self.do_mining:
            return num_matches, negs
        has_nms = p.HasField("nms_param")
        nms_thr = p.nms_param.nms_threshold if has_nms else 0.0
        top_k = p.nms_param.top_k if has_nms else -1
        for i, idx_map in enumerate(all_idx):
            labels = np.full(self.num_priors, self.background, np.int64)
            for v in idx_map.values():
                for j in np.flatnonzero(v > -1):
                    labels[j] = self._gt_label(gts, i, v[j])
            loss = self._conf_loss(conf[i].astype(np.float64), labels).astype(np.float32)
            if self.mining == MB.HARD_EXAMPLE:
                loss = loss + self._loc_loss_per_prior(loc, priors, variances, gts, i, idx_map)
            sel: set[int] = set()
            for label in sorted(idx_map):
                mi, ov = idx_map[label], all_ov[i][label]
                if self.mining == MB.MAX_NEGATIVE:
                    eligible = np.flatnonzero((mi == -1) & (ov < np.float32(p.neg_overlap)))
                    num_sel = min(int(int((mi > -1).sum()) * p.neg_pos_ratio), len(eligible))
                else:
                    eligible = np.arange(len(mi))
                    if p.sample_size <= 0:
                        raise self.error("sample_size must be positive for HARD_EXAMPLE mining")
                    num_sel = min(p.sample_size, len(eligible))
                if has_nms and nms_thr > 0:
                    if p.use_prior_for_nms:
                        boxes = priors[eligible]
                    else:
                        boxes = bbox.decode(priors, variances, loc[i, :, 0].astype(np.float32), p.code_type,
                                            p.encode_variance_in_target)[eligible]
                    kept = bbox.nms_by_loss(boxes, loss[eligible], nms_thr, top_k)
                    sel.update(int(eligible[k]) for k in kept[:num_sel])
                else:
                    order = np.argsort(-loss[eligible], kind="stable")[:num_sel]
                    sel.update(int(eligible[k]) for k in order)
                chosen = np.zeros(len(mi), bool)
                chosen[sorted(sel)] = True
                negs[i].extend(int(m) for m in np.flatnonzero((mi == -1) & chosen))  # before unmatching
                if self.mining == MB.HARD_EXAMPLE:
                    drop = (mi > -1) & ~chosen
                    num_matches -= int(drop.sum())
                    mi[drop] = -1
        return num_matches, negs

    def _loc_loss_per_prior(self, loc, priors, variances, gts, i, idx_map):
        out = np.zeros(self.num_priors, np.float32)
        for label in sorted(idx_map):
            for j in np.flatnonzero(idx_map[label] > -1):
                pred, target = self._loc_pair(loc, priors, variances, gts[i][idx_map[label][j]][1], i, label, j)
                out[j] += self._loc_elem(pred - target).sum()
        return out

    def _loc_pair(self, loc, priors, variances, gt_box, i, label, j):
        """(prediction, target) for prior j of image i matched to ``gt_box`` (fork's EncodeLocPrediction)."""
        p = self.p
        lc = 0 if self.share_location else label
        target = bbox.encode(priors[j:j + 1], variances[j:j + 1], gt_box[None].astype(np.float32), p.code_type,
                             p.encode_variance_in_target)[0].astype(np.float64)
        pred = loc[i, j, lc].astype(np.float64).copy()
        if p.bp_inside:
            ref = priors[j]
            if not p.use_prior_for_matching:
                ref = bbox.decode(priors[j:j + 1], variances[j:j + 1], loc[i, j:j + 1, lc].astype(np.float32),
                                  p.code_type, p.encode_variance_in_target)[0]
            outside = (ref < 0) | (ref > 1)
            pred = np.where(outside, target, pred)
        if p.encode_variance_in_target:
            pred = pred / variances[j]
            target = target / variances[j]
        return pred, target

    def _loc_elem(self, d):
        if self.p.loc_loss_type == MB.SMOOTH_L1:
            a = np.abs(d)
            return np.where(a < 1, 0.5 * d * d, a - 0.5)
        return 0.5 * d * d

    def _loc_grad(self, d):
        if self.p.loc_loss_type == MB.SMOOTH_L1:
            return np.where(np.abs(d) < 1, d, np.sign(d))
        return d

    # -- passes -----------------------------------------------------------------------------
    def _normalizer(self, num, num_matches):
        mode = self.normalization
        LP = caffe_pb2.LossParameter
        if mode == LP.FULL:
            value = num * self.num_priors
        elif mode == LP.VALID:
            value = num_matches
        elif mode == LP.BATCH_SIZE:
            value = num
        else:
            value = 1
        return max(1.0, float(value))

    def _conf_targets(self, num: int, gts, all_idx, negs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The confidence rows (image, prior, label): with mining, the matched priors of images with
        ground truth and their mined negatives (background); without, every prior, background
        where unmatched."""
        if self.do_mining:
            conf_rows: list[tuple[int, int, int]] = []
            for i, idx_map in enumerate(all_idx):
                if i not in gts:
                    continue
                for label in sorted(idx_map):
                    for j in np.flatnonzero(idx_map[label] > -1):
                        conf_rows.append((i, int(j), self._gt_label(gts, i, idx_map[label][j])))
                conf_rows.extend((i, m, self.background) for m in negs[i])
            return (np.array([r[0] for r in conf_rows], np.int64), np.array([r[1] for r in conf_rows], np.int64),
                    np.array([r[2] for r in conf_rows], np.int64))
        labels = np.full((num, self.num_priors), self.background, np.int64)
        for i, idx_map in enumerate(all_idx):
            if i not in gts:
                continue
            for label in sorted(idx_map):
                for j in np.flatnonzero(idx_map[label] > -1):
                    labels[i, j] = self._gt_label(gts, i, idx_map[label][j])
        ii, jj = (a.ravel() for a in np.indices((num, self.num_priors)))
        return ii, jj, labels.ravel()

    def forward_cpu(self, bottom, top):
        num = bottom[0].shape[0]
        loc = bottom[0].cpu_data().reshape(num, self.num_priors, self.loc_classes, 4)
        conf = bottom[1].cpu_data().reshape(num, self.num_priors, self.num_classes)
        prior = bottom[2].cpu_data().reshape(2, self.num_priors, 4).astype(np.float32)
        priors, variances = prior[0], prior[1]
        gts = self._ground_truth(bottom[3].cpu_data())
        all_idx, all_ov = self._match(loc, priors, variances, gts)
        num_matches, negs = self._mine(loc, conf, priors, variances, gts, all_idx, all_ov)
        # location rows: (image, loc class, prior, d = pred - target)
        loc_rows = []
        for i, idx_map in enumerate(all_idx):
            for label in sorted(idx_map):
                for j in np.flatnonzero(idx_map[label] > -1):
                    pred, target = self._loc_pair(loc, priors, variances, gts[i][idx_map[label][j]][1], i, label, j)
                    loc_rows.append((i, 0 if self.share_location else label, int(j), pred - target))
        loc_loss = sum(float(self._loc_elem(d).sum()) for *_, d in loc_rows) * self.p.loc_weight
        ii, jj, ll = self._conf_targets(num, gts, all_idx, negs)
        conf_loss = 0.0
        if len(ii):
            x = conf[ii, jj].astype(np.float64)
            if self.p.conf_loss_type == MB.SOFTMAX:
                z = x - x.max(axis=1, keepdims=True)
                prob = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
                conf_loss = float(-np.log(np.maximum(prob[np.arange(len(ll)), ll], FLT_MIN)).sum())
                target = np.zeros_like(prob)
                target[np.arange(len(ll)), ll] = 1
                self._conf_grad = prob - target
            else:
                target = np.full_like(x, float(self.background))
                ok = (ll >= 0) & (ll < self.num_classes)
                target[np.flatnonzero(ok), ll[ok]] = 1
                conf_loss = float(self._logistic(x, target).sum())
                self._conf_grad = 1 / (1 + np.exp(-x)) - target
        self._loc_rows, self._conf_rows, self._num_matches = loc_rows, (ii, jj), num_matches
        norm = self._normalizer(num, num_matches)
        loss = 0.0
        if self.use_terms[0]:
            loss += loc_loss / norm
        if self.use_terms[1]:
            loss += conf_loss / norm
        top[0].mutable_cpu_data()[...] = loss

    def backward_cpu(self, top, propagate_down, bottom):
        num = bottom[0].shape[0]
        scale = float(top[0].cpu_diff()) / self._normalizer(num, self._num_matches)
        if propagate_down[0]:
            dloc = bottom[0].mutable_cpu_diff().reshape(num, self.num_priors, self.loc_classes, 4)
            dloc[...] = 0
            for i, lc, j, d in self._loc_rows:
                dloc[i, j, lc] = self.p.loc_weight * self._loc_grad(d) * scale
        if propagate_down[1]:
            dconf = bottom[1].mutable_cpu_diff().reshape(num, self.num_priors, self.num_classes)
            dconf[...] = 0
            ii, jj = self._conf_rows
            if len(ii):
                dconf[ii, jj] = self._conf_grad * scale
