"""Caffe's files: reading and writing messages (``protoio``), upgrades of V0/V1 nets (``upgrade``),
phase/stage filters and Split insertion (``net_filter``), ``.caffemodel`` weights (``caffemodel``)
and HDF5 weights and solver states (``hdf5_weights``).

The schema they read lives a floor below, in :mod:`pycaffe_lite.schema`; ``pycaffe_lite.proto.caffe_pb2``
stays its name too (pycaffe's ``caffe.proto.caffe_pb2``).
"""

import sys

from ..schema import caffe_pb2

sys.modules[f"{__name__}.caffe_pb2"] = caffe_pb2  # `import pycaffe_lite.proto.caffe_pb2` keeps working

__all__ = ["caffe_pb2"]
