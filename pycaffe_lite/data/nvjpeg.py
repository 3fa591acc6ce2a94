"""nvJPEG (the CUDA toolkit's JPEG decoder) through ctypes: the encoded Datums of a batch decoded on
the device, straight into the uint8 ``(N, C, H, W)`` buffer that ``transform.cu`` crops, mirrors,
subtracts the mean from and scales.

The pure-Python parts decide what goes where, and are tested on the CPU:

- :func:`candidates`: where ``libnvjpeg`` may live (``$CUDA_HOME``, NVIDIA's pip wheels under
  ``site-packages/nvidia/nvjpeg/lib`` or ``nvidia/cu*/lib``, the loader path: ``libnvjpeg.so.13``,
  ``.so.12``, ``.so``, ``/usr/local/cuda*``, torchvision's bundled copy).
- :func:`jpeg_header` reads a JPEG's frame header (no pixels); :func:`gpu_decodable` says whether
  nvJPEG's batched decode gives the item the host decoder would (baseline 8-bit, YCbCr colour with
  4:4:4, 4:2:2, 4:2:0 or 4:4:0 sampling into 3 BGR planes, or grayscale into 1 plane). Anything
  else (progressive, CMYK/YCCK, Adobe RGB, 12-bit, a gray image asked for in colour, or the reverse)
  is decoded on the host by the worker, item by item.
- :func:`encoded_items` reads the workers' per-item answers: the encoded length of an item left
  for the device, None for one the worker decoded.

:class:`Decoder` is the library: one handle (the first backend of :data:`BACKENDS` the library and
the GPU have: the hardware JPEG engines of A100/H100/H200, else GPU-assisted Huffman decoding, else
the default, all with interpolated chroma), two decode states (one per device buffer of the double-buffered upload), and
:meth:`Decoder.decode` for a batch. Planar BGR
(``NVJPEG_OUTPUT_BGR``) is Caffe's channel order and CHW layout, so no reordering is needed.

Pixels: nvJPEG's inverse DCT, its colour conversion and its chroma upsampling are not libjpeg's
(Pillow's), so decoded pixels differ slightly. The tolerance this module states and
``tests/layers/test_nvjpeg.py`` checks on the device: at most :data:`TOLERANCE_444` levels per
pixel for 4:4:4 and grayscale images, and for subsampled chroma (4:2:0, the default of most
encoders) a mean absolute difference of at most :data:`TOLERANCE_MEAN` levels with 99.9 % of the
pixels within :data:`TOLERANCE_420` (libjpeg's "fancy" triangular chroma upsampling against
nvJPEG's: the difference concentrates at sharp colour edges).
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import CaffeError

log = logging.getLogger("pycaffe_lite")

LIBRARY_NAMES = ("libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so")

TOLERANCE_444 = 3  # levels (of 255), per pixel: 4:4:4 and grayscale JPEGs
TOLERANCE_420 = 12  # levels, 99.9 % of the pixels: subsampled chroma
TOLERANCE_MEAN = 1.0  # levels, mean absolute difference: subsampled chroma

# nvjpeg.h enums and flags
BACKEND_DEFAULT, BACKEND_GPU_HYBRID, BACKEND_HARDWARE = 0, 2, 3
OUTPUT_Y, OUTPUT_BGR = 2, 4
MAX_COMPONENT = 4
FLAGS_UPSAMPLING_WITH_INTERPOLATION = 1 << 5
# The backends tried in turn, first to last: (name, backend, flags). The hardware JPEG engines (A100,
# H100, H200), then GPU-assisted Huffman decoding, then the default, each with interpolated chroma
# upsampling (libjpeg's way): without it, nvJPEG replicates chroma samples and 4:2:0 pixels differ
# from Pillow's by 10 levels on average (H200, CUDA 13.0), far beyond the tolerance above.
BACKENDS = (("hardware, interpolated chroma", BACKEND_HARDWARE, FLAGS_UPSAMPLING_WITH_INTERPOLATION),
            ("gpu hybrid, interpolated chroma", BACKEND_GPU_HYBRID, FLAGS_UPSAMPLING_WITH_INTERPOLATION),
            ("default, interpolated chroma", BACKEND_DEFAULT, FLAGS_UPSAMPLING_WITH_INTERPOLATION))
STATUS = {
    0: "NVJPEG_STATUS_SUCCESS", 1: "NVJPEG_STATUS_NOT_INITIALIZED", 2: "NVJPEG_STATUS_INVALID_PARAMETER",
    3: "NVJPEG_STATUS_BAD_JPEG", 4: "NVJPEG_STATUS_JPEG_NOT_SUPPORTED", 5: "NVJPEG_STATUS_ALLOCATOR_FAILURE",
    6: "NVJPEG_STATUS_EXECUTION_FAILED", 7: "NVJPEG_STATUS_ARCH_MISMATCH", 8: "NVJPEG_STATUS_INTERNAL_ERROR",
    9: "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED", 10: "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
}

BASELINE = 0xC0
# frame markers (SOF0..SOF15 but DHT C4, JPG C8, DAC CC)
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RST0..7
_LUMA_SAMPLING = frozenset({(1, 1), (2, 1), (1, 2), (2, 2)})  # 4:4:4, 4:2:2, 4:4:0, 4:2:0 with (1, 1) chroma
_RGB_IDS = (ord("R"), ord("G"), ord("B"))


class NvJpegError(CaffeError):
    """nvJPEG cannot be loaded or a call failed (the status named)."""


# -- where the library is ---------------------------------------------------------------------------
def candidates(env: Mapping[str, str] = os.environ, paths: Sequence[str] = tuple(sys.path)) -> list[str]:
    """Paths and names to try for libnvjpeg, in order: the toolkit of ``$CUDA_HOME`` /
    ``$CUDA_PATH`` / ``$CUDA_ROOT``, NVIDIA's pip wheels on ``paths`` (``nvidia/nvjpeg/lib``,
    ``nvidia/cu*/lib``), the loader's names (newest first), ``/usr/local/cuda*/lib64``, and the
    copy bundled in torchvision's wheel (``torchvision.libs``)."""
    names: list[str] = []
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        root = env.get(var)
        if root:
            for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
                names += sorted(glob.glob(os.path.join(root, sub, "libnvjpeg.so*")), reverse=True)
    for path in paths:
        names += sorted(glob.glob(os.path.join(path, "nvidia", "nvjpeg", "lib", "libnvjpeg.so*")), reverse=True)
        names += sorted(glob.glob(os.path.join(path, "nvidia", "cu*", "lib", "libnvjpeg.so*")), reverse=True)
    names += LIBRARY_NAMES
    names += sorted(glob.glob("/usr/local/cuda*/lib64/libnvjpeg.so*"), reverse=True)
    for path in paths:  # last: the copy torchvision's wheel bundles (a hashed name)
        names += sorted(glob.glob(os.path.join(path, "torchvision.libs", "libnvjpeg*.so*")), reverse=True)
    seen: set[str] = set()
    return [n for n in names if not (n in seen or seen.add(n))]  # type: ignore[func-returns-value]


def load_library(names: Sequence[str] | None = None) -> tuple[ctypes.CDLL, str]:
    """The first of ``names`` (default :func:`candidates`) that loads, and its name; NvJpegError
    listing what was tried otherwise."""
    errors = []
    for name in candidates() if names is None else names:
        try:
            return ctypes.CDLL(name), name
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise NvJpegError("nvJPEG (libnvjpeg) not found; install the CUDA toolkit or the nvidia-nvjpeg wheel, or "
                      "set CUDA_HOME (tried: " + "; ".join(errors[:6]) + ")")


# -- what goes to the device -------------------------------------------------------------------------
@dataclass(frozen=True)
class JpegHeader:
    """What a JPEG's frame header says: the frame marker (``0xC0`` baseline, ``0xC2``
    progressive, ...), bits per sample, size, components ``(id, h sampling, v sampling)``, and
    the Adobe APP14 colour transform (None without that segment; 0: RGB or CMYK as stored)."""

    sof: int
    precision: int
    height: int
    width: int
    components: tuple[tuple[int, int, int], ...]
    adobe_transform: int | None = None


def jpeg_header(data: bytes | bytearray | memoryview) -> JpegHeader | None:
    """The frame header of the JPEG ``data`` (markers walked up to the first frame header), or
    None when ``data`` is no JPEG or the header is cut short."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    n = len(view)
    if n < 4 or view[0] != 0xFF or view[1] != 0xD8:
        return None
    i, adobe = 2, None
    while i + 4 <= n:
        if view[i] != 0xFF:
            return None
        marker = view[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _NO_LENGTH:
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header before them
            return None
        length = (view[i + 2] << 8) | view[i + 3]
        if length < 2 or i + 2 + length > n:
            return None
        seg = bytes(view[i + 4 : i + 2 + length])
        if marker == 0xEE and seg[:5] == b"Adobe" and len(seg) >= 12:
            adobe = seg[11]
        elif marker in _SOF:
            return _frame(marker, seg, adobe)
        i += 2 + length
    return None


def _frame(marker: int, seg: bytes, adobe: int | None) -> JpegHeader | None:
    if len(seg) < 6 or len(seg) < 6 + 3 * seg[5]:
        return None
    comps = tuple((seg[6 + 3 * k], seg[7 + 3 * k] >> 4, seg[7 + 3 * k] & 15) for k in range(seg[5]))
    return JpegHeader(marker, seg[0], (seg[1] << 8) | seg[2], (seg[3] << 8) | seg[4], comps, adobe)


def gpu_decodable(header: JpegHeader | None, shape: tuple[int, int, int], force_color: bool = False,
                  force_gray: bool = False) -> bool:
    """Whether nvJPEG's batched decode gives this item as the host decoder would: a baseline 8-bit
    JPEG of the batch's size ``shape`` ``(C, H, W)``; three YCbCr components (no Adobe RGB
    transform, no R/G/B component ids) with chroma at (1, 1) and luma sampling of 4:4:4, 4:2:2,
    4:4:0 or 4:2:0 for ``C`` = 3 (not ``force_gray``: Pillow's RGB-to-L conversion is not the Y
    plane); one component for ``C`` = 1 (not ``force_color``)."""
    if header is None or header.sof != BASELINE or header.precision != 8:
        return False
    c, h, w = shape
    if (header.height, header.width) != (h, w):
        return False  # (the host decode reports the shape)
    comps = header.components
    if len(comps) == 1:
        return c == 1 and not force_color
    if len(comps) != 3 or c != 3 or force_gray or header.adobe_transform == 0:
        return False
    if tuple(cid for cid, _, _ in comps) == _RGB_IDS:
        return False
    (_, lh, lv), (_, bh, bv), (_, rh, rv) = comps
    return (lh, lv) in _LUMA_SAMPLING and (bh, bv) == (1, 1) and (rh, rv) == (1, 1)


def encoded_items(payloads: Sequence | None) -> list[tuple[int, int]]:
    """``(item, encoded length)`` of the items a worker left encoded for the device (its answer
    for the item is ``(length, record key)``); the others (answer None) hold decoded pixels."""
    if payloads is None:
        return []
    return [(i, int(p[0])) for i, p in enumerate(payloads) if p is not None]


def item_keys(payloads: Sequence | None) -> list:
    """The record key of each item left encoded (None for the others), to name it in errors."""
    if payloads is None:
        return []
    return [None if p is None else p[1] for p in payloads]


def output_format(channels: int) -> int:
    """The nvJPEG output of a batch of ``channels`` (1: the Y plane; 3: planar BGR)."""
    if channels not in (1, 3):
        raise NvJpegError(f"nvJPEG decodes into 1 or 3 channels, not {channels}")
    return OUTPUT_Y if channels == 1 else OUTPUT_BGR


def plane_pointers(base: int, item: int, shape: tuple[int, int, int]) -> list[int]:
    """Device addresses of item ``item``'s channel planes in a uint8 ``(N, C, H, W)`` buffer at
    ``base`` (each plane ``H`` rows of pitch ``W``)."""
    c, h, w = shape
    start = base + item * c * h * w
    return [start + k * h * w for k in range(c)]


# -- the library ---------------------------------------------------------------------------------
class _Image(ctypes.Structure):
    """nvjpegImage_t: per-component plane pointers and pitches (bytes)."""

    _fields_ = [("channel", ctypes.c_void_p * MAX_COMPONENT), ("pitch", ctypes.c_size_t * MAX_COMPONENT)]


def image_array(planes: Sequence[Sequence[int]], pitch: int) -> ctypes.Array:
    """nvjpegImage_t per item: item ``k``'s channel ``c`` at ``planes[k][c]``, every used plane with
    rows of ``pitch`` bytes (filled through one numpy view: no Python loop over the planes, which
    the staging thread would run holding the GIL)."""
    n = len(planes)
    images = (_Image * n)()
    if n:
        channels = len(planes[0])
        view = np.frombuffer(memoryview(images).cast("B"), np.uint64).reshape(n, 2 * MAX_COMPONENT)  # (4 pointers, 4 pitches) each
        view[:, :channels] = np.asarray(planes, np.uint64).reshape(n, channels)
        view[:, MAX_COMPONENT:MAX_COMPONENT + channels] = pitch
    return images


def status_name(status: int) -> str:
    return STATUS.get(int(status), f"nvJPEG status {status}")


def _bind(lib: ctypes.CDLL) -> None:
    vp, i, pvp = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)
    lib.nvjpegCreateEx.argtypes = [i, vp, vp, ctypes.c_uint, pvp]
    lib.nvjpegDestroy.argtypes = [vp]
    lib.nvjpegJpegStateCreate.argtypes = [vp, pvp]
    lib.nvjpegJpegStateDestroy.argtypes = [vp]
    lib.nvjpegDecodeBatchedInitialize.argtypes = [vp, vp, i, i, i]
    lib.nvjpegDecodeBatched.argtypes = [vp, vp, pvp, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(_Image), vp]
    for name in ("nvjpegCreateEx", "nvjpegDestroy", "nvjpegJpegStateCreate",
                 "nvjpegJpegStateDestroy", "nvjpegDecodeBatchedInitialize", "nvjpegDecodeBatched"):
        getattr(lib, name).restype = ctypes.c_int


class Decoder:
    """One nvJPEG handle and ``states`` decode states (one per device buffer decoded into in turn)
    on the current device, with the first of :data:`BACKENDS` from ``start`` on that the library
    creates (:attr:`level`, :attr:`backend`). Needs the device's context current (the backend's)."""

    def __init__(self, states: int = 2, start: int = 0, library: tuple[ctypes.CDLL, str] | None = None) -> None:
        self.lib, self.path = library if library is not None else load_library()
        _bind(self.lib)
        self.handle = ctypes.c_void_p()
        self.states: list[ctypes.c_void_p] = []
        statuses = []
        for level in range(start, len(BACKENDS)):
            name, backend, flags = BACKENDS[level]
            status = self.lib.nvjpegCreateEx(backend, None, None, flags, ctypes.byref(self.handle))
            if status == 0:
                self.level, self.backend = level, name
                break
            self.handle = ctypes.c_void_p()
            statuses.append(f"{name}: {status_name(status)}")
        else:
            raise NvJpegError("nvjpegCreateEx failed for every backend (" + "; ".join(statuses) + ")")
        try:
            for _ in range(states):
                state = ctypes.c_void_p()
                self._check(self.lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(state)), "nvjpegJpegStateCreate")
                self.states.append(state)
        except NvJpegError:
            self.close()
            raise

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise NvJpegError(f"{what} failed: {status_name(status)}")

    def decode(self, state: int, sources: Sequence[int], lengths: Sequence[int], planes: Sequence[Sequence[int]],
               pitch: int, fmt: int, stream_handle: int) -> None:
        """Queue the decode of ``len(sources)`` JPEGs (host addresses ``sources`` of ``lengths``
        bytes) into the device planes ``planes[k]`` (one address per output channel, rows of
        ``pitch`` bytes) as ``fmt`` (:func:`output_format`) on the stream ``stream_handle``, with
        decode state ``state``. NvJpegError naming the status on failure."""
        n = len(sources)
        if n == 0:
            return
        handle, st = self.handle, self.states[state]
        self._check(self.lib.nvjpegDecodeBatchedInitialize(handle, st, n, 1, fmt), "nvjpegDecodeBatchedInitialize")
        data = (ctypes.c_void_p * n)(*sources)
        sizes = (ctypes.c_size_t * n)(*lengths)
        images = image_array(planes, pitch)
        self._check(self.lib.nvjpegDecodeBatched(handle, st, data, sizes, images, ctypes.c_void_p(stream_handle)),
                    f"nvjpegDecodeBatched ({self.backend} backend, {n} images)")

    def close(self) -> None:
        """Destroy the states and the handle (idempotent)."""
        for state in self.states:
            self.lib.nvjpegJpegStateDestroy(state)
        self.states = []
        if self.handle:
            self.lib.nvjpegDestroy(self.handle)
            self.handle = ctypes.c_void_p()
