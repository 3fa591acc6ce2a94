"""BN: the forks' batch normalization with the scale and shift in the same layer.

Two layouts, picked from the prototxt (SegNet's fields ``bn_mode`` / ``scale_filler`` /
``shift_filler``, or two embedded blobs, select SegNet; otherwise yjxiong's / PSPNet's):

- **yjxiong / PSPNet** (``bn_param { slope_filler bias_filler momentum eps frozen }``): four blobs of
  shape (1, C): slope, bias, running mean, running variance (the last two get lr_mult 0, and with
  ``frozen`` all four, as the fork forces). In TRAIN (not frozen) the batch mean and biased variance
  over (N, H, W) normalize, and the running values become ``momentum · old + (1 - momentum) · batch``;
  in TEST or when frozen the running values normalize. ``y = slope · (x - mean) / sqrt(var + eps) + bias``.
  The running variance of a new frozen layer starts at 1, otherwise 0 (the fork's initial values).
- **SegNet** (``bn_param { bn_mode scale_filler shift_filler }``): two blobs (1, C, 1, 1): scale and
  shift. ``LEARN`` (the default, in both phases) normalizes with the batch statistics
  (``eps = 1e-9``) and may write them to optional tops 1 and 2 (mean and biased variance,
  (1, C, 1, 1)); ``INFERENCE`` is ``y = scale · x + shift`` (SegNet's statistics script folds the
  statistics into those blobs).

Bottom (N, C, ...), top of its shape; in place allowed. Backward with batch statistics is the usual
batch-norm gradient; with fixed statistics ``dx = dy · slope / sqrt(var + eps)``. Parameter gradients
accumulate (slope: Σ dy · x̂, bias: Σ dy), except when frozen. Forward keeps x̂ for backward only in
place; otherwise backward normalizes its input again (on the GPU Σ dy · (x - mean) in one pass, then
times 1 / std), so forward writes nothing but the top.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite import common, fillers
from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

KERNELS = Path(__file__).with_suffix(".cu")
SEGNET_EPS = 1e-9


@register_layer("BN")
class BNLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=('bottom',))
    exact_num_bottom_blobs = 1
    min_top_blobs = 1
    max_top_blobs = 3

    def layer_setup(self, bottom, top):
        p = self.layer_param.bn_param
        self.segnet = (p.HasField("bn_mode") or p.HasField("scale_filler") or p.HasField("shift_filler")
                       or len(self.blobs) == 2)
        yj = [f for f in ("slope_filler", "bias_filler", "momentum", "eps", "frozen") if p.HasField(f)]
        if self.segnet and yj:
            raise self.error(f"bn_param mixes SegNet's fields (bn_mode, scale_filler, shift_filler) with "
                             f"yjxiong's ({', '.join(yj)})")
        if bottom[0].num_axes < 2:
            raise self.error(f"bottom must be (N, C, ...), got shape {bottom[0].shape}")
        c = self.channels = bottom[0].shape[1]
        if self.segnet:
            self.frozen = False
            self.batch_stats = p.bn_mode == caffe_pb2.BNParameter.LEARN
            self.eps = SEGNET_EPS
            shapes = [(1, c, 1, 1)] * 2
            fills = [p.scale_filler, p.shift_filler]
        else:
            if len(top) > 1:
                raise self.error("only SegNet's BN (bn_mode) has the batch mean and variance tops")
            self.frozen = p.frozen
            self.batch_stats = not self.frozen and self.phase == common.TRAIN
            self.eps = float(np.float32(p.eps))
            self.momentum = float(np.float32(p.momentum))
            if self.eps <= 0:
                raise self.error(f"bn_param.eps must be positive, got {self.eps}")
            shapes = [(1, c)] * 4
            fills = [p.slope_filler, p.bias_filler]
        if self.blobs:
            if len(self.blobs) != len(shapes):
                raise self.error(f"has {len(self.blobs)} param blobs, expected {len(shapes)} "
                                 f"({'SegNet: scale, shift' if self.segnet else 'slope, bias, mean, variance'})")
            self.check_param_shapes(shapes)
        else:
            self.blobs = [self.make_param_blob(s) for s in shapes]
            for blob, fp in zip(self.blobs, fills):
                fillers.fill(blob, fp)
            if not self.segnet and self.frozen:
                self.blobs[3].mutable_cpu_data()[...] = 1
        if not self.segnet:  # the fork's forced multipliers
            while len(self.layer_param.param) < 4:
                self.layer_param.param.add()
            for i in (0, 1, 2, 3) if self.frozen else (2, 3):
                self.layer_param.param[i].lr_mult = 0
                self.layer_param.param[i].decay_mult = 0
        self.param_propagate_down = [not self.frozen] * 2 + [False] * (len(self.blobs) - 2)
        # Per-channel coefficients y = a x + b, the normalization (mean, inv_std) and backward sums.
        self._coef = Blob((4, c), self.dtype)  # a, b, mean, inv_std
        self._stats = Blob((4, c), self.dtype)  # batch mean, batch var, sum dy, sum dy * x_hat
        self._x_hat = Blob((), self.dtype)

    def reshape(self, bottom, top):
        x = bottom[0]
        if x.num_axes < 2 or x.shape[1] != self.channels:
            raise self.error(f"bottom {x.shape} must have {self.channels} channels (axis 1)")
        self.num = x.shape[0]
        self.spatial = x.count_range(2)
        if top[0] is not x:
            top[0].reshape(x.shape)
        for t in top[1:]:
            t.reshape((1, self.channels, 1, 1))
        # Backward needs x_hat (x itself in SegNet's INFERENCE) with batch statistics or learned
        # parameters: kept by forward in place (the input is gone by then), else rebuilt from the input.
        self.needs_x_hat = self.batch_stats or not self.frozen
        self.keep_x_hat = self.needs_x_hat and top[0] is x
        self._x_hat.reshape(x.shape if self.keep_x_hat else ())

    # -- coefficients ------------------------------------------------------------------------
    def _fixed(self):
        """(mean, var) of the fixed statistics, or None for SegNet's INFERENCE (y = scale x + shift)."""
        if self.segnet:
            return None
        return self.blobs[2].cpu_data().ravel(), self.blobs[3].cpu_data().ravel()

    # -- CPU ---------------------------------------------------------------------------------
    def _cview(self, a):
        return a.reshape(self.num, self.channels, self.spatial)

    def forward_cpu(self, bottom, top):
        x = self._cview(bottom[0].cpu_data())
        slope, bias = self.blobs[0].cpu_data().ravel(), self.blobs[1].cpu_data().ravel()
        if self.batch_stats:
            mean = x.mean(axis=(0, 2))
            var = ((x - mean[None, :, None]) ** 2).mean(axis=(0, 2))
            if len(top) > 1:
                top[1].mutable_cpu_data()[...] = mean.reshape(top[1].shape)
            if len(top) > 2:
                top[2].mutable_cpu_data()[...] = var.reshape(top[2].shape)
            if not self.segnet:
                m = self.momentum
                rm, rv = self.blobs[2].mutable_cpu_data(), self.blobs[3].mutable_cpu_data()
                rm[...] = m * rm + (1 - m) * mean.reshape(rm.shape)
                rv[...] = m * rv + (1 - m) * var.reshape(rv.shape)
        elif self.segnet:
            mean, var = np.zeros(self.channels, self.dtype), None
        else:
            mean, var = self._fixed()
        inv_std = np.ones(self.channels, self.dtype) if var is None else 1.0 / np.sqrt(var + self.eps)
        coef = self._coef.mutable_cpu_data()
        coef[0] = slope * inv_std
        coef[1] = bias - mean * coef[0]
        coef[2], coef[3] = mean, inv_std
        if self.keep_x_hat:
            self._x_hat.mutable_cpu_data()[...] = self._normalize_cpu(x).reshape(self._x_hat.shape)
        y = coef[0][None, :, None] * x + coef[1][None, :, None]
        top[0].mutable_cpu_data()[...] = y.reshape(top[0].shape)

    def _normalize_cpu(self, x):
        """x_hat of x (N, C, S): ``(x - mean[c]) * inv_std[c]`` with the last forward's coefficients."""
        coef = self._coef.cpu_data()
        return (x - coef[2][None, :, None]) * coef[3][None, :, None]

    def _learn(self) -> tuple[bool, bool]:
        """Whether slope and bias take gradients: never when frozen (x_hat is at hand otherwise)."""
        return (not self.frozen and self.param_propagate_down[0], not self.frozen and self.param_propagate_down[1])

    def backward_cpu(self, top, propagate_down, bottom):
        dy = self._cview(top[0].cpu_diff())
        coef = self._coef.cpu_data()
        x_hat = None
        if self.keep_x_hat:
            x_hat = self._cview(self._x_hat.cpu_data())
        elif self.needs_x_hat:
            x_hat = self._normalize_cpu(self._cview(bottom[0].cpu_data()))
        sum_dy = dy.sum(axis=(0, 2))
        sum_dyx = (dy * x_hat).sum(axis=(0, 2)) if x_hat is not None else None
        learn = self._learn()
        if learn[0] and sum_dyx is not None:
            d = self.blobs[0].mutable_cpu_diff()
            d[...] += sum_dyx.reshape(d.shape)
        if learn[1]:
            d = self.blobs[1].mutable_cpu_diff()
            d[...] += sum_dy.reshape(d.shape)
        if not propagate_down[0]:
            return
        a = coef[0][None, :, None]
        if self.batch_stats:
            m = self.num * self.spatial
            dx = a * (dy - sum_dy[None, :, None] / m - x_hat * sum_dyx[None, :, None] / m)
        else:
            dx = a * dy
        bottom[0].mutable_cpu_diff()[...] = dx.reshape(bottom[0].shape)

    # -- GPU ---------------------------------------------------------------------------------
    def _k(self, name):
        return backend.kernel(KERNELS, name, self.dtype)

    def forward_gpu(self, bottom, top):
        c, n, s = self.channels, self.num, self.spatial
        coef, stats = self._coef.mutable_gpu_data(), self._stats.mutable_gpu_data()
        it = self.dtype.itemsize
        a, b, mean, inv_std = (coef + k * c * it for k in range(4))
        bmean, bvar = stats, stats + c * it
        slope, bias = self.blobs[0].gpu_data(), self.blobs[1].gpu_data()
        if self.batch_stats:
            gm.channel_moments(n, c, s, bottom[0].gpu_data(), bmean, bvar, self.dtype)
            for t, src in zip(top[1:], (bmean, bvar)):
                gm.copy(c, src, t.mutable_gpu_data(), self.dtype)
            upd = not self.segnet
            rm = self.blobs[2].mutable_gpu_data() if upd else bmean
            rv = self.blobs[3].mutable_gpu_data() if upd else bvar
            self._k("bn_coeffs")(c, bmean, bvar, slope, bias, self.eps, 1, int(upd),
                                 self.momentum if upd else 0.0, rm, rv, a, b, mean, inv_std)
        elif self.segnet:  # INFERENCE: a = scale, b = shift, mean 0, inv_std 1
            self._k("bn_coeffs")(c, bmean, bvar, slope, bias, 0.0, 0, 0, 0.0, bmean, bvar, a, b, mean, inv_std)
        else:
            rm, rv = self.blobs[2].gpu_data(), self.blobs[3].gpu_data()
            self._k("bn_coeffs")(c, rm, rv, slope, bias, self.eps, 1, 0, 0.0, bmean, bvar, a, b, mean, inv_std)
        x, y = bottom[0].gpu_data(), top[0].mutable_gpu_data()
        x_hat = self._x_hat.mutable_gpu_data() if self.keep_x_hat else y
        w = gm.vec_width(s, self.dtype, x, x_hat, y)
        self._k(f"bn_affine_v{w}")(bottom[0].count // w, c, s, x, a, b, mean, inv_std, int(self.keep_x_hat), x_hat, y)

    def backward_gpu(self, top, propagate_down, bottom):
        c, n, s = self.channels, self.num, self.spatial
        it = self.dtype.itemsize
        coef, stats = self._coef.gpu_data(), self._stats.mutable_gpu_data()
        a, mean, inv_std = coef, coef + 2 * c * it, coef + 3 * c * it
        sum_dy, sum_dyx = stats + 2 * c * it, stats + 3 * c * it
        dy = top[0].gpu_diff()
        # x_hat's source: the kept x_hat, or the input normalized again on the fly
        xs = self._x_hat.gpu_data() if self.keep_x_hat else bottom[0].gpu_data()
        learn = self._learn()
        if self.batch_stats or any(learn):  # then x_hat is at hand (batch statistics, or not frozen)
            if self.keep_x_hat:
                gm.channel_dot(n, c, s, dy, xs, self.dtype, sum_a=sum_dy, dot=sum_dyx)
            else:  # sum dy (x - mean), times inv_std
                gm.channel_dot(n, c, s, dy, xs, self.dtype, sum_a=sum_dy, dot=sum_dyx, shift=mean)
                gm.mul(c, sum_dyx, inv_std, sum_dyx, self.dtype)
            if learn[0]:
                gm.add(c, self.blobs[0].gpu_diff(), sum_dyx, self.blobs[0].mutable_gpu_diff(), self.dtype)
            if learn[1]:
                gm.add(c, self.blobs[1].gpu_diff(), sum_dy, self.blobs[1].mutable_gpu_diff(), self.dtype)
        if not propagate_down[0]:
            return
        dx = bottom[0].mutable_gpu_diff()
        w = gm.vec_width(s, self.dtype, dy, xs, dx)
        if self.batch_stats:
            self._k(f"bn_backward_batch_v{w}")(bottom[0].count // w, c, s, self.dtype.type(1.0 / (n * s)), dy, xs,
                                               int(not self.keep_x_hat), mean, inv_std, a, sum_dy, sum_dyx, dx)
        else:
            self._k(f"bn_backward_fixed_v{w}")(bottom[0].count // w, c, s, dy, a, dx)
