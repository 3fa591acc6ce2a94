"""Lstm: the LSTM layer of CTPN's caffe fork (type "Lstm", ``lstm_param``), not BVLC's LSTM.

bottoms: ``x`` (T, N, ...) — T steps of N streams with I = count(2) inputs each — and optionally
``clip`` (T, N), the continuation flags (0 starts a sequence). top: h (T, N, H) with H =
``lstm_param.num_output``. Params, in the fork's order: W_i (4H, I), W_h (4H, H), b (4H,) (the
weights from ``weight_filler``, the bias from ``bias_filler``); gates in the order i, f, o, g::

    cl_t = clip[t] with a clip bottom, else 1 for t > 0 and 0 for t = 0
    a_t = W_i x_t + b + cl_t * W_h h_{t-1}
    i, f, o = sigmoid(a_t[:3H] split in three), g = tanh(a_t[3H:])
    c_t = cl_t * f * c_{t-1} + i * g,   h_t = o * tanh(c_t)

h_{-1} and c_{-1} are zero without a clip bottom; with one, they are the last step's h and c of
the previous forward (zero at first, and again when N changes), as the fork carries state for
truncated back-propagation. Backward: gradients for x and the params within the batch; the
gradient of every gate input is bounded to [-clipping_threshold, clipping_threshold] when that
is positive (0, the default: no bound). ``clip`` takes no gradient. Differences from the fork,
which agree with it for CTPN's nets (no clip bottom): the clip bottom may hold N streams (the fork
reads it correctly only for N = 1), and W_h's gradient leaves out the steps where ``cl_t`` is 0
(the fork adds them though they took no part in the forward). ``lstm_param.batch_size`` is read
by no layer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite import fillers
from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend, blas
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


def _sigmoid(x):
    return 0.5 * np.tanh(0.5 * x) + 0.5


@register_layer("Lstm")
class CtpnLstmLayer(Layer):
    traits = Traits(graph_safe=True, outside_effects=True)
    min_bottom_blobs = 1
    max_bottom_blobs = 2
    exact_num_top_blobs = 1

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.lstm_param
        if p.num_output <= 0:
            raise self.error("lstm_param.num_output must be positive")
        x = bottom[0]
        if x.num_axes < 2:
            raise self.error(f"bottom 0 must have at least 2 axes (time steps, streams, ...), got {x.shape}")
        self.H = p.num_output
        self.I = x.count_range(2)
        self.limit = float(p.clipping_threshold)
        shapes = [(4 * self.H, self.I), (4 * self.H, self.H), (4 * self.H,)]
        if self.blobs:
            if len(self.blobs) != 3:
                raise self.error(f"has {len(self.blobs)} param blobs, expected 3 (W_i, W_h, b)")
            self.check_param_shapes(shapes)
        else:
            self.blobs = [self.make_param_blob(s) for s in shapes]
            fillers.fill(self.blobs[0], p.weight_filler)
            fillers.fill(self.blobs[1], p.weight_filler)
            fillers.fill(self.blobs[2], p.bias_filler)
        self.gate = Blob(dtype=self.dtype)  # data: activated gates; diff: gate-input gradients
        self.cell = Blob(dtype=self.dtype)
        self.h0, self.c0, self.hT, self.cT = (Blob(dtype=self.dtype) for _ in range(4))

    def reshape(self, bottom, top):
        x = bottom[0]
        if x.num_axes < 2 or x.count_range(2) != self.I:
            raise self.error(f"bottom 0 must be (T, N, ...) with {self.I} inputs per step and stream "
                             f"(set when the layer was set up), got shape {x.shape}")
        self.T, self.N = x.shape[0], x.shape[1]
        if len(bottom) > 1 and (bottom[1].shape[0:1] != (self.T,) or bottom[1].count != self.T * self.N):
            raise self.error(f"bottom 1 (clip) must hold one flag per step and stream, (T, N) = "
                             f"{(self.T, self.N)}, got shape {bottom[1].shape}")
        H, T, N = self.H, self.T, self.N
        top[0].reshape((T, N, H))
        self.gate.reshape((T, N, 4 * H))
        self.cell.reshape((T, N, H))
        if self.hT.shape != (N, H):  # a new batch size drops the carried state
            for b in (self.h0, self.c0, self.hT, self.cT):
                b.reshape((N, H))
                b.mutable_cpu_data()[...] = 0

    # -- CPU ------------------------------------------------------------------------------------
    def _cont(self, bottom, t: int) -> np.ndarray:
        if len(bottom) > 1:
            return bottom[1].cpu_data().reshape(self.T, self.N)[t][:, None]
        return np.full((self.N, 1), 1.0 if t > 0 else 0.0, self.dtype)

    def forward_cpu(self, bottom, top):
        H, T, N = self.H, self.T, self.N
        w_i, w_h, b = (p.cpu_data() for p in self.blobs)
        has_clip = len(bottom) > 1
        h0 = self.h0.mutable_cpu_data()
        c0 = self.c0.mutable_cpu_data()
        h0[...] = self.hT.cpu_data() if has_clip else 0
        c0[...] = self.cT.cpu_data() if has_clip else 0
        gate = self.gate.mutable_cpu_data()
        gate[...] = (bottom[0].cpu_data().reshape(T * N, self.I) @ w_i.T + b).reshape(T, N, 4 * H)
        cell = self.cell.mutable_cpu_data()
        h = top[0].mutable_cpu_data()
        h_prev, c_prev = h0, c0
        for t in range(T):
            cl = self._cont(bottom, t)
            a = gate[t] + cl * (h_prev @ w_h.T)
            gate[t, :, :3 * H] = _sigmoid(a[:, :3 * H])
            gate[t, :, 3 * H:] = np.tanh(a[:, 3 * H:])
            i, f, o, g = (gate[t, :, k * H:(k + 1) * H] for k in range(4))
            cell[t] = cl * f * c_prev + i * g
            h[t] = o * np.tanh(cell[t])
            h_prev, c_prev = h[t], cell[t]
        self.hT.mutable_cpu_data()[...] = h[T - 1]
        self.cT.mutable_cpu_data()[...] = cell[T - 1]

    def backward_cpu(self, top, propagate_down, bottom):
        if len(bottom) > 1 and propagate_down[1]:
            raise self.error("cannot back-propagate to the continuation flags (bottom 1, clip)")
        H, T, N = self.H, self.T, self.N
        w_i, w_h, _ = (p.cpu_data() for p in self.blobs)
        gate, cell, h = self.gate.cpu_data(), self.cell.cpu_data(), top[0].cpu_data()
        dtop = top[0].cpu_diff()
        pgd = self.gate.mutable_cpu_diff()
        dh_carry = np.zeros((N, H), self.dtype)
        dc_carry = np.zeros((N, H), self.dtype)
        prev = np.empty((T, N, H), self.dtype)  # cl_t * h_{t-1}, for W_h's gradient
        for t in range(T - 1, -1, -1):
            cl = self._cont(bottom, t)
            i, f, o, g = (gate[t, :, k * H:(k + 1) * H] for k in range(4))
            c_prev = cell[t - 1] if t > 0 else self.c0.cpu_data()
            prev[t] = cl * (h[t - 1] if t > 0 else self.h0.cpu_data())
            tanh_c = np.tanh(cell[t])
            dh = dtop[t] + dh_carry
            dc = dc_carry + dh * o * (1 - tanh_c * tanh_c)
            dc_carry = cl * dc * f
            d = np.concatenate([dc * g * i * (1 - i), cl * dc * c_prev * f * (1 - f),
                                dh * tanh_c * o * (1 - o), dc * i * (1 - g * g)], axis=1)
            if self.limit > 0:
                np.clip(d, -self.limit, self.limit, out=d)
            pgd[t] = d
            dh_carry = cl * (d @ w_h)
        flat = pgd.reshape(T * N, 4 * H)
        x = bottom[0].cpu_data().reshape(T * N, self.I)
        if self.param_propagate_down[0]:
            self.blobs[0].mutable_cpu_diff()[...] += flat.T @ x
        if self.param_propagate_down[1]:
            self.blobs[1].mutable_cpu_diff()[...] += flat.T @ prev.reshape(T * N, H)
        if self.param_propagate_down[2]:
            self.blobs[2].mutable_cpu_diff()[...] += flat.sum(axis=0)
        if propagate_down[0]:
            bottom[0].mutable_cpu_diff()[...] = (flat @ w_i).reshape(bottom[0].shape)

    # -- GPU ------------------------------------------------------------------------------------
    def _clip_args(self, bottom, t: int) -> tuple[int, int]:
        if len(bottom) > 1:
            return 1, bottom[1].gpu_data() + t * self.N * self.dtype.itemsize
        return 0, self.gate.gpu_data()  # any valid pointer: not read

    def forward_gpu(self, bottom, top):
        H, T, N, dt = self.H, self.T, self.N, self.dtype
        size = dt.itemsize
        has_clip = len(bottom) > 1
        for src, dst in ((self.hT, self.h0), (self.cT, self.c0)):
            if has_clip:
                gm.copy(N * H, src.gpu_data(), dst.mutable_gpu_data(), dt)
            else:
                gm.set(N * H, 0.0, dst.mutable_gpu_data(), dt)
        gate = self.gate.mutable_gpu_data()
        blas.gemm(False, True, T * N, 4 * H, self.I, 1.0, bottom[0].gpu_data(), self.blobs[0].gpu_data(), 0.0,
                  gate, dt)
        gm.add_bias(T * N, 4 * H, self.blobs[2].gpu_data(), gate, dt)
        (h_to_gate,) = backend.workspace(N * 4 * H * size)
        cell = self.cell.mutable_gpu_data()
        h = top[0].mutable_gpu_data()
        w_h = self.blobs[1].gpu_data()
        step = backend.kernel(KERNELS, "ctpn_lstm_forward_step", dt)
        for t in range(T):
            h_prev = h + (t - 1) * N * H * size if t > 0 else self.h0.gpu_data()
            c_prev = cell + (t - 1) * N * H * size if t > 0 else self.c0.gpu_data()
            blas.gemm(False, True, N, 4 * H, H, 1.0, h_prev, w_h, 0.0, h_to_gate, dt)
            flag, clip = self._clip_args(bottom, t)
            step(N * H, H, flag, clip, t, h_to_gate, gate + t * N * 4 * H * size, c_prev,
                 cell + t * N * H * size, h + t * N * H * size)
        gm.copy(N * H, h + (T - 1) * N * H * size, self.hT.mutable_gpu_data(), dt)
        gm.copy(N * H, cell + (T - 1) * N * H * size, self.cT.mutable_gpu_data(), dt)

    def backward_gpu(self, top, propagate_down, bottom):
        if len(bottom) > 1 and propagate_down[1]:
            raise self.error("cannot back-propagate to the continuation flags (bottom 1, clip)")
        H, T, N, dt = self.H, self.T, self.N, self.dtype
        size = dt.itemsize
        nh = N * H
        dh_carry, dc_carry, prev = backend.workspace(nh * size, nh * size, T * nh * size)
        gm.set(nh, 0.0, dh_carry, dt)
        gm.set(nh, 0.0, dc_carry, dt)
        gate, cell, h = self.gate.gpu_data(), self.cell.gpu_data(), top[0].gpu_data()
        dtop = top[0].gpu_diff()
        pgd = self.gate.mutable_gpu_diff()
        w_h = self.blobs[1].gpu_data()
        step = backend.kernel(KERNELS, "ctpn_lstm_backward_step", dt)
        mask = backend.kernel(KERNELS, "ctpn_lstm_mask_rows", dt)
        for t in range(T - 1, -1, -1):
            flag, clip = self._clip_args(bottom, t)
            c_prev = cell + (t - 1) * nh * size if t > 0 else self.c0.gpu_data()
            pgd_t = pgd + t * N * 4 * H * size
            step(nh, H, flag, clip, t, gate + t * N * 4 * H * size, c_prev, cell + t * nh * size,
                 dtop + t * nh * size, dh_carry, dc_carry, self.limit, pgd_t)
            blas.gemm(False, False, N, H, 4 * H, 1.0, pgd_t, w_h, 0.0, dh_carry, dt)
            mask(nh, H, flag, clip, t, dh_carry)
        if self.param_propagate_down[0]:
            blas.gemm(True, False, 4 * H, self.I, T * N, 1.0, pgd, bottom[0].gpu_data(), 1.0,
                      self.blobs[0].mutable_gpu_diff(), dt)
        if self.param_propagate_down[1]:
            flag, clip = self._clip_args(bottom, 0)
            k = backend.kernel(KERNELS, "ctpn_lstm_masked_prev", dt)
            k(T * nh, nh, H, flag, clip, self.h0.gpu_data(), h, prev)
            blas.gemm(True, False, 4 * H, H, T * N, 1.0, pgd, prev, 1.0, self.blobs[1].mutable_gpu_diff(), dt)
        if self.param_propagate_down[2]:
            gm.sum_rows_into(T * N, 4 * H, pgd, self.blobs[2].mutable_gpu_diff(), dt, beta=1.0)
        if propagate_down[0]:
            blas.gemm(False, False, T * N, self.I, 4 * H, 1.0, pgd, self.blobs[0].gpu_data(), 0.0,
                      bottom[0].mutable_gpu_diff(), dt)
