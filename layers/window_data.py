"""WindowData: R-CNN's window-file data layer (BVLC's WindowDataLayer), reading images with OpenCV.

The window file (``window_data_param.source``) repeats, per image::

    # <image index>
    <image path>            (read from root_folder + path)
    <channels> <height> <width>
    <number of windows>
    <class> <overlap> <x1> <y1> <x2> <y2>     (one line per window; inclusive pixel corners)

A window with ``overlap >= fg_threshold`` is foreground (its class must be positive); one with
``overlap < bg_threshold`` is background (class 0); others are unused. Each batch holds
``batch_size - int(batch_size * fg_fraction)`` background windows then the foreground ones, each
drawn at random (with replacement) from its list. A window (expanded by ``context_pad`` pixels of
context after warping, and made square with ``crop_mode: "square"``; the part outside the image
is left zero) is cut out of the colour (BGR) image, warped to ``crop_size`` x ``crop_size`` with
OpenCV's bilinear resize, flipped left-right at random with ``mirror``, and written as
``(pixel - mean) * scale``. tops: data (batch_size, 3, crop_size, crop_size) and label
(batch_size,). As in BVLC: ``crop_size``, ``mirror``, ``mean_file`` / ``mean_value`` come from
``transform_param``; ``scale``, ``context_pad``, ``crop_mode``, ``cache_images`` (keep the encoded
files in memory) and ``root_folder`` from ``window_data_param``. Needs ``cv2``
(``opencv-python-headless``, in the ``data`` extra).

With worker processes (``window_data_param.workers``, pycaffe-lite's field 1001, or
``$PYCAFFE_LITE_DATA_WORKERS``; automatic by default: the usable cores less one when a batch holds
1 MiB of pixels or more) a loader thread draws each batch's windows and flips in the single-thread
order and forked workers read, warp and write them into shared memory
(``pycaffe_lite/data/parallel.py``); the batches are the single-thread path's.
"""

from __future__ import annotations

import logging
import math
import os
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.data import workers as data_workers
from pycaffe_lite.data.parallel import ParallelBatches, StopsReaders
from pycaffe_lite.data.transformer import load_mean_file
from pycaffe_lite.errors import DataError
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.optional import require

log = logging.getLogger("pycaffe_lite")


def c_round(x: float) -> int:
    """C's round(): halves away from zero."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def read_window_file(source: str, root_folder: str, where: str):
    """``(images, windows)``: ``images[i] = (path, (channels, height, width))`` in file order and
    ``windows`` a list of ``(image number, class, overlap, x1, y1, x2, y2)``."""
    try:
        with open(source, encoding="utf-8") as fh:
            tokens = fh.read().split()
    except OSError as exc:
        raise DataError(f"{where}: cannot open window file {source}: {exc.strerror or exc}") from None
    if not tokens:
        raise DataError(f"{where}: window file {source} is empty")
    pos = 0

    def take(what: str, kind=int):
        nonlocal pos
        if pos >= len(tokens):
            raise DataError(f"{where}: window file {source} ends early: expected {what}")
        token = tokens[pos]
        pos += 1
        try:
            return kind(token) if kind is not str else token
        except ValueError:
            raise DataError(f"{where}: window file {source}: expected {what}, got {token!r}") from None

    images: list[tuple[str, tuple[int, int, int]]] = []
    windows: list[tuple[int, int, float, int, int, int, int]] = []
    while pos < len(tokens):
        if take("'#'", str) != "#":
            raise DataError(f"{where}: window file {source}: expected '# <image index>' before image "
                            f"{len(images)}, got {tokens[pos - 1]!r}")
        take("an image index")
        path = root_folder + take("an image path", str)
        size = (take("channels"), take("height"), take("width"))
        images.append((path, size))
        for _ in range(take("the number of windows")):
            label, overlap = take("a class"), take("an overlap", float)
            x1, y1, x2, y2 = (take("a window corner") for _ in range(4))
            windows.append((len(images) - 1, label, overlap, x1, y1, x2, y2))
    return images, windows


@register_layer("WindowData")
class WindowDataLayer(StopsReaders, Layer):
    traits = Traits()  # a host-side reader: runs plainly before a replayed graph
    exact_num_bottom_blobs = 0
    exact_num_top_blobs = 2

    def layer_setup(self, bottom, top):
        p = self.layer_param.window_data_param
        tp = self.layer_param.transform_param
        self.cv2 = require("cv2", feature=self.where, extra="data")
        if p.batch_size <= 0:
            raise self.error(f"window_data_param.batch_size must be positive, got {p.batch_size}")
        self.crop_size = int(tp.crop_size)
        if self.crop_size <= 0:
            raise self.error("transform_param.crop_size must be positive (the size windows are warped to; "
                             "window_data_param.crop_size is not read, as in BVLC)")
        if 2 * p.context_pad >= self.crop_size:
            raise self.error(f"window_data_param.context_pad {p.context_pad} leaves no room in crop_size "
                             f"{self.crop_size}")
        if p.crop_mode not in ("warp", "square"):
            raise self.error(f"window_data_param.crop_mode must be \"warp\" or \"square\", got {p.crop_mode!r}")
        self.images, windows = read_window_file(p.source, p.root_folder, self.where)
        self.fg, self.bg = [], []
        for w in windows:
            image, label, overlap = w[0], w[1], w[2]
            if overlap >= p.fg_threshold:
                if label <= 0:
                    raise DataError(f"{self.where}: {p.source}: a foreground window (overlap {overlap}) of image "
                                    f"{self.images[image][0]} has class {label}; foreground classes must be positive")
                self.fg.append(w)
            elif overlap < p.bg_threshold:
                self.bg.append((image, 0, 0.0) + w[3:])
        channels = self.images[-1][1][0]
        if channels != 3:
            raise DataError(f"{self.where}: {p.source} gives images {channels} channels; WindowData reads "
                            "images in colour (3 channels, BGR), as BVLC's")
        self.cache: list[bytes] | None = None
        if p.cache_images:
            self.cache = [self._read_bytes(path) for path, _ in self.images]
        self._read_mean(tp, channels)
        self.rng = np.random.default_rng(common.rng().integers(1 << 63))
        self.channels = channels
        top[0].reshape((p.batch_size, channels, self.crop_size, self.crop_size))
        top[1].reshape((p.batch_size,))
        self._parallel: _ParallelWindows | None = None
        heavy = p.batch_size * channels * self.crop_size**2 >= data_workers.HEAVY_BATCH_BYTES
        ranks = common.solver_count() if self.phase == common.TRAIN else 1
        workers = data_workers.worker_count(p.workers, heavy, ranks)
        if workers > 0:
            parallel = _ParallelWindows(self, workers)
            if parallel.try_start(data_workers.automatic(p.workers), "on the calling thread"):
                self._parallel = parallel
                self.stop_with_layer(parallel.stop)

    def _read_mean(self, tp, channels: int) -> None:
        """``transform_param``'s mean file (at least crop-sized) or mean values (one, or per channel)."""
        self.mean: np.ndarray | None = None
        self.mean_values: np.ndarray | None = None
        if tp.mean_file:
            if len(tp.mean_value):
                raise self.error("give transform_param.mean_file or mean_value, not both")
            self.mean = load_mean_file(tp.mean_file, self.where)
            mh, mw = self.mean.shape[1:]
            if self.mean.shape[0] != channels or mh < self.crop_size or mw < self.crop_size:
                raise DataError(f"{self.where}: mean {tp.mean_file} has shape {self.mean.shape}; expected "
                                f"{channels} channels of at least {self.crop_size}x{self.crop_size}")
        elif len(tp.mean_value):
            if len(tp.mean_value) not in (1, channels):
                raise self.error(f"give 1 mean_value or one per channel ({channels}), got {len(tp.mean_value)}")
            self.mean_values = np.resize(np.asarray(tp.mean_value, np.float64), channels)

    def reshape(self, bottom, top):
        """The tops keep the shapes set at set-up."""

    def _read_bytes(self, path: str) -> bytes:
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise DataError(f"{self.where}: cannot read image {path}: {exc.strerror or exc}") from None

    def _image(self, index: int) -> np.ndarray:
        cv2 = self.cv2
        path = self.images[index][0]
        if self.cache is not None:
            img = cv2.imdecode(np.frombuffer(self.cache[index], np.uint8), cv2.IMREAD_COLOR)
        elif not os.path.isfile(path):
            raise DataError(f"{self.where}: image file {path} not found (listed in "
                            f"{self.layer_param.window_data_param.source})")
        else:
            img = cv2.imread(path, cv2.IMREAD_COLOR)
        if img is None:
            raise DataError(f"{self.where}: could not decode image {path}")
        return img

    def _draw(self) -> int:
        return int(self.rng.integers(1 << 32))

    def window_pixels(self, img: np.ndarray, window, do_mirror: bool) -> tuple[np.ndarray, int, int]:
        """The warped (and maybe flipped) window as (h, w, 3) uint8 and its (pad_h, pad_w) offset in
        the crop_size x crop_size output, by BVLC's geometry."""
        p = self.layer_param.window_data_param
        f = self.dtype.type  # BVLC computes the geometry in Dtype
        crop, pad = self.crop_size, p.context_pad
        x1, y1, x2, y2 = window[3:]
        rows, cols = img.shape[:2]
        out_w = out_h = crop
        pad_w = pad_h = 0
        if pad > 0 or p.crop_mode == "square":
            context_scale = f(crop) / f(crop - 2 * pad)
            half_h, half_w = f(y2 - y1 + 1) / f(2.0), f(x2 - x1 + 1) / f(2.0)
            cx, cy = f(x1) + half_w, f(y1) + half_h
            if p.crop_mode == "square":
                half_h = half_w = max(half_h, half_w)
            x1 = c_round(float(cx - half_w * context_scale))
            x2 = c_round(float(cx + half_w * context_scale))
            y1 = c_round(float(cy - half_h * context_scale))
            y2 = c_round(float(cy + half_h * context_scale))
            unclipped_h, unclipped_w = y2 - y1 + 1, x2 - x1 + 1
            pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
            pad_x2, pad_y2 = max(0, x2 - cols + 1), max(0, y2 - rows + 1)
            x1, x2, y1, y2 = x1 + pad_x1, x2 - pad_x2, y1 + pad_y1, y2 - pad_y2
            scale_x, scale_y = f(crop) / f(unclipped_w), f(crop) / f(unclipped_h)
            out_w = c_round(float(f(x2 - x1 + 1) * scale_x))
            out_h = c_round(float(f(y2 - y1 + 1) * scale_y))
            pad_x1, pad_x2 = c_round(float(f(pad_x1) * scale_x)), c_round(float(f(pad_x2) * scale_x))
            pad_y1 = c_round(float(f(pad_y1) * scale_y))
            pad_h = pad_y1
            pad_w = pad_x2 if do_mirror else pad_x1
            out_h = min(out_h, crop - pad_h)
            out_w = min(out_w, crop - pad_w)
        if not (0 <= x1 <= x2 < cols and 0 <= y1 <= y2 < rows) or out_w <= 0 or out_h <= 0:
            raise DataError(f"{self.where}: window ({window[3]}, {window[4]}, {window[5]}, {window[6]}) of image "
                            f"{self.images[window[0]][0]} ({cols}x{rows}) does not fit the image")
        warped = self.cv2.resize(img[y1:y2 + 1, x1:x2 + 1], (out_w, out_h), interpolation=self.cv2.INTER_LINEAR)
        if do_mirror:
            warped = warped[:, ::-1]
        return warped.reshape(out_h, out_w, -1), pad_h, pad_w

    def _check_pools(self) -> None:
        p = self.layer_param.window_data_param
        if not self.fg or not self.bg:
            raise DataError(f"{self.where}: {p.source} has {len(self.fg)} foreground and {len(self.bg)} background "
                            "windows; batches need both (check fg_threshold and bg_threshold)")

    def _batch_windows(self) -> list[tuple[Any, bool]]:
        """The next batch's (window, mirror) pairs: background then foreground, drawn in BVLC's order."""
        p = self.layer_param.window_data_param
        mirror = self.layer_param.transform_param.mirror
        batch = p.batch_size
        num_fg = int(np.float32(batch) * np.float32(p.fg_fraction))
        self._check_pools()
        chosen = []
        for pool, count in ((self.bg, batch - num_fg), (self.fg, num_fg)):
            for _ in range(count):
                window = pool[self._draw() % len(pool)]
                do_mirror = bool(mirror) and self._draw() % 2 == 1
                chosen.append((window, do_mirror))
        return chosen

    def write_window(self, window, do_mirror: bool, out: np.ndarray) -> None:
        """One item: the window's pixels, less the mean, times scale, into the zeroed ``out`` (C, crop, crop)."""
        scale = float(np.float32(self.layer_param.window_data_param.scale))
        pixels, pad_h, pad_w = self.window_pixels(self._image(window[0]), window, do_mirror)
        h, w = pixels.shape[:2]
        values = pixels.transpose(2, 0, 1).astype(np.float64)
        if self.mean is not None:
            off = (self.mean.shape[2] - self.crop_size) // 2
            values = values - self.mean[:, off + pad_h:off + pad_h + h, off + pad_w:off + pad_w + w]
        elif self.mean_values is not None:
            values = values - self.mean_values[:, None, None]
        out[:, pad_h:pad_h + h, pad_w:pad_w + w] = values * scale

    def forward_cpu(self, bottom, top):
        if self._parallel is not None:
            self._parallel.fill(top, gpu=False)
            return
        chosen = self._batch_windows()  # (draws before reads, as BVLC's loop: reads draw nothing)
        data = top[0].mutable_cpu_data()
        labels = top[1].mutable_cpu_data()
        data[...] = 0
        for item, (window, do_mirror) in enumerate(chosen):
            self.write_window(window, do_mirror, data[item])
            labels[item] = window[1]

    forward_gpu = forward_cpu  # host batches; the device copy syncs when the next layer reads it



@dataclass
class _WindowJob:
    """A worker's part: the window's item (:meth:`WindowDataLayer.write_window`) and its label. The
    worker reads the layer through ``layer``, a weak reference to the parent's layer, which the
    forked worker holds a copy of."""

    layer: Any

    def open(self) -> None:
        layer = self.layer()
        if layer is None:
            raise DataError("the WindowData layer is gone")
        layer.cv2.setNumThreads(0)  # (OpenCV's thread pool does not survive fork: decode serially)

    def load(self, ref: Any, batches: data_workers.SharedBatches, slot: int, i: int) -> None:
        window, do_mirror = ref
        out = batches.data[slot][i]
        out[...] = 0
        self.layer().write_window(window, do_mirror, out)
        batches.labels[slot][i] = window[1]


class _ParallelWindows(ParallelBatches):
    """WindowData's parallel path: the loader's thread draws the windows and flips."""

    def __init__(self, layer: WindowDataLayer, workers: int) -> None:
        shape = (layer.channels, layer.crop_size, layer.crop_size)
        super().__init__(None, layer.layer_param.window_data_param.batch_size, 4, layer.dtype, layer.where,
                         workers, shape, False)
        self.layer = weakref.proxy(layer)
        self._job = _WindowJob(weakref.ref(layer))

    def job(self) -> data_workers.Job:
        return self._job

    def plan(self, slot: int, now: bool) -> tuple[list, None]:
        return self.layer._batch_windows(), None
