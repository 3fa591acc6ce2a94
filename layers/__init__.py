"""``pycaffe_lite.layers``: the built-in layers, one module per layer type, and pycaffe's ``caffe.layers``.

Importing the package imports every module in it; each registers its layer class with
:func:`pycaffe_lite.layer.register_layer`. CUDA kernels live beside the modules as ``.cu`` files.
A capitalised attribute is net_spec's layer factory, as in pycaffe: ``from pycaffe_lite import
layers as L``; ``L.Convolution(bottom, num_output=20)`` (module names are lower case, types are not).
"""

import importlib
import pkgutil
from typing import Any

from pycaffe_lite.net_spec import layers as factory

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")


def __getattr__(name: str) -> Any:
    if not name[:1].isupper():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    return getattr(factory, name)
