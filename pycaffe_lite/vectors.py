"""BVLC's vector classes of ``caffe._caffe`` (C++ ``std::vector`` exposed to Python by Boost).

Scripts test for them by type (``type(net.params[k]) is caffe._caffe.BlobVec``, as the widely
copied ``merge_bn.py`` does) or build them; here each is a ``list`` subclass, so indexing, slicing,
``len``, ``append``, ``extend`` and iteration work as the Boost indexing suite's do.
``BlobVec`` (a layer's param blobs, with ``add_blob(*shape)``) is the one Python layers use.
"""

from __future__ import annotations

from .python_layer import BlobVec


class RawBlobVec(list):
    """A list of Blobs not owned by the list (a layer's bottom or top vector)."""


class LayerVec(list):
    """A list of layers."""


class StringVec(list):
    """A list of str (blob or layer names)."""


class IntVec(list):
    """A list of int (blob indices)."""


class DtypeVec(list):
    """A list of float (per-blob loss weights)."""


class NetVec(list):
    """A list of Nets (a solver's test nets)."""


class BoolVec(list):
    """A list of bool."""


__all__ = ["BlobVec", "BoolVec", "DtypeVec", "IntVec", "LayerVec", "NetVec", "RawBlobVec", "StringVec"]
