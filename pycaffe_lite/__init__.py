"""pycaffe-lite: a Caffe-compatible deep-learning framework in Python.

Use it as BVLC's pycaffe: ``import pycaffe_lite as caffe``; ``caffe.Net(path, caffe.TEST)``.
``caffe.layers`` / ``caffe.params`` are net_spec's factories (as in pycaffe); the built-in layer
modules are the package ``pycaffe_lite.builtin_layers`` (e.g. ``pycaffe_lite.builtin_layers.relu``).
"""

from . import (  # type: ignore[attr-defined]  # (mypy reads layers/ as the package 'layers')
    builtin_layers,  # noqa: F401  (layers/, installed under this name: registers every layer type)
    draw,
    io,
    layers,
    params,
    proto,
)
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
from .glog import init_log, log
from .gpu.conv_engines import load_cache as load_autotune
from .gpu.conv_engines import save_cache as save_autotune
from .layer import layer_type_list, register_layer
from .net import Net
from .net_spec import NetSpec, to_proto
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
    "UnknownLayerError", "WeightsError", "__version__", "draw", "get_solver", "has_nccl", "init_log", "io",
    "layer_type_list", "layers", "load_autotune", "log", "params", "proto", "register_layer", "save_autotune",
    "set_allow_tf32", "set_device", "set_mode_cpu",
    "set_mode_gpu", "set_multiprocess", "set_random_seed", "set_solver_count", "set_solver_rank", "solver_count",
    "solver_rank", "to_proto",
]

from . import threads as _threads  # noqa: E402

_threads.configure()  # BLAS threads: the free cores, unless OMP/OPENBLAS/MKL_NUM_THREADS are set
