"""net_spec's layer factory as a module, as pycaffe's ``caffe.layers``.

``import pycaffe_lite.layers as L`` (or ``from pycaffe_lite import layers as L``), then
``L.Convolution(bottom, num_output=20, ...)``: every attribute is :data:`net_spec.layers`'s.
The built-in layer implementations are the package ``pycaffe_lite.builtin_layers``.
"""

from collections.abc import Callable
from typing import Any

from .net_spec import layers as _factory


def __getattr__(name: str) -> Callable[..., Any]:
    return getattr(_factory, name)
