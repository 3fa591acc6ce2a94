"""net_spec's parameter constants as a module, as pycaffe's ``caffe.params``.

``from pycaffe_lite import params as P``, then ``P.Pooling.MAX``: every attribute is
:data:`net_spec.params`'s.
"""

from typing import Any

from .net_spec import params as _constants


def __getattr__(name: str) -> Any:
    return getattr(_constants, name)
