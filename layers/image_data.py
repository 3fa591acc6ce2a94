"""ImageData: batches of image files listed with labels in a text file (BVLC's ImageDataLayer).

``image_data_param { source root_folder batch_size shuffle new_height new_width is_color
rand_skip }`` and ``transform_param`` (the deprecated ``scale mean_file crop_size mirror`` of
``image_data_param`` fill in what ``transform_param`` leaves unset). Each line of ``source`` is
``<path> <label>`` (the label follows the last space, so paths may hold spaces); images are read
from ``root_folder + path`` with Pillow, in BGR channel order for colour (``is_color``, the
default; gray images are expanded to 3 channels) or as 1 gray channel, resized with bilinear
interpolation (OpenCV's ``INTER_LINEAR`` half-pixel rule, rounded to uint8) to
``new_height x new_width`` when both are set. Tops ``data`` ``(batch_size, C, h, w)`` (shaped by
the first image of each batch) and ``label`` ``(batch_size,)``. Lines are read in order and wrap
after the last; with ``shuffle`` the list is shuffled at set-up and at every wrap, with
``pycaffe_lite.common.rng()``. ``rand_skip`` skips a random number (< rand_skip) of lines at set-up.
``read_state()`` / ``restore_read_state()`` give and set the next line, the shuffled order and the
crop/mirror random state (kept in solver snapshots for an exact resume).

With worker processes (``image_data_param.workers``, pycaffe-lite's field 1001, or
``$PYCAFFE_LITE_DATA_WORKERS``; automatic by default: the usable cores less one when
``new_height``/``new_width`` are set and a batch holds 1 MiB of pixels or more) the images are read,
decoded, resized and transformed in the workers while a loader thread walks the list and draws the
crop/mirror choices in the single-thread order (the Data layer's machinery,
``pycaffe_lite/data/parallel.py``: uint8 batches transformed on the device in GPU mode). Batches are the single-thread path's; a
batch that reaches the end of a shuffled list is planned in its own forward (the reshuffle draws
from ``common.rng()`` in forward order), so the workers idle once an epoch. Every image must then
have the first one's shape (always so with ``new_height``/``new_width``); a failure names the file
and its line.
"""

from __future__ import annotations

import json
import logging
import os
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.data import workers as data_workers
from pycaffe_lite.data.order import Order
from pycaffe_lite.data.parallel import ParallelBatches, StopsReaders, TransformingJob
from pycaffe_lite.data.transformer import DataTransformer
from pycaffe_lite.errors import DataError
from pycaffe_lite.io import resize
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.optional import require
from pycaffe_lite.schema import caffe_pb2

log = logging.getLogger("pycaffe_lite")

_LEGACY_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


def read_image_list(source: str, where: str) -> list[tuple[str, int, int]]:
    """``(path, label, line number)`` for each non-blank line ``<path> <label>`` of ``source``."""
    if not source:
        raise DataError(f"{where}: image_data_param.source is empty (expected a text file of 'path label' lines)")
    try:
        with open(source, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise DataError(f"{where}: cannot open source file {source}: {exc.strerror or exc}") from None
    lines = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        path, sep, label = line.rpartition(" ")
        try:
            if not sep or not path:
                raise ValueError
            value = int(label)
        except ValueError:
            raise DataError(f"{where}: {source} line {number}: expected '<path> <integer label>', "
                            f"got {line!r}") from None
        lines.append((path.rstrip(), value, number))
    if not lines:
        raise DataError(f"{where}: source file {source} is empty (no 'path label' lines)")
    return lines


def read_image(path: str, new_height: int, new_width: int, is_color: bool) -> np.ndarray:
    """The image at ``path`` as ``(C, H, W)`` uint8: BGR (C=3) if ``is_color`` else gray (C=1),
    resized when ``new_height`` and ``new_width`` are positive. Raises OSError if unreadable."""
    from PIL import Image

    with Image.open(path) as img:
        img.load()
        if is_color:
            arr = np.asarray(img.convert("RGB"), dtype=np.uint8)[:, :, ::-1].transpose(2, 0, 1)
        else:
            arr = np.asarray(img.convert("L"), dtype=np.uint8)[None]
    arr = np.ascontiguousarray(arr)
    if new_height > 0 and new_width > 0:
        # OpenCV INTER_LINEAR on uint8, as Caffe's ReadImageToCVMat
        arr = np.clip(np.rint(resize(arr, new_height, new_width, axes=(1, 2))), 0, 255).astype(np.uint8)
    return arr


@register_layer("ImageData")
class ImageDataLayer(StopsReaders, Layer):
    traits = Traits()  # a host-side reader: runs plainly before a replayed graph
    exact_num_bottom_blobs = 0
    exact_num_top_blobs = 2

    def layer_setup(self, bottom, top):
        p = self.layer_param.image_data_param
        self.new_height, self.new_width = int(p.new_height), int(p.new_width)
        if not ((self.new_height == 0 and self.new_width == 0) or (self.new_height > 0 and self.new_width > 0)):
            raise self.error(f"image_data_param needs new_height and new_width both set (positive) or both 0, "
                             f"got {self.new_height} and {self.new_width}")
        if p.batch_size <= 0:
            raise self.error(f"image_data_param.batch_size must be positive, got {p.batch_size}")
        self.batch_size = int(p.batch_size)
        self.is_color = bool(p.is_color)
        self.root_folder = p.root_folder
        self.shuffle = bool(p.shuffle)
        require("PIL.Image", feature=self.where)
        tp = caffe_pb2.TransformationParameter()
        tp.CopyFrom(self.layer_param.transform_param)
        for field in _LEGACY_TRANSFORM_FIELDS:
            if p.HasField(field) and not tp.HasField(field):
                setattr(tp, field, getattr(p, field))
        self.transformer = DataTransformer(tp, self.phase, self.dtype, where=self.where)
        self.listed = read_image_list(p.source, self.where)
        self.order = Order(len(self.listed))
        if self.shuffle:
            self.order.shuffle()
        self.line_id = 0
        if p.rand_skip:
            skip = int(common.rng().integers(p.rand_skip))
            if skip >= len(self.listed):
                raise DataError(f"{self.where}: rand_skip drew {skip}, but {p.source} has only "
                                f"{len(self.listed)} lines (not enough points to skip)")
            self.line_id = skip
        first = self._read(self.line_id)
        shape = self.transformer.infer_shape(first)
        top[0].reshape((self.batch_size, *shape))
        top[1].reshape((self.batch_size,))
        self._parallel: _ParallelImages | None = None
        self._stats: list = [0, 0, 0.0]
        resized = self.new_height > 0 and self.new_width > 0
        heavy = resized and self.batch_size * first.size >= data_workers.HEAVY_BATCH_BYTES
        ranks = common.solver_count() if self.phase == common.TRAIN else 1
        workers = data_workers.worker_count(p.workers, heavy, ranks)
        if workers > 0:
            self._start_parallel(workers, tuple(int(d) for d in first.shape), data_workers.automatic(p.workers))

    def _start_parallel(self, workers: int, shape: tuple[int, int, int], automatic: bool) -> None:
        """Read through ``workers`` processes (a failure: ``ParallelBatches.try_start``)."""
        parallel = _ParallelImages(self, workers, shape, common.mode() is common.Mode.GPU)
        if parallel.try_start(automatic, "on the calling thread"):
            self._parallel = parallel
            self.stop_with_layer(parallel.stop)

    def _line(self, line_id: int) -> tuple[str, int, int]:
        """The ``line_id``-th line of the (shuffled) list: ``(path, label, line number)``."""
        return self.listed[self.order.order[line_id]]

    def read_state(self) -> tuple[int, bytes, str]:
        """(next line, its path, JSON of the shuffle and transform random states)."""
        if self._parallel is not None:
            return self._parallel.next
        return self._state()

    def _state(self) -> tuple[int, bytes, str]:
        rng = {"order": self.order.drawn_from, "transform": self.transformer.rng.bit_generator.state}
        return self.line_id, self._line(self.line_id)[0].encode(), json.dumps(rng)

    def restore_read_state(self, position: int, key: bytes, rng_state: str, where: str = "") -> None:
        """Continue from a state given by ``read_state``."""
        parallel = self._parallel
        if parallel is not None:  # the loader's thread plans ahead: stop it before changing the state
            self.detach_readers()
            parallel.stop()
            self._parallel = None
        try:
            rng = json.loads(rng_state)
            self.order.redraw(rng["order"])
            self.transformer.rng.bit_generator.state = rng["transform"]
        except (ValueError, TypeError, KeyError) as exc:
            raise DataError(f"{where or self.where}: cannot restore the random state: {exc}") from None
        if not 0 <= position < len(self.listed) or self._line(position)[0].encode() != key:
            raise DataError(f"{where or self.where}: cannot restore the read position: line {position} of "
                            f"the shuffled list is not {key.decode(errors='replace')!r} (was "
                            f"{self.layer_param.image_data_param.source} changed?)")
        self.line_id = int(position)
        if parallel is not None:
            self._start_parallel(parallel.workers, parallel.shape, automatic=False)

    def _read(self, line_id: int) -> np.ndarray:
        path, _, number = self._line(line_id)
        full = self.root_folder + path
        if not os.path.isfile(full):
            raise DataError(f"{self.where}: image file {full} not found "
                            f"({self.layer_param.image_data_param.source} line {number})")
        try:
            return read_image(full, self.new_height, self.new_width, self.is_color)
        except Exception as exc:
            raise DataError(f"{self.where}: could not load image {full} "
                            f"({self.layer_param.image_data_param.source} line {number}): {exc}") from None

    def reshape(self, bottom, top):
        """Tops take the shape of each batch's first image in forward."""

    def forward_cpu(self, bottom, top):
        if self._parallel is not None:
            self._parallel.next = self._parallel.fill(top, gpu=False)
            self._count(self._parallel.waited)
            return
        self._single_thread_forward(top)
        self._count(0.0)

    def forward_gpu(self, bottom, top):
        if self._parallel is not None:  # uint8 images transformed on the device
            self._parallel.next = self._parallel.fill(top, gpu=True)
            self._count(self._parallel.waited)
            return
        self._single_thread_forward(top)  # the device copy syncs when the next layer reads it
        self._count(0.0)

    def _count(self, waited: float) -> None:
        self._stats[0] += 1
        self._stats[1] += self.batch_size
        self._stats[2] += waited

    def data_stats(self) -> tuple[int, int, float]:
        """(batches, images, seconds waited for them) served by forward so far."""
        return self._stats[0], self._stats[1], self._stats[2]


    def _single_thread_forward(self, top) -> None:
        first = self._read(self.line_id)
        top[0].reshape((self.batch_size, *self.transformer.infer_shape(first)))
        top[1].reshape((self.batch_size,))
        data = top[0].mutable_cpu_data()
        labels = top[1].mutable_cpu_data()
        for i in range(self.batch_size):
            img = first if i == 0 else self._read(self.line_id)
            if img.shape != first.shape:
                path, _, number = self._line(self.line_id)
                raise DataError(f"{self.where}: image {self.root_folder + path} (line {number}) has shape "
                                f"{img.shape}, the first image of its batch has {first.shape} (set new_height/"
                                "new_width or batch_size 1 for images of different sizes)")
            self.transformer.transform(img, out=data[i])
            labels[i] = self._line(self.line_id)[1]
            self.line_id += 1
            if self.line_id >= len(self.listed):
                self.line_id = 0
                if self.shuffle:
                    self.order.shuffle()


@dataclass
class _ImageJob(TransformingJob):
    """A worker's part for ImageData: read, decode and resize one listed image, check its shape,
    write it as uint8 (``raw``) or transformed with the parent's draws, and its label."""

    root_folder: str
    source: str
    new_height: int
    new_width: int
    is_color: bool
    param: bytes  # TransformationParameter
    phase: int
    dtype: str
    where: str
    shape: tuple[int, int, int]
    raw: bool

    def load(self, ref: Any, batches: data_workers.SharedBatches, slot: int, i: int) -> None:
        path, label, number = ref
        full = self.root_folder + path
        if not os.path.isfile(full):
            raise DataError(f"{self.where}: image file {full} not found ({self.source} line {number})")
        try:
            img = read_image(full, self.new_height, self.new_width, self.is_color)
        except Exception as exc:
            raise DataError(f"{self.where}: could not load image {full} ({self.source} line {number}): {exc}") from None
        if img.shape != self.shape:
            raise data_workers.ItemShapeError(
                f"{self.where}: image {full} (line {number}) has shape {img.shape}, the first image has "
                f"{self.shape} (with data workers every image must match: set new_height/new_width, or "
                "workers: 0)")
        data_workers.store_item(batches, slot, i, img, label, self.raw, self.transformer)


class _ParallelImages(ParallelBatches):
    """ImageData's parallel path: the loader's thread walks the (shuffled) list; a batch that
    reaches its end under ``shuffle`` is :class:`~pycaffe_lite.data.workers.Deferred` to its forward."""

    def __init__(self, layer: ImageDataLayer, workers: int, shape: tuple[int, int, int], raw: bool) -> None:
        p = layer.layer_param.image_data_param
        super().__init__(layer.transformer, layer.batch_size, 4, layer.dtype, layer.where, workers, shape, raw)
        self._job = _ImageJob(layer.root_folder, p.source, layer.new_height, layer.new_width, layer.is_color,
                              layer.transformer.param.SerializeToString(), layer.phase, layer.dtype.str,
                              layer.where, shape, raw)
        self.layer = weakref.proxy(layer)  # (the loader's thread must not keep the layer alive)
        self.next = layer._state()

    def job(self) -> data_workers.Job:
        return self._job

    def plan(self, slot: int, now: bool) -> tuple[list, tuple[int, bytes, str]]:
        assert self.loader is not None
        layer = self.layer
        if layer.shuffle and not now and layer.line_id + self.batch_size >= len(layer.listed):
            raise data_workers.Deferred
        draws = self.loader.batches.draws[slot]
        refs: list = []
        for i in range(self.batch_size):
            refs.append(layer._line(layer.line_id))
            draws[i] = self.transformer.draw(self.shape)
            layer.line_id += 1
            if layer.line_id >= len(layer.listed):
                layer.line_id = 0
                if layer.shuffle:
                    layer.order.shuffle()
        return refs, layer._state()
