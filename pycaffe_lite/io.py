"""pycaffe's ``caffe.io``: proto/array conversions, input preprocessing, image loading.

Images are float arrays (H, W, K) in [0, 1] as skimage gives them; nets take (K, H, W).
Loading uses Pillow; resizing is numpy (bilinear or nearest, half-pixel centers, edges clamped).
"""

from __future__ import annotations

import io as _io
import os
from collections.abc import Sequence

import numpy as np

from .errors import DataError
from .memcheck import out_of_memory
from .optional import require
from .schema import blob_values, caffe_pb2

# ------------------------------------------------------------------------------------------
# proto / datum / ndarray conversion


def blobproto_to_array(blob: caffe_pb2.BlobProto, return_diff: bool = False) -> np.ndarray:
    """The data (or diff) of a BlobProto as a float64 array of its shape (legacy 4-d fields or
    ``shape``), from whichever field holds it (NVCaffe's ``raw_data`` in fp16 or bf16 included)."""
    values = blob_values.read_values(blob, return_diff, "BlobProto")
    data = np.zeros(0) if values is None else values.astype(np.float64)
    if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
        shape: tuple[int, ...] = (blob.num, blob.channels, blob.height, blob.width)
    else:
        shape = tuple(blob.shape.dim)
    if int(np.prod(shape)) != data.size:
        raise ValueError(f"BlobProto holds {data.size} values but its shape {shape} needs {int(np.prod(shape))}")
    return data.reshape(shape)


def array_to_blobproto(arr: np.ndarray, diff: np.ndarray | None = None) -> caffe_pb2.BlobProto:
    """A BlobProto with ``shape`` = arr.shape and float data (and diff, same shape, if given)."""
    arr = np.asarray(arr)
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend(arr.shape)
    blob.data.extend(arr.astype(float).flat)
    if diff is not None:
        diff = np.asarray(diff)
        if diff.shape != arr.shape:
            raise ValueError(f"diff shape {diff.shape} differs from data shape {arr.shape}")
        blob.diff.extend(diff.astype(float).flat)
    return blob


def arraylist_to_blobprotovector_str(arraylist: Sequence[np.ndarray]) -> bytes:
    """Serialized BlobProtoVector holding ``arraylist``."""
    vec = caffe_pb2.BlobProtoVector()
    vec.blobs.extend([array_to_blobproto(arr) for arr in arraylist])
    return vec.SerializeToString()


arraylist_to_blobprotovecor_str = arraylist_to_blobprotovector_str  # BVLC's older (misspelled) name


def blobprotovector_str_to_arraylist(data: bytes) -> list[np.ndarray]:
    """Arrays of a serialized BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    vec.ParseFromString(data)
    return [blobproto_to_array(blob) for blob in vec.blobs]


def array_to_datum(arr: np.ndarray, label: int | None = None) -> caffe_pb2.Datum:
    """A Datum from a (C, H, W) array: uint8 arrays go to ``data`` bytes, others to ``float_data``."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise ValueError(f"array_to_datum needs a 3-d (C, H, W) array, got shape {arr.shape}")
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = arr.shape
    if arr.dtype == np.uint8:
        datum.data = arr.tobytes()
    else:
        datum.float_data.extend(arr.astype(float).flat)
    if label is not None:
        datum.label = int(label)
    return datum


def datum_to_array(datum: caffe_pb2.Datum) -> np.ndarray:
    """The (C, H, W) array of a Datum (uint8 from ``data``, float from ``float_data``; the label
    is ``datum.label``). Encoded datums are decoded with Pillow, color as BGR like Caffe."""
    if datum.encoded:
        return _decode_datum(datum)
    if len(datum.data):
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(datum.channels, datum.height, datum.width)
    return np.array(datum.float_data).astype(float).reshape(datum.channels, datum.height, datum.width)


def _decode_datum(datum: caffe_pb2.Datum) -> np.ndarray:
    Image = _pil()
    with Image.open(_io.BytesIO(datum.data)) as img:
        gray = img.mode in ("L", "1", "I;16", "I", "F")
        arr = np.asarray(img.convert("L" if gray else "RGB"))
    if arr.ndim == 2:
        return arr[None]
    return arr[:, :, ::-1].transpose(2, 0, 1).copy()


# ------------------------------------------------------------------------------------------
# preprocessing


class Transformer:
    """Prepare (H, W, K) images for a net's inputs and invert it.

    ``inputs``: {input name: blob shape (N, K, H, W)}. ``preprocess`` does, in order: convert to
    float32, resize to (H, W), transpose, channel swap, raw scale, mean subtraction, input scale.
    """

    def __init__(self, inputs: dict[str, Sequence[int]]) -> None:
        self.inputs = {k: tuple(v) for k, v in inputs.items()}
        self.transpose: dict[str, tuple[int, ...]] = {}
        self.channel_swap: dict[str, tuple[int, ...]] = {}
        self.raw_scale: dict[str, float] = {}
        self.mean: dict[str, np.ndarray] = {}
        self.input_scale: dict[str, float] = {}

    def _check_input(self, in_: str) -> None:
        if in_ not in self.inputs:
            raise KeyError(f"{in_} is not one of the net inputs: {list(self.inputs)}")

    def preprocess(self, in_: str, data: np.ndarray) -> np.ndarray:
        """(H', W', K) image -> (K, H, W) float32 net input."""
        self._check_input(in_)
        caffe_in = np.asarray(data).astype(np.float32, copy=True)
        in_dims = self.inputs[in_][2:]
        if caffe_in.shape[:2] != in_dims:
            caffe_in = resize_image(caffe_in, in_dims)
        transpose = self.transpose.get(in_)
        if transpose is not None:
            caffe_in = caffe_in.transpose(transpose)
        channel_swap = self.channel_swap.get(in_)
        if channel_swap is not None:
            caffe_in = caffe_in[list(channel_swap), :, :]
        raw_scale = self.raw_scale.get(in_)
        if raw_scale is not None:
            caffe_in *= raw_scale
        mean = self.mean.get(in_)
        if mean is not None:
            caffe_in -= mean
        input_scale = self.input_scale.get(in_)
        if input_scale is not None:
            caffe_in *= input_scale
        return caffe_in

    def deprocess(self, in_: str, data: np.ndarray) -> np.ndarray:
        """Invert :meth:`preprocess` (except resizing): (K, H, W) -> (H, W, K)."""
        self._check_input(in_)
        decaf_in = np.array(data, copy=True).squeeze()
        input_scale = self.input_scale.get(in_)
        if input_scale is not None:
            decaf_in /= input_scale
        mean = self.mean.get(in_)
        if mean is not None:
            decaf_in += mean
        raw_scale = self.raw_scale.get(in_)
        if raw_scale is not None:
            decaf_in /= raw_scale
        channel_swap = self.channel_swap.get(in_)
        if channel_swap is not None:
            decaf_in = decaf_in[np.argsort(channel_swap), :, :]
        transpose = self.transpose.get(in_)
        if transpose is not None:
            decaf_in = decaf_in.transpose(np.argsort(transpose))
        return decaf_in

    def set_transpose(self, in_: str, order: Sequence[int]) -> None:
        """Axis order taking the image (H, W, K) to the net's (K, H, W), e.g. (2, 0, 1)."""
        self._check_input(in_)
        if len(order) != len(self.inputs[in_]) - 1:
            raise ValueError(
                f"transpose order {tuple(order)} needs {len(self.inputs[in_]) - 1} axes like input '{in_}'"
            )
        self.transpose[in_] = tuple(order)

    def set_channel_swap(self, in_: str, order: Sequence[int]) -> None:
        """Channel order after the transpose, e.g. (2, 1, 0) for RGB -> BGR."""
        self._check_input(in_)
        if len(order) != self.inputs[in_][1]:
            raise ValueError(
                f"channel swap {tuple(order)} needs {self.inputs[in_][1]} entries (input '{in_}' channels)"
            )
        self.channel_swap[in_] = tuple(order)

    def set_raw_scale(self, in_: str, scale: float) -> None:
        """Scale applied before the mean (e.g. 255 for models trained on [0, 255] pixels)."""
        self._check_input(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_: str, mean: np.ndarray) -> None:
        """Mean to subtract: per channel (K,) or elementwise (K, H, W) / (H, W)."""
        self._check_input(in_)
        mean = np.asarray(mean)
        ms = mean.shape
        if mean.ndim == 1:
            if ms[0] != self.inputs[in_][1]:
                raise ValueError(
                    f"mean has {ms[0]} channels but input '{in_}' has {self.inputs[in_][1]}"
                )
            mean = mean[:, np.newaxis, np.newaxis]
        else:
            if len(ms) == 2:
                ms = (1,) + ms
            if len(ms) != 3:
                raise ValueError(f"mean shape {mean.shape} invalid: expected (K,), (H, W) or (K, H, W)")
            if ms != self.inputs[in_][1:]:
                raise ValueError(
                    f"mean shape {mean.shape} incompatible with input '{in_}' shape {self.inputs[in_][1:]}"
                )
        self.mean[in_] = mean

    def set_input_scale(self, in_: str, scale: float) -> None:
        """Scale applied after the mean subtraction."""
        self._check_input(in_)
        self.input_scale[in_] = scale


# ------------------------------------------------------------------------------------------
# image IO


def _pil():
    return require("PIL.Image", feature="image loading")


def oversized_image(filename, exc: Exception) -> DataError:
    """The project error for an image larger than PIL's decompression-bomb limit."""
    return DataError(f"{filename}: image too large to load ({exc}); shrink it first")


def load_image(filename: str | os.PathLike, color: bool = True) -> np.ndarray:
    """An image as float32 in [0, 1]: (H, W, 3) RGB when ``color``, else (H, W, 1) for grayscale
    files (color files stay (H, W, 3)). Alpha is dropped."""
    Image = _pil()
    try:
        img = Image.open(os.fspath(filename))
        img.load()
    except (OSError, ValueError) as exc:
        raise OSError(f"{filename}: cannot read image: {exc}") from None
    except Image.DecompressionBombError as exc:
        raise oversized_image(filename, exc) from None
    except MemoryError:
        raise out_of_memory(f"the pixels of image {filename}") from None
    mode = img.mode
    if mode == "1":
        arr = np.asarray(img.convert("L"), dtype=np.float64) / 255.0
    elif mode in ("L", "LA"):
        arr = np.asarray(img.convert("L"), dtype=np.float64) / 255.0
    elif mode.startswith("I;16"):
        arr = np.asarray(img, dtype=np.float64) / 65535.0
    elif mode == "I":
        arr = np.asarray(img, dtype=np.float64) / float(2**31 - 1)
    elif mode == "F":
        arr = np.asarray(img, dtype=np.float64)
    elif mode in ("RGB", "RGBA"):
        arr = np.asarray(img, dtype=np.float64) / 255.0
    else:  # palette, CMYK, YCbCr...
        arr = np.asarray(img.convert("RGB"), dtype=np.float64) / 255.0
    img.close()
    arr = arr.astype(np.float32)
    if arr.ndim == 2:
        arr = arr[:, :, np.newaxis]
        if color:
            arr = np.tile(arr, (1, 1, 3))
    elif arr.shape[2] == 4:
        arr = arr[:, :, :3]
    return arr


def _interp_axis(im: np.ndarray, axis: int, new: int, order: int) -> np.ndarray:
    old = im.shape[axis]
    if old == new:
        return im
    # Output pixel centers mapped into input coordinates (half-pixel convention).
    pos = (np.arange(new, dtype=np.float64) + 0.5) * (old / new) - 0.5
    pos = np.clip(pos, 0, old - 1)
    if order == 0:
        idx = np.minimum(np.floor(pos + 0.5).astype(np.intp), old - 1)
        return np.take(im, idx, axis=axis)
    lo = np.floor(pos).astype(np.intp)
    hi = np.minimum(lo + 1, old - 1)
    frac = pos - lo
    shape = [1] * im.ndim
    shape[axis] = new
    frac = frac.reshape(shape)
    return np.take(im, lo, axis=axis) * (1 - frac) + np.take(im, hi, axis=axis) * frac


def resize(im: np.ndarray, height: int, width: int, interp_order: int = 1,
           axes: tuple[int, int] = (0, 1)) -> np.ndarray:
    """The one image resize: axes ``axes`` (rows, columns) of ``im`` to ``height`` x ``width``, float64.

    ``interp_order`` 1: bilinear, 0: nearest neighbour. Output pixel centers map to input
    coordinate ``(dst + 0.5) * in / out - 0.5``, clamped at the borders: OpenCV's INTER_LINEAR
    (Caffe's ImageData) and skimage's ``resize(order=1, mode='edge')`` without anti-aliasing
    (pycaffe's :func:`resize_image`) agree on this.
    """
    if interp_order not in (0, 1):
        raise ValueError(f"resize supports interp_order 0 (nearest) or 1 (bilinear), got {interp_order}")
    if height <= 0 or width <= 0:
        raise ValueError(f"resize: sizes must be positive, got {height}x{width}")
    out = np.asarray(im, dtype=np.float64)
    out = _interp_axis(out, axes[0], height, interp_order)
    return _interp_axis(out, axes[1], width, interp_order)


def _interp_axis_zero_beyond(im: np.ndarray, axis: int, new: int) -> np.ndarray:
    """Linear interpolation along ``axis`` with half-pixel centres, reading 0 beyond the edges
    (skimage's ``resize(order=1, mode='constant', cval=0)``; only upscaling reaches past them)."""
    old = im.shape[axis]
    if old == new:
        return im
    pos = (np.arange(new, dtype=np.float64) + 0.5) * (old / new) - 0.5
    pad = [(0, 0)] * im.ndim
    pad[axis] = (1, 1)
    padded = np.pad(im, pad)  # zeros at index 0 and old + 1
    lo = np.floor(pos).astype(np.intp)
    frac = (pos - lo).reshape([new if a == axis else 1 for a in range(im.ndim)])
    return np.take(padded, lo + 1, axis=axis) * (1 - frac) + np.take(padded, lo + 2, axis=axis) * frac


def _interp_axis_corners(im: np.ndarray, axis: int, new: int) -> np.ndarray:
    """Linear interpolation along ``axis`` with the first and last samples on the corners
    (``scipy.ndimage.zoom(order=1)``): output i reads input ``i * (old - 1) / (new - 1)``."""
    old = im.shape[axis]
    if old == new:
        return im
    step = (old - 1) / (new - 1) if new > 1 else 1.0
    pos = np.arange(new, dtype=np.float64) * step
    lo = np.minimum(np.floor(pos).astype(np.intp), old - 1)
    hi = np.minimum(lo + 1, old - 1)
    frac = (pos - lo).reshape([new if a == axis else 1 for a in range(im.ndim)])
    return np.take(im, lo, axis=axis) * (1 - frac) + np.take(im, hi, axis=axis) * frac


def resize_image(im: np.ndarray, new_dims: Sequence[int] | np.ndarray, interp_order: int = 1) -> np.ndarray:
    """pycaffe's resize: an (H, W, K) image to (new_dims[0], new_dims[1], K) float32, value for
    value as BVLC's ``caffe.io.resize_image``.

    K of 1 or 3 (BVLC: skimage): the image is scaled to [0, 1] by its min and max, resized with
    half-pixel centres and zeros beyond the edges (so upscaled borders lean towards the image's
    minimum), and scaled back; a constant image stays constant. Other K (BVLC: scipy's zoom):
    corner-aligned linear interpolation. ``interp_order`` 0 is nearest neighbour (:func:`resize`).
    """
    im = np.asarray(im)
    if im.ndim != 3:
        raise ValueError(f"resize_image needs an (H, W, K) array, got shape {im.shape}")
    h, w = (int(d) for d in new_dims[:2])
    if h <= 0 or w <= 0:
        raise ValueError(f"resize_image: sizes must be positive, got {h}x{w}")
    if interp_order == 0:
        return resize(im, h, w, 0).astype(np.float32)
    if interp_order != 1:
        raise ValueError(f"resize_image supports interp_order 0 (nearest) or 1 (bilinear), got {interp_order}")
    x = im.astype(np.float64)
    if im.shape[-1] in (1, 3):
        lo, hi = float(x.min()), float(x.max())
        if hi <= lo:
            return np.full((h, w, im.shape[-1]), lo, dtype=np.float32)
        unit = (x - lo) / (hi - lo)
        unit = _interp_axis_zero_beyond(_interp_axis_zero_beyond(unit, 0, h), 1, w)
        return (unit * (hi - lo) + lo).astype(np.float32)
    return _interp_axis_corners(_interp_axis_corners(x, 0, h), 1, w).astype(np.float32)


def oversample(images: Sequence[np.ndarray] | np.ndarray, crop_dims: Sequence[int] | np.ndarray) -> np.ndarray:
    """Ten crops per (H, W, K) image: 4 corners and center, then the same five mirrored
    left-right. Returns (10 * N, crop_h, crop_w, K) float32."""
    im_shape = np.array(images[0].shape)
    ch, cw = (int(d) for d in crop_dims[:2])
    if ch > im_shape[0] or cw > im_shape[1]:
        raise ValueError(f"crop {ch}x{cw} is larger than the images ({im_shape[0]}x{im_shape[1]})")
    starts = [(i, j) for i in (0, im_shape[0] - ch) for j in (0, im_shape[1] - cw)]
    starts.append((int(im_shape[0] / 2.0 - ch / 2.0), int(im_shape[1] / 2.0 - cw / 2.0)))
    crops = np.empty((10 * len(images), ch, cw, im_shape[-1]), dtype=np.float32)
    ix = 0
    for im in images:
        for i, j in starts:
            crops[ix] = im[i : i + ch, j : j + cw, :]
            ix += 1
        crops[ix : ix + 5] = crops[ix - 5 : ix, :, ::-1, :]
        ix += 5
    return crops
