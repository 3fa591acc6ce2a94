"""``caffe.pycaffe``: BVLC's Python wrapper module; its classes are pycaffe-lite's (which already
carry the methods BVLC's wrapper adds to ``Net``: ``forward``, ``backward``, ``forward_all``,
``blobs``, ``params``, ``layer_dict``, ``set_input_arrays`` ...)."""

from pycaffe_lite import (
    NCCL,
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    NesterovSolver,
    Net,
    RMSPropSolver,
    SGDSolver,
    Timer,
)

__all__ = ["NCCL", "AdaDeltaSolver", "AdaGradSolver", "AdamSolver", "NesterovSolver", "Net", "RMSPropSolver",
           "SGDSolver", "Timer"]
