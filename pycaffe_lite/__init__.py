"""pycaffe-lite: a Caffe-compatible deep-learning framework in Python.

Use it as BVLC's pycaffe: ``import pycaffe_lite as caffe``; ``caffe.Net(path, caffe.TEST)``.
Note: ``caffe.layers`` is net_spec's layer factory (as in pycaffe); the built-in layer modules
are the subpackage ``pycaffe_lite.layers`` (importable by name, e.g. ``pycaffe_lite.layers.relu``).
"""

from . import draw, io, proto
from . import layers as _builtin_layers  # noqa: F401  (registers every layer type; before net_spec.layers)
from .blob import Blob
from .classifier import Classifier
from .common import (
    TEST,
    TRAIN,
    Mode,
    set_allow_tf32,
    set_device,
    set_mode_cpu,
    set_mode_gpu,
    set_multiprocess,
    set_random_seed,
    set_solver_count,
    set_solver_rank,
    solver_count,
    solver_rank,
)
from .detector import Detector
from .digits import classify_digits
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
from .layer import layer_type_list, register_layer
from .logging_compat import init_log, log
from .net import Net
from .net_spec import NetSpec, layers, params, to_proto
from .parallel.multi_gpu import NCCL
from .parallel.nccl import available as has_nccl
from .python_layer import Layer
from .sgd_solvers import (
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    NesterovSolver,
    RMSPropSolver,
    SGDSolver,
    get_solver,
)
from .solver import Solver
from .timer import Timer
from .version import __version__

__all__ = [
    "TEST", "TRAIN", "AdaDeltaSolver", "AdaGradSolver", "AdamSolver", "Blob", "CaffeError", "Classifier",
    "DataError", "Detector", "GPUUnavailableError", "Layer", "Mode", "NCCL", "NesterovSolver", "Net", "NetError",
    "NetSpec", "PrototxtError", "RMSPropSolver", "SGDSolver", "ShapeError", "Solver", "Timer",
    "UnknownLayerError", "WeightsError", "__version__", "classify_digits", "draw", "get_solver", "has_nccl", "init_log", "io",
    "layer_type_list", "layers", "log", "params", "proto", "register_layer", "set_allow_tf32", "set_device", "set_mode_cpu",
    "set_mode_gpu", "set_multiprocess", "set_random_seed", "set_solver_count", "set_solver_rank", "solver_count",
    "solver_rank", "to_proto",
]
