"""pycaffe-lite: a Caffe-compatible deep-learning framework in Python.

Use it as BVLC's pycaffe: ``import pycaffe_lite as caffe``; ``caffe.Net(path, caffe.TEST)``.
"""

from . import proto
from .blob import Blob
from .common import (
    TEST,
    TRAIN,
    Mode,
    set_device,
    set_mode_cpu,
    set_mode_gpu,
    set_random_seed,
)
from .errors import (
    CaffeError,
    DataError,
    GPUUnavailableError,
    NetError,
    PrototxtError,
    ShapeError,
    UnknownLayerError,
    WeightsError,
)
from .layer import Layer, layer_type_list, register_layer
from .net import Net
from .version import __version__

__all__ = [
    "TEST",
    "TRAIN",
    "Blob",
    "CaffeError",
    "DataError",
    "GPUUnavailableError",
    "Layer",
    "Mode",
    "Net",
    "NetError",
    "PrototxtError",
    "ShapeError",
    "UnknownLayerError",
    "WeightsError",
    "__version__",
    "layer_type_list",
    "proto",
    "register_layer",
    "set_device",
    "set_mode_cpu",
    "set_mode_gpu",
    "set_random_seed",
]
