"""Optional dependencies, imported on first use: ``require("h5py", feature="HDF5Data layer")``.

A missing package raises :class:`~pycaffe_lite.errors.MissingDependencyError` (a CaffeError and an
ImportError) naming the feature, the pip package and the pycaffe-lite extra that installs it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

# import name -> (pip package, pycaffe-lite extra)
PACKAGES: dict[str, tuple[str, str | None]] = {
    "h5py": ("h5py", "data"),
    "lmdb": ("lmdb", "data"),
    "plyvel": ("plyvel", "leveldb"),
    "PIL": ("Pillow", "data"),
    "cv2": ("opencv-python-headless", "data"),
    "pydot": ("pydot", "draw"),
    "tqdm": ("tqdm", None),
    "onnx": ("onnx", "onnx"),
    "onnxruntime": ("onnxruntime", "onnx"),
}


def require(module: str, feature: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` (e.g. ``"PIL.Image"``) or raise an error saying ``feature`` needs it and how
    to install it. ``extra`` overrides the pycaffe-lite extra named in the message."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.partition(".")[0]
        pip_name, default_extra = PACKAGES.get(top, (top, None))
        extra = extra or default_extra
        hint = f"pip install {pip_name}" + (f" (or pip install 'pycaffe-lite[{extra}]')" if extra else "")
        raise MissingDependencyError(f"{feature} needs the '{pip_name}' package: {hint}") from None
