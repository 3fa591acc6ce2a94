"""``import caffe``: pycaffe-lite under BVLC's module names.

Everything here *is* pycaffe-lite: ``caffe.Net is pycaffe_lite.Net``, ``caffe.io is pycaffe_lite.io``,
``caffe.proto.caffe_pb2 is pycaffe_lite.proto.caffe_pb2`` and so on, so BVLC's pycaffe scripts and
Python layers (``import caffe``; ``class L(caffe.Layer)``) run unchanged, also inside ``pycaffe-lite
train`` / ``caffe train``. Submodules are registered in ``sys.modules`` under their ``caffe.*`` names;
``caffe._caffe`` and ``caffe.pycaffe`` (BVLC's compiled module and its Python wrapper) are small
modules of this package re-exporting pycaffe-lite's objects.

To use a real BVLC build instead, put its ``python/`` folder first on ``PYTHONPATH``: the first
``caffe`` found on ``sys.path`` wins (``import pycaffe_lite`` still reaches this project).
"""

import sys as _sys

import pycaffe_lite as _pl
from pycaffe_lite import (
    NCCL,
    TEST,
    TRAIN,
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    Blob,
    Classifier,
    Detector,
    Layer,
    NesterovSolver,
    Net,
    NetSpec,
    RMSPropSolver,
    SGDSolver,
    Solver,
    Timer,
    __version__,
    classifier,
    coord_map,
    detector,
    draw,
    get_precision,
    get_solver,
    has_nccl,
    init_log,
    io,
    layer_type_list,
    layers,
    log,
    net_spec,
    params,
    proto,
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
    to_proto,
)
from pycaffe_lite.proto import caffe_pb2 as _caffe_pb2

# BVLC's submodule names -> the same module objects of pycaffe-lite.
for _name, _module in {
    "io": io, "draw": draw, "net_spec": net_spec, "proto": proto, "proto.caffe_pb2": _caffe_pb2,
    "classifier": classifier, "detector": detector, "coord_map": coord_map,
}.items():
    _sys.modules[f"{__name__}.{_name}"] = _module

from . import _caffe, pycaffe  # noqa: E402  (after the aliases: they import caffe.* names)

__all__ = [
    "TEST", "TRAIN", "AdaDeltaSolver", "AdaGradSolver", "AdamSolver", "Blob", "Classifier", "Detector", "Layer",
    "NCCL", "NesterovSolver", "Net", "NetSpec", "RMSPropSolver", "SGDSolver", "Solver", "Timer", "__version__",
    "_caffe", "classifier", "coord_map", "detector", "draw", "get_precision", "get_solver", "has_nccl", "init_log",
    "io", "layer_type_list", "layers", "log", "net_spec", "params", "proto", "pycaffe", "set_allow_tf32", "set_device",
    "set_mode_cpu", "set_mode_gpu", "set_multiprocess", "set_precision", "set_random_seed", "set_solver_count", "set_solver_rank",
    "solver_count", "solver_rank", "to_proto",
]
del _pl
