"""pycaffe-lite: a Caffe-compatible deep-learning framework in Python.

Use it as BVLC's pycaffe: ``import pycaffe_lite as caffe``; ``caffe.Net(path, caffe.TEST)``.
``caffe.layers`` is the package of built-in layers (``layers/``, e.g. ``pycaffe_lite.layers.relu``),
whose capitalised attributes are net_spec's factories (``L.Convolution``), and ``caffe.params`` net_spec's
constants, as in pycaffe.
"""

import importlib.util as _importlib_util
import sys as _sys
from pathlib import Path as _Path

if not (_Path(__file__).parent / "layers").is_dir():
    # Run from a source checkout (or an editable install): ``layers/`` sits beside the package and is
    # loaded as ``pycaffe_lite.layers``, the name setup.cfg installs it under.
    _dir = _Path(__file__).resolve().parent.parent / "layers"
    _spec = _importlib_util.spec_from_file_location(
        f"{__name__}.layers", _dir / "__init__.py", submodule_search_locations=[str(_dir)])
    assert _spec is not None and _spec.loader is not None
    _sys.modules[_spec.name] = _importlib_util.module_from_spec(_spec)
    _spec.loader.exec_module(_sys.modules[_spec.name])

from . import (  # type: ignore[attr-defined]  # (mypy reads layers/ as the package 'layers')
    draw,
    io,
    layers,  # layers/: registers every layer type
    params,
    proto,
)
from .blob import Blob
from .classifier import Classifier
from .common import (
    TEST,
    TRAIN,
    Mode,
    get_precision,
    set_allow_tf32,
    set_device,
    set_mode_cpu,
    set_mode_gpu,
    set_multiprocess,
    set_precision,
    set_random_seed,
    set_solver_count,
    set_solver_rank,
    solver_count,
    solver_rank,
    thread_context,
)
from .config import config, using_config
from .conv.engines import load_cache as load_autotune
from .conv.engines import save_cache as save_autotune
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
from .layer import layer_type_list, register_layer
from .net import Net
from .net_spec import NetSpec, to_proto
from .parallel.multi_gpu import NCCL
from .parallel.nccl import available as has_nccl
from .python_layer import Layer
from .solvers.sgd_solvers import (
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    NesterovSolver,
    RMSPropSolver,
    SGDSolver,
    get_solver,
)
from .solvers.solver import Solver
from .timer import Timer
from .version import __version__

__all__ = [
    "TEST", "TRAIN", "AdaDeltaSolver", "AdaGradSolver", "AdamSolver", "Blob", "CaffeError", "Classifier",
    "DataError", "Detector", "GPUUnavailableError", "Layer", "Mode", "NCCL", "NesterovSolver", "Net", "NetError",
    "NetSpec", "PrototxtError", "RMSPropSolver", "SGDSolver", "ShapeError", "Solver", "Timer",
    "UnknownLayerError", "WeightsError", "__version__", "config", "draw", "get_precision", "get_solver", "has_nccl", "init_log", "io",
    "layer_type_list", "layers", "load_autotune", "log", "params", "proto", "register_layer", "save_autotune",
    "set_allow_tf32", "set_device", "set_mode_cpu",
    "set_mode_gpu", "set_multiprocess", "set_precision", "set_random_seed", "set_solver_count", "set_solver_rank", "solver_count",
    "solver_rank", "thread_context", "to_proto", "using_config",
]

from . import threads as _threads  # noqa: E402

_threads.configure()  # BLAS threads: the cores (at most 8), unless OMP/OPENBLAS/MKL_NUM_THREADS are set
