"""LSTMUnit: one step of an LSTM over N independent streams (BVLC's LSTMUnitLayer).

bottoms: ``c_prev`` (1, N, D), ``gates`` (1, N, 4D) holding the pre-activations of the input,
forget, output and candidate gates in that order (i', f', o', g'), and ``cont`` (1, N), the
sequence-continuation flags. tops: ``c`` (1, N, D) and ``h`` (1, N, D)::

    i = sigmoid(i'), o = sigmoid(o'), g = tanh(g')
    f = 0 where cont == 0, else cont * sigmoid(f')
    c = f * c_prev + i * g
    h = o * tanh(c)

Backward follows BVLC's formulas exactly (the forget-gate gradient is ``dc·c_prev·f·(1-f)`` with
``f`` already scaled by ``cont``; exact for the usual 0/1 flags). There is no gradient for
``cont``: asking for one is an error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * np.tanh(0.5 * x) + 0.5


@register_layer("LSTMUnit")
class LSTMUnitLayer(Layer):
    traits = Traits(graph_safe=True)
    exact_num_bottom_blobs = 3
    exact_num_top_blobs = 2

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 2

    def reshape(self, bottom, top):
        c_prev, gates, cont = bottom
        if c_prev.num_axes != 3 or gates.num_axes != 3 or cont.num_axes != 2:
            raise self.error(
                f"bottoms must be c_prev (1, N, D), gates (1, N, 4D) and cont (1, N); got shapes "
                f"{c_prev.shape}, {gates.shape} and {cont.shape}")
        num = c_prev.shape[1]
        for b in bottom:
            if b.shape[0] != 1 or b.shape[1] != num:
                raise self.error(
                    f"every bottom must hold one time step of the same N={num} streams (1, N, ...); got "
                    f"shapes {c_prev.shape}, {gates.shape} and {cont.shape}")
        self.D = c_prev.shape[2]
        if gates.shape[2] != 4 * self.D:
            raise self.error(f"gates bottom must have 4 x D = {4 * self.D} channels for c_prev {c_prev.shape}, "
                             f"got shape {gates.shape}")
        self.N = num
        top[0].reshape(c_prev.shape)
        top[1].reshape(c_prev.shape)

    def _gates(self, bottom):
        x = bottom[1].cpu_data().reshape(self.N, 4, self.D)
        cont = bottom[2].cpu_data().reshape(self.N, 1)
        i = _sigmoid(x[:, 0])
        f = np.where(cont == 0, 0.0, cont * _sigmoid(x[:, 1])).astype(self.dtype)
        o = _sigmoid(x[:, 2])
        g = np.tanh(x[:, 3])
        return i, f, o, g

    def forward_cpu(self, bottom, top):
        i, f, o, g = self._gates(bottom)
        c = f * bottom[0].cpu_data().reshape(self.N, self.D) + i * g
        top[0].mutable_cpu_data()[...] = c.reshape(top[0].shape)
        top[1].mutable_cpu_data()[...] = (o * np.tanh(c)).reshape(top[1].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[2]:
            raise self.error("cannot back-propagate to the sequence continuation flags (bottom 2, cont)")
        if not (propagate_down[0] or propagate_down[1]):
            return
        i, f, o, g = self._gates(bottom)
        shape = (self.N, self.D)
        c_prev = bottom[0].cpu_data().reshape(shape)
        tanh_c = np.tanh(top[0].cpu_data().reshape(shape))
        dh = top[1].cpu_diff().reshape(shape)
        dc = top[0].cpu_diff().reshape(shape) + dh * o * (1 - tanh_c * tanh_c)
        if propagate_down[0]:
            bottom[0].mutable_cpu_diff()[...] = (dc * f).reshape(bottom[0].shape)
        if propagate_down[1]:
            dx = bottom[1].mutable_cpu_diff().reshape(self.N, 4, self.D)
            dx[:, 0] = dc * g * i * (1 - i)
            dx[:, 1] = dc * c_prev * f * (1 - f)
            dx[:, 2] = dh * tanh_c * o * (1 - o)
            dx[:, 3] = dc * i * (1 - g * g)

    def forward_gpu(self, bottom, top):
        k = backend.kernel(KERNELS, "lstm_unit_forward", self.dtype)
        k(self.N * self.D, self.D, bottom[0].gpu_data(), bottom[1].gpu_data(), bottom[2].gpu_data(),
          top[0].mutable_gpu_data(), top[1].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[2]:
            raise self.error("cannot back-propagate to the sequence continuation flags (bottom 2, cont)")
        if not (propagate_down[0] or propagate_down[1]):
            return
        k = backend.kernel(KERNELS, "lstm_unit_backward", self.dtype)
        dc_prev = bottom[0].mutable_gpu_diff() if propagate_down[0] else bottom[0].gpu_data()
        dx = bottom[1].mutable_gpu_diff() if propagate_down[1] else bottom[1].gpu_data()
        k(self.N * self.D, self.D, bottom[0].gpu_data(), bottom[1].gpu_data(), bottom[2].gpu_data(),
          top[0].gpu_data(), top[0].gpu_diff(), top[1].gpu_diff(), int(propagate_down[0]),
          int(propagate_down[1]), dc_prev, dx)
