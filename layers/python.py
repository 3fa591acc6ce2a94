"""Python: a layer written by the user in Python (BVLC's PythonLayer).

``python_param { module: "m" layer: "C" param_str: "..." share_in_parallel: false }`` imports
module ``m`` (from ``sys.path``) and instantiates ``C(layer_param)``, a subclass of
:class:`pycaffe_lite.python_layer.Layer`. This adapter sets ``param_str``, ``phase`` and
``blobs`` on the user object and forwards ``setup`` (Caffe's LayerSetUp), ``reshape``,
``forward`` and ``backward(top, propagate_down, bottom)`` to it. Any number of bottoms and tops.
Loss comes from ``loss_weight`` in the prototxt, as for any layer. On the GPU the user code runs
on host copies (the blobs sync themselves). Attributes not defined here are looked up on the user
object, so ``net.layers[i].my_method()`` reaches the user's layer.
"""

from __future__ import annotations

import importlib

import numpy as np

from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.python_layer import BlobVec

_HOOKS = ("setup", "reshape", "forward", "backward")


@register_layer("Python")
class PythonLayer(Layer):
    traits = Traits(outside_effects=True)  # user code

    def __init__(self, param, dtype=np.float32) -> None:
        super().__init__(param, dtype=dtype)
        pp = self.layer_param.python_param
        if not pp.module or not pp.layer:
            raise self.error("python_param needs both 'module' and 'layer' (the class name)")
        try:
            module = importlib.import_module(pp.module)
        except ImportError as exc:
            raise self.error(
                f"cannot import module '{pp.module}' named in python_param (is it on sys.path / "
                f"PYTHONPATH?): {exc}"
            ) from exc
        except Exception as exc:  # the module itself fails: a syntax error, an exception at import
            if isinstance(exc, SyntaxError):
                where = f"{exc.filename}:{exc.lineno}"
            else:
                import traceback

                frame = traceback.extract_tb(exc.__traceback__)[-1]
                where = f"{frame.filename}:{frame.lineno}"
            raise self.error(f"module '{pp.module}' named in python_param failed while being imported "
                             f"({where}): {type(exc).__name__}: {exc}") from exc
        cls = getattr(module, pp.layer, None)
        if cls is None:
            raise self.error(f"module '{pp.module}' has no class '{pp.layer}' (python_param.layer)")
        missing = [h for h in _HOOKS if not callable(getattr(cls, h, None))]
        if not isinstance(cls, type) or missing:
            raise self.error(
                f"'{pp.module}.{pp.layer}' is not a layer class (lacks {', '.join(missing) or 'a class'}); "
                "subclass caffe.Layer"
            )
        user = cls(self.layer_param)
        blobs = BlobVec(self.blobs, dtype=self.dtype)  # weights embedded in the layer definition
        user.blobs = blobs
        user.param_str = pp.param_str
        user.phase = int(self.phase)
        object.__setattr__(self, "_user", user)
        self.blobs = blobs

    @property
    def user_layer(self):
        """The user's layer object."""
        return self._user

    def __getattr__(self, name: str):
        # Only called when normal lookup fails: reach the user object's attributes.
        user = self.__dict__.get("_user")
        if user is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__} has no attribute '{name}'")
        return getattr(user, name)

    def __setattr__(self, name: str, value) -> None:
        # Attributes the adapter owns stay here; anything else goes to the user object.
        user = self.__dict__.get("_user")
        if user is None or name.startswith("_") or name in self.__dict__ or hasattr(type(self), name):
            object.__setattr__(self, name, value)
        else:
            setattr(user, name, value)

    def layer_setup(self, bottom, top):
        self._user.setup(bottom, top)
        if self._user.blobs is not self.blobs:  # the user replaced the list
            self.blobs = BlobVec(self._user.blobs, dtype=self.dtype)
            self._user.blobs = self.blobs

    def reshape(self, bottom, top):
        self._user.reshape(bottom, top)

    def forward_cpu(self, bottom, top):
        self._user.forward(bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        self._user.backward(top, list(propagate_down), bottom)

    @property
    def share_in_parallel(self) -> bool:
        return bool(self.layer_param.python_param.share_in_parallel)
