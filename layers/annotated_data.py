"""AnnotatedData (SSD fork, weiliu89/caffe): images with labelled boxes from an LMDB of AnnotatedDatum.

``data_param { source batch_size backend: LMDB }``, ``transform_param`` (mean_value / mean_file,
scale, mirror, crop_size, and the fork's ``resize_param``, ``distort_param``, ``expand_param``,
``emit_constraint``), ``annotated_data_param { batch_sampler ... }``. Tops: ``data``
``(batch_size, C, H, W)`` and optionally ``label`` ``(1, 1, B, 8)`` with one row
``[item, group_label, instance_id, xmin, ymin, xmax, ymax, difficult]`` per box of the batch
(coordinates relative to the transformed image), or one row of -1 when the batch has no box.

Per image, in the fork's order: photometric distortion (brightness, contrast, saturation, hue,
channel order, each with its probability; the two orders the fork picks between), expansion
onto a canvas of the mean colour (ratio uniform in [1, max_expand_ratio]), one window drawn
among those the batch samplers generate (none: the whole image), then resize (WARP to
``height`` x ``width``), ``crop_size`` crop, mirror, ``(x - mean) * scale``. Boxes follow each
geometric step; a box survives a crop when it meets ``emit_constraint`` (if given) and keeps a
non-empty part. Records are read in key order, wrapping around; random choices come from a
generator seeded from ``caffe.set_random_seed``, so a run repeats exactly. Reads happen on the
calling thread (no prefetch). Supported resize mode: WARP (others raise an error); of the
interpolation modes NEAREST is nearest-neighbour and the others bilinear; ``noise_param`` is not
applied.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pycaffe_lite import bbox, common, io
from pycaffe_lite.data import workers as data_workers
from pycaffe_lite.data.db import Cursor, close_inherited, open_cursor
from pycaffe_lite.data.parallel import ParallelBatches, StopsReaders
from pycaffe_lite.data.transformer import decode_datum, load_mean_file
from pycaffe_lite.errors import DataError
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

log = logging.getLogger("pycaffe_lite")

RP = caffe_pb2.ResizeParameter


def _rgb_to_hsv(img: np.ndarray) -> np.ndarray:
    """BGR float image (0..255) -> H in [0, 360), S, V in [0, 1]."""
    b, g, r = img[..., 0] / 255.0, img[..., 1] / 255.0, img[..., 2] / 255.0
    mx, mn = np.maximum(np.maximum(r, g), b), np.minimum(np.minimum(r, g), b)
    d = mx - mn
    safe = np.where(d > 0, d, 1)
    h = np.where(mx == r, ((g - b) / safe) % 6, np.where(mx == g, (b - r) / safe + 2, (r - g) / safe + 4)) * 60
    h = np.where(d > 0, h, 0)
    s = np.where(mx > 0, d / np.where(mx > 0, mx, 1), 0)
    return np.stack([h, s, mx], axis=-1)


def _hsv_to_bgr(hsv: np.ndarray) -> np.ndarray:
    h, s, v = hsv[..., 0] % 360, hsv[..., 1], hsv[..., 2]
    c = v * s
    x = c * (1 - np.abs((h / 60) % 2 - 1))
    m = v - c
    k = (h // 60).astype(int) % 6
    zeros = np.zeros_like(c)
    r = np.choose(k, [c, x, zeros, zeros, x, c])
    g = np.choose(k, [x, c, c, x, zeros, zeros])
    b = np.choose(k, [zeros, zeros, x, c, c, x])
    return np.stack([b + m, g + m, r + m], axis=-1) * 255.0


@register_layer("AnnotatedData")
class AnnotatedDataLayer(StopsReaders, Layer):
    traits = Traits()  # CPU code only (its GPU path runs it on host copies)
    exact_num_bottom_blobs = 0
    min_top_blobs = 1
    max_top_blobs = 2

    def layer_setup(self, bottom, top):
        dp = self.layer_param.data_param
        self.tp = self.layer_param.transform_param
        self.ap = self.layer_param.annotated_data_param
        if not dp.source:
            raise self.error("data_param.source is required")
        if dp.batch_size <= 0:
            raise self.error("data_param.batch_size must be positive")
        self.batch_size = dp.batch_size
        self.cursor = open_cursor(dp.source, dp.backend, where=self.where)
        self.rng = np.random.default_rng(int(common.rng().integers(2**63)))
        rp = self.tp.resize_param
        if self.tp.HasField("resize_param") and rp.resize_mode != RP.WARP:
            raise self.error(f"resize_param.resize_mode {RP.Resize_mode.Name(rp.resize_mode)} is not supported "
                             "(WARP is)")
        if self.tp.HasField("resize_param") and (rp.height <= 0 or rp.width <= 0):
            raise self.error("resize_param needs positive height and width")
        self._check_augmentation()
        self.mean = load_mean_file(self.tp.mean_file) if self.tp.mean_file else None
        self.mean_values = list(self.tp.mean_value)
        first = self._read()
        img = self._image(first)
        self.channels = img.shape[2]
        if self.mean_values and len(self.mean_values) not in (1, self.channels):
            raise self.error(f"{len(self.mean_values)} mean_value entries for {self.channels} channels")
        h, w = img.shape[:2]
        if self.tp.HasField("resize_param"):
            h, w = rp.height, rp.width
        if self.tp.crop_size:
            h = w = self.tp.crop_size
        if self.tp.crop_h or self.tp.crop_w:
            h, w = self.tp.crop_h or h, self.tp.crop_w or w
        self.out_hw = (h, w)
        self.cursor.seek_to_first()
        self._parallel: _ParallelAnnotated | None = None
        heavy = self.batch_size * self.channels * h * w >= data_workers.HEAVY_BATCH_BYTES
        ranks = common.solver_count() if self.phase == common.TRAIN else 1
        workers = data_workers.worker_count(dp.workers, heavy, ranks)
        if workers > 0:
            parallel = _ParallelAnnotated(self, workers)
            if parallel.try_start(data_workers.automatic(dp.workers), "on the calling thread"):
                self._parallel = parallel
                self.stop_with_layer(parallel.stop)

    def _check_augmentation(self) -> None:
        """The fork's CHECKs on sampler, distortion and expansion values, as project errors."""
        for k, bs in enumerate(self.ap.batch_sampler):
            s = bs.sampler
            if not (0 < s.min_scale <= s.max_scale <= 1):
                raise self.error(f"batch_sampler {k}: need 0 < min_scale <= max_scale <= 1, got "
                                 f"{s.min_scale}, {s.max_scale}")
            if not (0 < s.min_aspect_ratio <= s.max_aspect_ratio < np.finfo(np.float32).max):
                raise self.error(f"batch_sampler {k}: need 0 < min_aspect_ratio <= max_aspect_ratio, got "
                                 f"{s.min_aspect_ratio}, {s.max_aspect_ratio}")
        d = self.tp.distort_param
        for lo, hi in (("contrast_lower", "contrast_upper"), ("saturation_lower", "saturation_upper")):
            if getattr(d, lo) < 0 or getattr(d, hi) < getattr(d, lo):
                raise self.error(f"distort_param: need 0 <= {lo} <= {hi}, got {getattr(d, lo)}, {getattr(d, hi)}")
        if d.brightness_delta < 0 or d.hue_delta < 0:
            raise self.error("distort_param: brightness_delta and hue_delta must be non-negative")
        if self.tp.HasField("expand_param") and self.tp.expand_param.max_expand_ratio < 1:
            raise self.error(f"expand_param.max_expand_ratio must be at least 1, got "
                             f"{self.tp.expand_param.max_expand_ratio}")

    def reshape(self, bottom, top):
        top[0].reshape((self.batch_size, self.channels, *self.out_hw))
        if len(top) > 1 and top[1].num_axes != 4:
            top[1].reshape((1, 1, 1, 8))

    # -- records ----------------------------------------------------------------------------
    def _read(self) -> caffe_pb2.AnnotatedDatum:
        return self.parse(self.cursor.value(), bytes(self.cursor.key()))

    def parse(self, value, key: bytes) -> caffe_pb2.AnnotatedDatum:
        ad = caffe_pb2.AnnotatedDatum()
        try:
            ad.ParseFromString(value)
        except Exception as exc:
            raise self.error(f"{self.cursor.path}: record {key!r} is not an AnnotatedDatum ({exc})",
                             DataError) from None
        return ad

    def _image(self, ad) -> np.ndarray:
        chw = decode_datum(ad.datum, self.tp.force_color, self.tp.force_gray, where=self.where)
        return np.ascontiguousarray(chw.transpose(1, 2, 0)).astype(np.float32)

    @staticmethod
    def _boxes(ad) -> list[tuple[int, int, np.ndarray, bool]]:
        out = []
        for group in ad.annotation_group:
            for a in group.annotation:
                b = a.bbox
                out.append((group.group_label, a.instance_id,
                            np.array([b.xmin, b.ymin, b.xmax, b.ymax], np.float32), bool(b.difficult)))
        return out

    # -- augmentation -----------------------------------------------------------------------
    def _distort(self, img, rng: np.random.Generator):
        d = self.tp.distort_param

        def brightness(x):
            if rng.uniform() < d.brightness_prob:
                x = np.clip(x + rng.uniform(-d.brightness_delta, d.brightness_delta), 0, 255)
            return x

        def contrast(x):
            if rng.uniform() < d.contrast_prob:
                x = np.clip(x * rng.uniform(d.contrast_lower, d.contrast_upper), 0, 255)
            return x

        def saturation(x):
            if rng.uniform() < d.saturation_prob:
                hsv = _rgb_to_hsv(x)
                hsv[..., 1] = np.clip(hsv[..., 1] * rng.uniform(d.saturation_lower, d.saturation_upper), 0, 1)
                x = np.clip(_hsv_to_bgr(hsv), 0, 255)
            return x

        def hue(x):
            if rng.uniform() < d.hue_prob:
                hsv = _rgb_to_hsv(x)
                hsv[..., 0] += 2 * rng.uniform(-d.hue_delta, d.hue_delta)  # delta in OpenCV's 0..180 units
                x = np.clip(_hsv_to_bgr(hsv), 0, 255)
            return x

        def channel_order(x):
            if rng.uniform() < d.random_order_prob:
                x = x[..., rng.permutation(x.shape[2])]
            return x

        if rng.uniform() > 0.5:
            steps = [brightness, contrast, saturation, hue, channel_order]
        else:
            steps = [brightness, saturation, hue, contrast, channel_order]
        for step in steps:
            img = step(img)
        return img.astype(np.float32)

    def _mean_colour(self, channels):
        if not self.mean_values:
            return np.zeros(channels, np.float32)
        return np.resize(np.asarray(self.mean_values, np.float32), channels)

    def _transform_boxes(self, boxes, window, mirror=False):
        ec = self.tp.emit_constraint
        out = []
        for label, inst, box, diff in boxes:
            if self.tp.HasField("emit_constraint") and not bbox.meets_emit_constraint(
                    window, box, ec.emit_type, ec.emit_overlap):
                continue
            proj = bbox.project(window, box)
            if proj is None:
                continue
            if mirror:
                proj = np.array([1 - proj[2], proj[1], 1 - proj[0], proj[3]], np.float32)
            out.append((label, inst, proj, diff))
        return out

    def _expand(self, img, boxes, rng: np.random.Generator):
        e = self.tp.expand_param
        if rng.uniform() > e.prob:
            return img, boxes
        ratio = rng.uniform(1, e.max_expand_ratio) if e.max_expand_ratio > 1 else 1.0
        if abs(ratio - 1) < 1e-2:
            return img, boxes
        h, w = img.shape[:2]
        eh, ew = int(h * ratio), int(w * ratio)
        y0 = int(np.floor(rng.uniform(0, eh - h)))
        x0 = int(np.floor(rng.uniform(0, ew - w)))
        canvas = np.empty((eh, ew, img.shape[2]), np.float32)
        canvas[...] = self._mean_colour(img.shape[2])
        canvas[y0:y0 + h, x0:x0 + w] = img
        window = np.array([-x0 / w, -y0 / h, (ew - x0) / w, (eh - y0) / h], np.float32)
        return canvas, self._transform_boxes(boxes, window)

    def _crop_window(self, img, boxes, window):
        h, w = img.shape[:2]
        x0, y0 = int(window[0] * w), int(window[1] * h)
        cw, ch = int((window[2] - window[0]) * w), int((window[3] - window[1]) * h)
        cw, ch = max(1, min(cw, w - x0)), max(1, min(ch, h - y0))
        return img[y0:y0 + ch, x0:x0 + cw], self._transform_boxes(boxes, window)

    def _final(self, img, boxes, rng: np.random.Generator):
        """Resize, crop, mirror, mean and scale: (C, H, W) float values and the boxes."""
        if self.tp.HasField("resize_param"):
            rp = self.tp.resize_param
            modes = list(rp.interp_mode) or [RP.LINEAR]  # the fork picks one of the listed modes at random
            mode = modes[int(rng.integers(len(modes)))] if len(modes) > 1 else modes[0]
            order = 0 if mode == RP.NEAREST else 1  # nearest, else bilinear (AREA/CUBIC/LANCZOS4 too)
            img = io.resize(img, rp.height, rp.width, order).astype(np.float32)
        h, w = img.shape[:2]
        oh, ow = self.out_hw
        if (oh, ow) != (h, w):
            if oh > h or ow > w:
                raise self.error(f"image of {h}x{w} is smaller than the crop {oh}x{ow}", DataError)
            if self.phase == caffe_pb2.TRAIN:
                y0, x0 = int(rng.integers(h - oh + 1)), int(rng.integers(w - ow + 1))
            else:
                y0, x0 = (h - oh) // 2, (w - ow) // 2
            img = img[y0:y0 + oh, x0:x0 + ow]
            window = np.array([x0 / w, y0 / h, (x0 + ow) / w, (y0 + oh) / h], np.float32)
        else:
            window = np.array([0, 0, 1, 1], np.float32)
        mirror = bool(self.tp.mirror and rng.integers(2))
        boxes = self._transform_boxes(boxes, window, mirror)
        if mirror:
            img = img[:, ::-1]
        chw = img.transpose(2, 0, 1).astype(np.float64)
        if self.mean is not None:
            m = self.mean.reshape(-1, *self.mean.shape[-2:]) if self.mean.ndim > 2 else self.mean
            if m.shape[-2:] != chw.shape[-2:]:
                raise self.error(f"mean_file of shape {self.mean.shape} does not fit "
                                f"images of {chw.shape}", DataError)
            chw = chw - m
        elif self.mean_values:
            chw = chw - self._mean_colour(chw.shape[0]).reshape(-1, 1, 1)
        return chw * self.tp.scale, boxes

    def load_item(self, ad, rng: np.random.Generator):
        """One record's (C, H, W) values and boxes, its random choices drawn from ``rng``."""
        img = self._image(ad)
        boxes = self._boxes(ad)
        if self.tp.HasField("distort_param"):
            img = self._distort(img, rng)
        if self.tp.HasField("expand_param"):
            img, boxes = self._expand(img, boxes, rng)
        if self.ap.batch_sampler:
            objects = np.array([b[2] for b in boxes], np.float32).reshape(-1, 4)
            windows = bbox.generate_samples(rng, objects, self.ap.batch_sampler)
            if windows:
                img, boxes = self._crop_window(img, boxes, windows[int(rng.integers(len(windows)))])
        if not self.tp.HasField("resize_param") and img.shape[:2] != self.out_hw and not (
                self.tp.crop_size or self.tp.crop_h or self.tp.crop_w):
            raise self.error(f"image of {img.shape[:2]} differs from the batch's "
                            f"{self.out_hw}; give transform_param.resize_param to resize", DataError)
        return self._final(img, boxes, rng)

    def item_seed(self) -> int:
        """The seed of the next item's generator: one draw of the layer's generator per item, so
        that worker processes can make each item's choices and the batches stay the same."""
        return int(self.rng.integers(2**63))

    def write_item(self, ad, seed: int, key: bytes, out: np.ndarray, i: int) -> list[list[float]]:
        """Item ``i`` of a batch into ``out`` (C, H, W); its label rows."""
        values, boxes = self.load_item(ad, np.random.default_rng(seed))
        if values.shape != out.shape:
            raise self.error(f"record {key!r} gives {values.shape}, the batch is {out.shape}", DataError)
        out[...] = values
        return [[i, label, inst, *box, float(diff)] for label, inst, box, diff in boxes]

    def _labels(self, top, rows) -> None:
        if len(top) > 1:
            out = np.asarray(rows, np.float64) if rows else np.full((1, 8), -1.0)
            top[1].reshape((1, 1, len(out), 8))
            top[1].mutable_cpu_data()[...] = out.reshape(top[1].shape)

    def forward_cpu(self, bottom, top):
        if self._parallel is not None:
            self._parallel.fill_annotated(top)
            return
        data = top[0].mutable_cpu_data()
        rows: list = []
        for i in range(self.batch_size):
            ad = self._read()
            rows += self.write_item(ad, self.item_seed(), bytes(self.cursor.key()), data[i], i)
            self.cursor.next()
        self._labels(top, rows)



@dataclass
class _AnnotatedJob:
    """A worker's part: read the record (LMDB by key, or the bytes the parent sent), then the
    layer's whole per-item pipeline (:meth:`AnnotatedDataLayer.write_item`) with the item's seed;
    the label rows go back to the parent. ``layer`` is a weak reference to the parent's layer, of
    which the forked worker holds a copy."""

    layer: Any
    source: str
    lmdb: bool

    def open(self) -> None:
        self.txn = None
        if self.lmdb:
            import lmdb

            close_inherited()
            path = Path(self.source)
            self.env = lmdb.open(str(path), readonly=True, lock=False, readahead=False, subdir=path.is_dir(),
                                 max_readers=512)
            self.txn = self.env.begin(buffers=True)

    def load(self, ref: Any, batches: data_workers.SharedBatches, slot: int, i: int) -> list:
        layer = self.layer()
        if self.txn is not None:
            (key, seed), value = ref, self.txn.get(ref[0])
            if value is None:
                raise DataError(f"{layer.where}: {self.source}: record {key!r} disappeared (was the database "
                                "rewritten?)")
        else:
            key, seed, value = ref
        return layer.write_item(layer.parse(value, key), seed, key, batches.data[slot][i], i)


class _ParallelAnnotated(ParallelBatches):
    """AnnotatedData's parallel path: the loader's thread walks the cursor and draws each item's
    seed; workers run the augmentation and return the label rows."""

    def __init__(self, layer: AnnotatedDataLayer, workers: int) -> None:
        shape = (layer.channels, *layer.out_hw)
        super().__init__(None, layer.batch_size, 4, layer.dtype, layer.where, workers, shape, False)
        self.layer = weakref.proxy(layer)
        self.cursor = layer.cursor
        self.lmdb = isinstance(layer.cursor, Cursor)
        self._job = _AnnotatedJob(weakref.ref(layer), str(layer.cursor.path), self.lmdb)

    def job(self) -> data_workers.Job:
        return self._job

    def plan(self, slot: int, now: bool) -> tuple[list, None]:
        refs: list = []
        for _ in range(self.batch_size):
            key = bytes(self.cursor.key())
            refs.append((key, self.layer.item_seed()) if self.lmdb else
                        (key, self.layer.item_seed(), bytes(self.cursor.value())))
            self.cursor.next()
        return refs, None

    def fill_annotated(self, top) -> None:
        """The next batch's values into ``top[0]``, its label rows into ``top[1]``."""
        assert self.loader is not None
        slot, _, payloads = self.loader.get()
        try:
            top[0].mutable_cpu_data()[...] = self.loader.batches.data[slot]
            self.layer._labels(top, [row for rows in payloads or [] for row in rows])
        finally:
            self.loader.release(slot)
