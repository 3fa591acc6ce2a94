"""Built-in layers, one module per layer type (installed as ``pycaffe_lite.builtin_layers``).

Importing this package imports every module in it; each registers its layer class with
:func:`pycaffe_lite.layer.register_layer`. CUDA kernels live beside the modules as ``.cu`` files.
"""

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
