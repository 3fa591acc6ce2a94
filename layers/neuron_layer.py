"""NeuronLayer: Caffe's family of element-wise layers (one bottom, one top of its shape, in place allowed).

A neuron type states its math once per device:

- CPU: ``cpu_forward(x) -> y`` and ``cpu_backward(x, y, dy) -> dx`` (numpy; in place, ``x`` is the
  output, as in Caffe);
- GPU: ``gpu_forward`` / ``gpu_backward``, CUDA statements over ``x[i]``, ``y[i]`` (forward) and
  ``x[i]``, ``y[i]``, ``dy[i]``, ``dx[i]`` (backward), plus the named scalars of ``gpu_scalars()``
  (``const Mtype``, or ``const int`` for Python ints). Class attributes, or instance attributes set in
  ``layer_setup`` when the statement depends on the parameters. Statements are written on ``Dtype``
  as if it were the math type; :func:`pycaffe_lite.gpu.math_statements.in_math` rewrites them to load
  through ``to_m``, compute in ``Mtype`` and store through ``from_m`` (identities for float and double),
  so they run on half storage too.

:meth:`NeuronLayer.launch` turns a statement into a ``backend.elementwise`` kernel: it passes only the
arrays the statement mentions (``const`` unless assigned) and every scalar, so layers with extra
buffers (Swish's sigmoid, PReLU's slopes) reuse it instead of writing launch code.
"""

from __future__ import annotations

import functools
import re
from typing import ClassVar

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu.math_statements import in_math
from pycaffe_lite.layer import Layer


class NeuronLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1
    allow_in_place: ClassVar[bool] = True  # False: setup refuses top == bottom (backward needs the input)
    gpu_forward: str = ""  # class attributes, or set per instance in layer_setup
    gpu_backward: str = ""

    def reshape(self, bottom, top):
        if top[0] is bottom[0] and not self.allow_in_place:
            raise self.error("does not allow in-place computation (its backward needs the input)")
        top[0].reshape(bottom[0].shape)

    def gpu_scalars(self) -> dict[str, float | int]:
        """Kernel scalars by name, in parameter order (``const Mtype``, or ``const int`` for ints)."""
        return {}

    # -- CPU --------------------------------------------------------------------------------
    def cpu_forward(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__}.cpu_forward")

    def cpu_backward(self, x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__}.cpu_backward")

    def forward_cpu(self, bottom, top):
        top[0].mutable_cpu_data()[...] = self.cpu_forward(bottom[0].cpu_data())

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            dx = self.cpu_backward(bottom[0].cpu_data(), top[0].cpu_data(), top[0].cpu_diff())
            bottom[0].mutable_cpu_diff()[...] = dx

    # -- GPU --------------------------------------------------------------------------------
    def forward_gpu(self, bottom, top):
        self.launch("forward", self.gpu_forward, bottom[0].count, x=bottom[0].gpu_data(),
                    y=top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.launch("backward", self.gpu_backward, bottom[0].count, x=bottom[0].gpu_data(),
                        y=top[0].gpu_data(), dy=top[0].gpu_diff(), dx=bottom[0].mutable_gpu_diff())

    def launch(self, tag: str, body: str, n: int, **arrays: int) -> None:
        """Run ``body`` for every ``i < n`` over the named ``Dtype`` device arrays it mentions and
        :meth:`gpu_scalars`; the kernel is ``<type>_<tag>`` (generated once per source and dtype)."""
        scalars = self.gpu_scalars()
        kinds = tuple((name, isinstance(v, int)) for name, v in scalars.items())
        used, params = _parameters(body, tuple(arrays), kinds)
        kernel = backend.elementwise(f"{self.type.lower()}_{tag}", params, in_math(body, used), self.dtype)
        kernel(n, *(arrays[name] for name in used), *scalars.values())


@functools.cache
def _parameters(body: str, arrays: tuple[str, ...], scalars: tuple[tuple[str, bool], ...]):
    """(arrays ``body`` mentions, the kernel's parameter list): arrays ``const`` unless assigned."""
    used = [name for name in arrays if re.search(rf"\b{name}\[", body)]
    written = {name for name in used if re.search(rf"\b{name}\[[^\]]*\]\s*[-+*/]?=(?!=)", body)}
    params = [f"{'' if name in written else 'const '}Dtype* {name}" for name in used]
    params += [f"const {'int' if is_int else 'Mtype'} {name}" for name, is_int in scalars]
    return used, ", ".join(params)
