"""Caffe's DataTransformer: ``TransformationParameter`` applied to one ``Datum`` (or array).

For each value: ``(x - mean) * scale`` where ``mean`` is the ``mean_file`` BlobProto (indexed at
the uncropped position), the per-channel ``mean_value`` (one value is used for every channel) or
nothing. ``crop_size`` crops a square at a random offset in TRAIN and at the centre in TEST;
``mirror`` flips left-right with probability 1/2 (in every phase, as Caffe does). Datum values
are the raw ``data`` bytes (uint8), else ``float_data``; ``encoded`` data is decoded with Pillow
(colour in BGR order as OpenCV gives it to Caffe, ``force_color`` / ``force_gray`` as in Caffe).
"""

from __future__ import annotations

import io
import math

import numpy as np

from .. import common
from ..blob import proto_shape
from ..errors import DataError, PrototxtError, ShapeError
from ..optional import require
from ..proto import protoio
from ..schema import blob_values, caffe_pb2


def decode_datum(datum: caffe_pb2.Datum, force_color: bool = False, force_gray: bool = False,
                 where: str = "datum") -> np.ndarray:
    """The values of ``datum`` as ``(C, H, W)``: uint8 for raw or encoded data, float32 for
    ``float_data``."""
    if datum.encoded:
        return _decode_image(datum.data, force_color, force_gray, where)
    c, h, w = datum.channels, datum.height, datum.width
    if c <= 0 or h <= 0 or w <= 0:
        raise DataError(f"{where}: Datum has shape ({c}, {h}, {w}); every dimension must be positive")
    n = c * h * w
    if datum.data:
        if len(datum.data) != n:
            raise DataError(f"{where}: Datum data holds {len(datum.data)} bytes, shape ({c}, {h}, {w}) needs {n}")
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(c, h, w)
    if len(datum.float_data) != n:
        raise DataError(
            f"{where}: Datum float_data holds {len(datum.float_data)} values, shape ({c}, {h}, {w}) needs {n}"
        )
    return np.asarray(datum.float_data, dtype=np.float32).reshape(c, h, w)


def decode_image(data: bytes, force_color: bool = False, force_gray: bool = False, where: str = "image") -> np.ndarray:
    """An encoded image (JPEG, PNG, ...) as uint8 ``(C, H, W)``: BGR colour, or one channel for a
    grayscale image (or ``force_gray``); ``force_color`` makes a grayscale image 3 channels."""
    return _decode_image(data, force_color, force_gray, where)


def _decode_image(data: bytes, force_color: bool, force_gray: bool, where: str) -> np.ndarray:
    if force_color and force_gray:
        raise DataError(f"{where}: cannot set both force_color and force_gray")
    Image = require("PIL.Image", feature=f"{where}: decoding an encoded Datum")
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except Exception as exc:
        raise DataError(f"{where}: cannot decode the encoded Datum image: {exc}") from None
    gray = force_gray or (not force_color and img.mode in ("L", "1", "I", "I;16", "F"))
    if gray:
        return np.ascontiguousarray(np.asarray(img.convert("L"), dtype=np.uint8)[None])
    rgb = img if img.mode == "RGB" else img.convert("RGB")
    arr = np.empty((3, rgb.height, rgb.width), np.uint8)  # BGR, CHW: Pillow's band split is the cheapest
    for c, band in enumerate(reversed(rgb.split())):  # de-interleave (a third of a 256x256 JPEG's decode time)
        arr[c] = np.asarray(band)
    return arr


def _check_finite(message, where: str, path: str) -> None:
    """DataError naming the field when a float of ``message`` (recursively) is NaN or infinite
    (``scale: nan`` would make every value NaN without a word)."""
    for field, value in message.ListFields():
        name = f"{path}.{field.name}"
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        values = value if repeated else [value]
        for v in values:
            if field.type == field.TYPE_MESSAGE:
                _check_finite(v, where, name)
            elif isinstance(v, float) and not math.isfinite(v):
                raise DataError(f"{where}: {name} is {v}; expected a finite number")


class DataTransformer:
    """``DataTransformer(param, phase, dtype)``; ``transform(datum)`` -> ``(C, h, w)`` of ``dtype``.

    ``rng`` (a numpy Generator) draws the crop offsets and mirror flips; by default one seeded
    from the process-wide generator, so ``set_random_seed`` makes runs repeatable.
    """

    def __init__(
        self,
        param: caffe_pb2.TransformationParameter | None = None,
        phase: int = common.TRAIN,
        dtype: np.dtype | type = np.float32,
        rng: np.random.Generator | None = None,
        where: str = "DataTransformer",
    ) -> None:
        self.param = param if param is not None else caffe_pb2.TransformationParameter()
        self.phase = int(phase)
        self.dtype = np.dtype(dtype)
        self.where = where
        self.rng = rng if rng is not None else np.random.default_rng(common.rng().integers(1 << 63))
        p = self.param
        _check_finite(p, where, "transform_param")
        if p.HasField("mean_file") and len(p.mean_value):
            raise DataError(f"{where}: cannot specify mean_file and mean_value at the same time")
        self.mean: np.ndarray | None = None
        if p.HasField("mean_file"):
            self.mean = load_mean_file(p.mean_file, where)
        elif len(p.mean_value):
            self.mean = np.asarray(p.mean_value, dtype=np.float64)

    def decode(self, datum: caffe_pb2.Datum) -> np.ndarray:
        return decode_datum(datum, self.param.force_color, self.param.force_gray, self.where)

    def infer_shape(self, values: np.ndarray | caffe_pb2.Datum) -> tuple[int, int, int]:
        """``(C, h, w)`` of the transformed output (h = w = crop_size when cropping)."""
        if isinstance(values, caffe_pb2.Datum):
            if values.encoded:
                values = self.decode(values)
            else:
                shape = (values.channels, values.height, values.width)
                return self._out_shape(shape)
        return self._out_shape(np.shape(values))

    def _out_shape(self, shape) -> tuple[int, int, int]:
        c, h, w = (int(d) for d in shape)
        crop = self.param.crop_size
        if crop:
            if h < crop or w < crop:
                raise ShapeError(f"{self.where}: crop_size {crop} is larger than the {h}x{w} input")
            return c, crop, crop
        return c, h, w

    def transform(self, values: np.ndarray | caffe_pb2.Datum, out: np.ndarray | None = None) -> np.ndarray:
        """Transform one ``(C, H, W)`` item (array or Datum) into ``out`` (allocated if None):
        :meth:`draw` then :meth:`apply`."""
        if isinstance(values, caffe_pb2.Datum):
            values = self.decode(values)
        values = np.asarray(values)
        if values.ndim != 3:
            raise ShapeError(f"{self.where}: expected a (C, H, W) item, got shape {values.shape}")
        out_shape = self._out_shape(values.shape)
        h_off, w_off, mirror = self._draw(values.shape, out_shape)
        return self._apply(values, h_off, w_off, mirror, out_shape, out)

    def draw(self, shape: tuple[int, ...]) -> tuple[int, int, bool]:
        """The random choices :meth:`transform` makes for one item of ``shape`` ``(C, H, W)``, drawn
        from :attr:`rng` in Caffe's order: row offset, column offset (TRAIN-phase crops), mirror
        (when ``mirror`` is set). Returns ``(h_off, w_off, mirror)``."""
        if len(shape) != 3:
            raise ShapeError(f"{self.where}: expected a (C, H, W) item, got shape {tuple(shape)}")
        return self._draw(shape, self._out_shape(shape))

    def _draw(self, shape: tuple[int, ...], out_shape: tuple[int, int, int]) -> tuple[int, int, bool]:
        p = self.param
        if p.crop_size:
            h, w, oh, ow = int(shape[1]), int(shape[2]), out_shape[1], out_shape[2]
            if self.phase == common.TRAIN:
                h_off = int(self.rng.integers(h - oh + 1))
                w_off = int(self.rng.integers(w - ow + 1))
            else:
                h_off, w_off = (h - oh) // 2, (w - ow) // 2
        else:
            h_off = w_off = 0
        mirror = bool(p.mirror) and bool(self.rng.integers(2))
        return h_off, w_off, mirror

    def apply(self, values: np.ndarray, h_off: int, w_off: int, mirror: bool,
              out: np.ndarray | None = None) -> np.ndarray:
        """The deterministic part of :meth:`transform`: crop at ``(h_off, w_off)``, subtract the
        mean, scale, flip left-right if ``mirror``; into ``out`` (allocated if None)."""
        if values.ndim != 3:
            raise ShapeError(f"{self.where}: expected a (C, H, W) item, got shape {values.shape}")
        return self._apply(values, h_off, w_off, mirror, self._out_shape(values.shape), out)

    def _apply(self, values: np.ndarray, h_off: int, w_off: int, mirror: bool, out_shape: tuple[int, int, int],
               out: np.ndarray | None) -> np.ndarray:
        oc, oh, ow = out_shape
        p = self.param
        x = values[:, h_off : h_off + oh, w_off : w_off + ow].astype(self.dtype)
        if self.mean is not None:
            x -= self._mean_for(self.mean, values.shape)[:, h_off : h_off + oh, w_off : w_off + ow]
        if p.scale != 1:
            x *= self.dtype.type(p.scale)
        if mirror:
            x = x[:, :, ::-1]
        if out is None:
            return np.ascontiguousarray(x)
        if out.shape != out_shape:
            raise ShapeError(f"{self.where}: output has shape {out.shape}, transform gives {out_shape}")
        out[...] = x
        return out

    def _mean_for(self, mean: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """``mean`` (:attr:`mean`) broadcast to ``(C, H, W)`` (before cropping), in the output dtype."""
        c, h, w = shape
        if self.param.HasField("mean_file"):
            if mean.shape != (c, h, w):
                raise ShapeError(
                    f"{self.where}: mean_file {self.param.mean_file} has shape {mean.shape}, the data "
                    f"items are {(c, h, w)}"
                )
            return mean.astype(self.dtype, copy=False)
        if len(mean) not in (1, c):
            raise ShapeError(
                f"{self.where}: specify either 1 mean_value or as many as channels ({c}), got {len(mean)}"
            )
        return np.broadcast_to(mean.astype(self.dtype).reshape(-1, 1, 1), (c, h, w))


def load_mean_file(path: str, where: str = "DataTransformer") -> np.ndarray:
    """A ``.binaryproto`` BlobProto mean as ``(C, H, W)`` float64 (leading num axis of 1 dropped)."""

    try:
        proto = protoio.read_binary(path, caffe_pb2.BlobProto(), "mean file (BlobProto)")
    except PrototxtError as exc:
        raise DataError(f"{where}: {exc}") from None
    shape = proto_shape(proto)
    try:
        values = blob_values.read_values(proto, False, f"{where}: {path}")
    except (PrototxtError, ShapeError) as exc:
        raise DataError(str(exc)) from None
    n = 0 if values is None else values.size
    if int(np.prod(shape)) != n:
        raise DataError(f"{where}: {path}: BlobProto holds {n} values, its shape {shape} needs "
                        f"{int(np.prod(shape))}")
    arr = (np.zeros(0) if values is None else values.astype(np.float64)).reshape(shape)
    while arr.ndim > 3 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 3:
        raise DataError(f"{where}: {path}: mean has shape {shape}; expected (1, C, H, W) or (C, H, W)")
    return arr
