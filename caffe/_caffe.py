"""``caffe._caffe``: the names of BVLC's compiled module (``_caffe.cpp``), from pycaffe-lite.

Classes and functions are pycaffe-lite's own objects; the vector classes (``BlobVec``,
``RawBlobVec``, ``LayerVec``, ``StringVec``, ``IntVec``, ``DtypeVec``, ``NetVec``, ``BoolVec``) are
``list`` subclasses from :mod:`pycaffe_lite.vectors`; ``net.params[name]`` is a ``BlobVec``.
"""

from pycaffe_lite import (
    NCCL,
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    Blob,
    Layer,
    NesterovSolver,
    Net,
    RMSPropSolver,
    SGDSolver,
    Solver,
    Timer,
    __version__,
    get_solver,
    has_nccl,
    init_log,
    layer_type_list,
    log,
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
from pycaffe_lite.schema.caffe_pb2 import LayerParameter, SolverParameter
from pycaffe_lite.vectors import BlobVec, BoolVec, DtypeVec, IntVec, LayerVec, NetVec, RawBlobVec, StringVec

__all__ = [
    "NCCL", "AdaDeltaSolver", "AdaGradSolver", "AdamSolver", "Blob", "BlobVec", "BoolVec", "DtypeVec", "IntVec",
    "Layer", "LayerParameter", "LayerVec", "NesterovSolver", "Net", "NetVec", "RMSPropSolver", "RawBlobVec",
    "SGDSolver", "Solver", "SolverParameter", "StringVec", "Timer", "__version__", "get_solver", "has_nccl",
    "init_log", "layer_type_list", "log", "set_device", "set_mode_cpu", "set_mode_gpu", "set_multiprocess",
    "set_random_seed", "set_solver_count", "set_solver_rank", "solver_count", "solver_rank",
]
