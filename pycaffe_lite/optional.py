"""Optional dependencies, imported on first use: ``require("h5py", feature="HDF5Data layer")``.

A missing package raises :class:`~pycaffe_lite.errors.MissingDependencyError` (a CaffeError and an
ImportError) naming the feature, the pip package and the pycaffe-lite extra that installs it.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
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
    "matplotlib": ("matplotlib", "data"),
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


def require_all(modules: Sequence[str], feature: str) -> None:
    """MissingDependencyError naming every module of ``modules`` that is not installed (looked up
    without importing it) and the pip command that installs them, so a job can check its extras
    before it starts its work."""
    missing = [m for m in modules if importlib.util.find_spec(m.partition(".")[0]) is None]
    if not missing:
        return
    pips = [PACKAGES.get(m.partition(".")[0], (m, None)) for m in missing]
    extras = sorted({extra for _, extra in pips if extra})
    names = ", ".join(f"'{pip}'" for pip, _ in pips)
    hint = f"pip install {' '.join(pip for pip, _ in pips)}" + (
        f" (or pip install 'pycaffe-lite[{','.join(extras)}]')" if extras else "")
    raise MissingDependencyError(f"{feature} needs {names} (not installed): {hint}")
