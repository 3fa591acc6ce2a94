"""MNIST tooling: read the standard IDX files (gzipped or not) and convert them to an LMDB of
``Datum`` records exactly as BVLC Caffe's ``convert_mnist_data`` writes them.

IDX layout (big-endian): a 4-byte magic ``0x0000 <type> <ndim>`` (images: 2051 = uint8, 3 dims;
labels: 2049 = uint8, 1 dim), one uint32 per dimension, then the values in C order.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..schema import caffe_pb2
from .db import check_backend, open_writer

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049

# The four standard file names (without ``.gz``): split -> (images, labels).
STANDARD_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

# The MNIST copy that ships with the repository (examples/mnist/data) and the SHA-256 of each
# published .gz file (the same bytes as yann.lecun.com's; md5s in the example README).
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "examples" / "mnist" / "data"
SHA256 = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
SIZES = {"train": 60000, "test": 10000}

_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when it starts with the gzip magic."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read MNIST/IDX file: {exc.strerror}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise DataError(f"{path}: corrupt or truncated gzip stream ({exc})") from None
    return raw


def read_idx(path: str | os.PathLike, expected_magic: int | None = None) -> np.ndarray:
    """Read any IDX file into an array of its declared shape and type (native byte order)."""
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise DataError(f"{path}: truncated IDX file ({len(raw)} bytes, no 4-byte magic number)")
    magic = int.from_bytes(raw[:4], "big")
    type_code, ndim = (magic >> 8) & 0xFF, magic & 0xFF
    if expected_magic is not None and magic != expected_magic:
        raise DataError(
            f"{path}: wrong magic number {magic} (0x{magic:08x}); expected {expected_magic} "
            f"(0x{expected_magic:08x}) for an IDX {'image' if expected_magic == IMAGES_MAGIC else 'label'} file"
        )
    if magic >> 16 != 0 or type_code not in _IDX_DTYPES or ndim == 0:
        raise DataError(f"{path}: not an IDX file (magic number 0x{magic:08x})")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header ({len(raw)} bytes, expected at least {header})")
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = _IDX_DTYPES[type_code]
    need = int(np.prod(dims)) * dtype.itemsize
    have = len(raw) - header
    if have < need:
        raise DataError(
            f"{path}: truncated IDX file: header declares shape {dims} ({need} data bytes) "
            f"but only {have} bytes follow"
        )
    if have > need:
        raise DataError(f"{path}: {have - need} unexpected bytes after the {dims} IDX data")
    arr = np.frombuffer(raw, dtype=dtype, count=need // dtype.itemsize, offset=header)
    return arr.reshape(dims).astype(dtype.newbyteorder("="), copy=True)


def read_images(path: str | os.PathLike) -> np.ndarray:
    """MNIST images as uint8 ``(N, rows, cols)``."""
    return read_idx(path, IMAGES_MAGIC)


def read_labels(path: str | os.PathLike) -> np.ndarray:
    """MNIST labels as uint8 ``(N,)``."""
    return read_idx(path, LABELS_MAGIC)


def load(images_path: str | os.PathLike, labels_path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(N, rows, cols)`` uint8 and labels ``(N,)`` uint8, with matching counts checked."""
    images = read_images(images_path)
    labels = read_labels(labels_path)
    if len(images) != len(labels):
        raise DataError(
            f"count mismatch: {images_path} holds {len(images)} images but {labels_path} "
            f"holds {len(labels)} labels"
        )
    return images, labels


def find_files(directory: str | os.PathLike, split: str) -> tuple[Path, Path] | None:
    """(images, labels) paths of ``split`` ("train" or "test") in ``directory`` (``.gz`` or plain),
    or None when either is missing."""
    found = []
    for stem in STANDARD_FILES[split]:
        for name in (stem + ".gz", stem):
            if (Path(directory) / name).is_file():
                found.append(Path(directory) / name)
                break
        else:
            return None
    return found[0], found[1]


def datum_bytes(image: np.ndarray, label: int) -> bytes:
    """One serialized ``Datum`` as convert_mnist_data writes it (channels 1, raw uint8 data)."""

    datum = caffe_pb2.Datum()
    datum.channels = 1
    datum.height, datum.width = int(image.shape[-2]), int(image.shape[-1])
    datum.data = np.ascontiguousarray(image, dtype=np.uint8).tobytes()
    datum.label = int(label)
    return datum.SerializeToString()


def write_lmdb(
    images: np.ndarray, labels: np.ndarray, db_path: str | os.PathLike, overwrite: bool = False, progress=None,
    backend: str = "lmdb",
) -> int:
    """Write ``images`` ``(N, rows, cols)`` uint8 and ``labels`` ``(N,)`` as Datums with keys
    ``%08d`` into a new database (LMDB, or LevelDB with ``backend="leveldb"``) at ``db_path``
    (built in a temporary folder, renamed when complete). ``progress(done, total)`` is called
    every 1000 records. Returns N."""

    if len(images) != len(labels):
        raise DataError(f"{db_path}: {len(images)} images but {len(labels)} labels")
    total = len(images)
    with open_writer(db_path, backend, overwrite=overwrite) as writer:
        for i in range(total):
            writer.put(b"%08d" % i, datum_bytes(images[i], labels[i]))
            if (i + 1) % 1000 == 0:
                writer.commit()
                if progress is not None:
                    progress(i + 1, total)
    if progress is not None and total % 1000:
        progress(total, total)
    return total


def convert(
    images_path: str | os.PathLike,
    labels_path: str | os.PathLike,
    db_path: str | os.PathLike,
    backend: str = "lmdb",
    overwrite: bool = False,
    limit: int | None = None,
    progress=None,
) -> int:
    """Caffe's convert_mnist_data: IDX image and label files -> LMDB (or LevelDB) of Datums.
    ``limit`` keeps only the first records. Returns the number written."""

    backend = check_backend(backend, db_path)
    images, labels = load(images_path, labels_path)
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    return write_lmdb(images, labels, db_path, overwrite=overwrite, progress=progress, backend=backend)


def verify_sha256(directory: str | os.PathLike) -> None:
    """Check the four canonical ``.gz`` files in ``directory`` against their published SHA-256;
    DataError naming the first missing or altered file."""
    import hashlib

    for name, digest in SHA256.items():
        path = Path(directory) / name
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise DataError(f"{path}: cannot read the MNIST file: {exc.strerror}") from None
        got = hashlib.sha256(data).hexdigest()
        if got != digest:
            raise DataError(
                f"{path}: SHA-256 {got} does not match the published MNIST file ({digest}); "
                "the copy is corrupt or altered (restore it with git checkout, or pass --data DIR)"
            )


def locate(data_dir: str | os.PathLike | None = None, env: Mapping[str, str] | None = None
           ) -> tuple[Path, str]:
    """The folder holding the four MNIST files and where it came from: ``data_dir`` (--data), else
    ``$MNIST_DIR``, else the copy shipped in examples/mnist/data (SHA-256 checked). A given folder
    that lacks the files is a DataError, never silently replaced by the shipped copy."""
    env = os.environ if env is None else env
    for value, what in ((data_dir, "--data"), (env.get("MNIST_DIR"), "$MNIST_DIR")):
        if not value:
            continue
        d = Path(value)
        if not d.is_dir():
            raise DataError(f"{what} {d}: no such folder (expected the four MNIST files there)")
        if find_files(d, "train") is None or find_files(d, "test") is None:
            raise DataError(
                f"{what} {d}: the four standard MNIST files (train-images-idx3-ubyte[.gz], "
                "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]) "
                "are not all there"
            )
        return d, f"{what} {d}"
    verify_sha256(SHIPPED_DIR)
    return SHIPPED_DIR, f"the copy shipped with pycaffe-lite ({SHIPPED_DIR}, SHA-256 verified)"


def load_split(directory: str | os.PathLike, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The ``split`` ("train" or "test") images and labels of the MNIST files in ``directory``."""
    found = find_files(directory, split)
    if found is None:
        raise DataError(f"{directory}: the MNIST {split} files are missing")
    return load(*found)
