"""Exception types. Every message names the file, layer or blob involved and what was expected."""


class CaffeError(Exception):
    """Base class of every error raised by pycaffe-lite."""


class PrototxtError(CaffeError):
    """A prototxt (or binary proto) file could not be read or parsed."""


class NetError(CaffeError):
    """A net definition is inconsistent (missing bottom, duplicate top, bad counts...)."""


class UnknownLayerError(NetError):
    """A layer type is not registered."""


class ShapeError(CaffeError):
    """Blob shapes are incompatible with what a layer or file expects."""


class WeightsError(CaffeError):
    """A weights file (.caffemodel, .solverstate, HDF5) is unreadable or does not match the net."""


class DataError(CaffeError):
    """A data source (database, IDX file, image list) is missing or corrupt."""


class GPUUnavailableError(CaffeError):
    """GPU mode was requested but PyCUDA, a driver or a device is missing."""


class CudaError(CaffeError):
    """A CUDA or cuBLAS call failed."""


class MissingDependencyError(CaffeError, ImportError):
    """An optional package a feature needs is not installed (see :mod:`pycaffe_lite.optional`)."""
