"""BatchNorm: normalize each channel (axis 1) to zero mean and unit variance.

bottom/top (N, C, ...). Params, stored as Caffe stores them: ``mean`` (C), ``variance`` (C) and
a 1-element scale factor ``s``; they are running sums, not learned, so their lr_mult is forced
to 0. With batch statistics (training): ``y = (x - μ_B) / sqrt(σ²_B + eps)``, and the running
sums become ``s = λs + 1``, ``mean = μ_B + λ·mean``, ``variance = m/(m-1)·σ²_B + λ·variance``
(λ = moving_average_fraction, m = N·spatial: the unbiased variance). With global statistics
(default in TEST) ``μ = mean/s`` and ``σ² = variance/s`` (``s == 0`` gives 0). On the GPU the
statistics, the factor ``1/s`` and the running-sum update stay on the device (CUDA-graph safe);
with batch statistics in place, the normalized output is saved for backward (as Caffe's
``x_norm_``). The GPU chain passes (:meth:`BatchNormLayer.chain_forward_gpu`,
:meth:`~BatchNormLayer.chain_backward_gpu`) run this layer with a following per-channel Scale and
ReLU as one forward and one backward (``runtime/fusion.py``'s NormChain).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.blob import Blob, math_dtype
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import NORM_CHAIN, NORM_FOLD, Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


def fold_kernels(has_scale: bool) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
    """(name, parameters, body) of the element-wise kernels folding BatchNorm (global statistics) and
    a Scale (gamma when ``has_scale``) into a convolution's weight and bias: weights, biases, gamma and
    beta are Dtype, the statistics (mean, var, s) Mtype, arithmetic in Mtype."""
    factor = "(s[0] == 0 ? Mtype(0) : Mtype(1) / s[0])"
    g = f"{'to_m(gamma[c])' if has_scale else 'Mtype(1)'} / sqrt(var[c] * {factor} + eps)"
    weight = ("fold_conv_weight", "const int per, const Dtype* w, const Dtype* gamma, const Mtype* var, "
              "const Mtype* s, const Mtype eps, Dtype* out", f"const int c = i / per; out[i] = from_m(to_m(w[i]) * {g})")
    bias = ("fold_conv_bias", "const Dtype* cbias, const int has_bias, const Mtype* mean, const Dtype* gamma, "
            "const Mtype* var, const Mtype* s, const Mtype eps, const Dtype* beta, const int has_beta, Dtype* out",
            f"const int c = i; out[i] = from_m(((has_bias ? to_m(cbias[c]) : Mtype(0)) - mean[c] * {factor}) * {g}"
            " + (has_beta ? to_m(beta[c]) : Mtype(0)))")
    return weight, bias


@register_layer("BatchNorm")
class BatchNormLayer(Layer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, regenerates_top=True, backward_reads=('top',), fuses=frozenset({NORM_FOLD, NORM_CHAIN}))
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.batch_norm_param
        self.maf = p.moving_average_fraction
        self.use_global_stats = (
            p.use_global_stats if p.HasField("use_global_stats") else self.phase == common.TEST
        )
        self.eps = p.eps
        self.channels = bottom[0].shape[1] if bottom[0].num_axes > 1 else 1
        shapes = [(self.channels,), (self.channels,), (1,)]
        if self.blobs:
            if len(self.blobs) != 3:
                raise self.error(f"has {len(self.blobs)} param blobs, expected 3 (mean, variance, scale factor)")
            self.check_param_shapes(shapes)
            for i, blob in enumerate(self.blobs):  # embedded statistics of a half layer: kept in float
                if blob.dtype != math_dtype(self.dtype):
                    stats = Blob(blob.shape, math_dtype(self.dtype))
                    stats.set_math_data(blob.math_data())
                    self.blobs[i] = stats
        else:
            self.blobs = [self.make_param_blob(s) for s in shapes]  # zeros
        # The statistics are not learned: lr_mult 0 for each, as Caffe forces.
        for i in range(3):
            if len(self.layer_param.param) == i:
                self.layer_param.param.add(lr_mult=0.0)
            elif self.layer_param.param[i].lr_mult != 0:
                raise self.error(
                    f"param {i} has lr_mult {self.layer_param.param[i].lr_mult}: batch normalization "
                    "statistics cannot be learned parameters (leave lr_mult unset or 0)"
                )
        self.param_propagate_down = [False] * 3
        # Per-channel statistics in the math type (float for a half layer, as its running sums):
        # the GPU kernels read and write them as Mtype while the data is Dtype.
        mt = math_dtype(self.dtype)
        self._mean = Blob((self.channels,), mt)
        self._var = Blob((self.channels,), mt)
        self._inv_std = Blob((self.channels,), mt)  # 1 / sqrt(var + eps)
        self._mean_dy = Blob((self.channels,), mt)
        self._mean_dyxc = Blob((self.channels,), mt)
        self._x_norm = Blob(dtype=self.dtype)  # CPU backward
        self._x_saved = Blob(dtype=self.dtype)  # GPU in place: the normalized output, for backward
        self._coef = Blob((3, self.channels), mt)  # chain backward: g * inv_std, mean dz, mean dz * xh

    def make_param_blob(self, shape) -> Blob:
        """The running statistics in the math type: float32 in a half layer whose kernels run on
        half data (its statistics type), its own dtype otherwise."""
        blob = super().make_param_blob(shape)
        return blob if blob.dtype == math_dtype(self.dtype) else Blob(shape, math_dtype(self.dtype))

    def reshape(self, bottom, top):
        if bottom[0].num_axes > 1 and bottom[0].shape[1] != self.channels:
            raise self.error(f"bottom {bottom[0].shape} has {bottom[0].shape[1]} channels, set up with {self.channels}")
        self.num = bottom[0].shape[0] if bottom[0].num_axes else 1
        self.spatial = bottom[0].count // max(self.num * self.channels, 1)
        self.in_place = bottom[0] is top[0]
        top[0].reshape(bottom[0].shape)

    def _bias_correction(self) -> float:
        m = self.num * self.spatial
        return m / (m - 1) if m > 1 else 1.0

    def _view(self, a):
        return a.reshape(self.num, self.channels, self.spatial)

    # -- CPU --------------------------------------------------------------------------------
    def forward_cpu(self, bottom, top):
        x = self._view(bottom[0].cpu_data())
        if self.use_global_stats:
            s = self.blobs[2].cpu_data().reshape(-1)[0]
            sf = 0.0 if s == 0 else 1.0 / s
            mean = sf * self.blobs[0].cpu_data()
            var = sf * self.blobs[1].cpu_data()
        else:
            mean = x.mean(axis=(0, 2))
        xc = x - mean.reshape(1, -1, 1)
        if not self.use_global_stats:
            var = (xc * xc).mean(axis=(0, 2))
            self.blobs[2].mutable_cpu_data()[...] = self.blobs[2].cpu_data() * self.maf + 1
            b0 = self.blobs[0].mutable_cpu_data()
            b0[...] = mean + self.maf * b0
            b1 = self.blobs[1].mutable_cpu_data()
            b1[...] = self._bias_correction() * var + self.maf * b1
        inv_std = 1.0 / np.sqrt(var + self.eps)
        self._inv_std.mutable_cpu_data()[...] = inv_std
        y = (xc * inv_std.reshape(1, -1, 1)).reshape(bottom[0].shape)
        if not self.use_global_stats:
            self._x_norm.reshape(bottom[0].shape)
            self._x_norm.mutable_cpu_data()[...] = y
        top[0].mutable_cpu_data()[...] = y

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = self._view(top[0].cpu_diff())
        inv_std = self._inv_std.cpu_data().reshape(1, -1, 1)
        if self.use_global_stats:
            dx = dy * inv_std
        else:
            # dx = (dy - mean(dy) - y·mean(dy·y)) / std, means over (num, spatial) per channel
            y = self._view(self._x_norm.cpu_data())
            dx = (dy - dy.mean(axis=(0, 2), keepdims=True) - y * (dy * y).mean(axis=(0, 2), keepdims=True)) * inv_std
        bottom[0].mutable_cpu_diff()[...] = dx.reshape(bottom[0].shape)

    # -- GPU: statistics stay on the device (no host reads: capturable in CUDA graphs) ------------
    def _k(self, name: str) -> backend.Kernel:
        return backend.kernel(KERNELS, name, self.dtype)

    def _statistics_gpu(self, x: int) -> tuple[int, int]:
        """The mean and 1/std this forward normalizes with, on the device: from the running sums
        (global statistics) or from ``x`` (batch statistics, which also update the running sums)."""
        C, S, N, dt = self.channels, self.spatial, self.num, self.dtype
        mean, inv_std = self._mean.mutable_gpu_data(), self._inv_std.mutable_gpu_data()
        if self.use_global_stats:
            self._k("bn_global_stats")(C, self.blobs[0].gpu_data(), self.blobs[1].gpu_data(),
                                       self.blobs[2].gpu_data(), self.eps, mean, inv_std)
        else:
            var = self._var.mutable_gpu_data()
            gm.channel_moments(N, C, S, x, mean, var, dt)
            self._k("bn_batch_stats")(C, self.maf, self._bias_correction(), self.eps, mean, var,
                                      self.blobs[0].mutable_gpu_data(), self.blobs[1].mutable_gpu_data(),
                                      self.blobs[2].mutable_gpu_data(), inv_std)
        return mean, inv_std

    def forward_gpu(self, bottom, top):
        x = bottom[0].gpu_data()
        mean, inv_std = self._statistics_gpu(x)
        if self.in_place and not self.use_global_stats:  # backward needs the normalized values,
            self._x_saved.reshape(bottom[0].shape)  # which a later layer may overwrite
            self._chain_apply(x, self._x_saved.mutable_gpu_data(), top[0].mutable_gpu_data(), None, False)
            return
        y = top[0].mutable_gpu_data()
        w = gm.vec_width(self.spatial, self.dtype, x, y)
        self._k(f"bn_normalize_v{w}")(bottom[0].count // w, self.channels, self.spatial, x, mean, inv_std, y)

    def backward_reads_data(self, top: bool, i: int) -> bool:
        """On global statistics dx = dy / std (the forward's table); in place, batch statistics read
        the normalized values from a buffer of this layer (``_x_norm`` on the CPU, ``_x_saved`` on
        the GPU); out of place the GPU reads the input (the chain with a Scale: the top)."""
        return not self.use_global_stats and not getattr(self, "in_place", False)

    def fuses_as(self, role, bottom=None) -> bool:
        """Heads a norm chain always; folds into a convolution on global statistics."""
        return super().fuses_as(role, bottom) and (role != NORM_FOLD or bool(self.use_global_stats))

    def fold_convolution(self, conv: Layer, scale: Layer | None, fused: Layer) -> None:
        """Write into ``fused`` (a convolution like ``conv`` with a bias term) the weight and bias of
        ``conv`` followed by this layer (global statistics) and ``scale`` (Caffe's Scale: gamma, and
        beta when it has a bias), from the current blobs::

            f = 1 / s (0 when s == 0), g_c = gamma_c / sqrt(var_c·f + eps)
            W'[c] = W[c]·g_c,   b'_c = (b_c − mean_c·f)·g_c + beta_c
        """
        w, b = fused.blobs
        channels = w.shape[0]
        per_channel = w.count // channels
        has_bias = len(conv.blobs) > 1
        has_beta = scale is not None and len(scale.blobs) > 1
        eps = float(self.eps)
        if common.mode() is common.Mode.GPU:
            # Weights, biases, gamma and beta are Dtype; the statistics (mean, var, s) are this
            # layer's params, Mtype (float32 in a half net, where they must be float: a half
            # fused weight with float statistics compiles for the weight's type)
            dt = w.dtype
            if self.blobs[0].dtype != math_dtype(dt):
                raise self.error(f"cannot fold into a {dt} convolution: statistics are {self.blobs[0].dtype}, "
                                 f"the fold reads them as {math_dtype(dt)}")
            gamma = scale.blobs[0].gpu_data() if scale is not None else self.blobs[0].gpu_data()
            beta = scale.blobs[1].gpu_data() if scale is not None and has_beta else gamma
            cbias = conv.blobs[1].gpu_data() if has_bias else gamma
            mean, var, s = (blob.gpu_data() for blob in self.blobs[:3])
            (wname, wparams, wbody), (bname, bparams, bbody) = fold_kernels(scale is not None)
            backend.elementwise(wname, wparams, wbody, dt)(w.count, per_channel, conv.blobs[0].gpu_data(), gamma, var,
                                                           s, eps, w.mutable_gpu_data())
            backend.elementwise(bname, bparams, bbody, dt)(channels, cbias, int(has_bias), mean, gamma, var, s, eps,
                                                           beta, int(has_beta), b.mutable_gpu_data())
            return
        inv_s = float(self.blobs[2].cpu_data().ravel()[0])
        inv_s = 0.0 if inv_s == 0 else 1.0 / inv_s
        cpu_mean = self.blobs[0].cpu_data().ravel() * inv_s
        cpu_gain = 1.0 / np.sqrt(self.blobs[1].cpu_data().ravel() * inv_s + eps)
        if scale is not None:
            cpu_gain = cpu_gain * scale.blobs[0].cpu_data().ravel()
        wdata = conv.blobs[0].cpu_data()
        w.mutable_cpu_data()[...] = wdata * cpu_gain.reshape((channels,) + (1,) * (wdata.ndim - 1)).astype(w.dtype)
        cpu_bias = conv.blobs[1].cpu_data().ravel() if has_bias else np.zeros(channels)
        cpu_beta = scale.blobs[1].cpu_data().ravel() if scale is not None and has_beta else np.zeros(channels)
        b.mutable_cpu_data()[...] = ((cpu_bias - cpu_mean) * cpu_gain + cpu_beta).astype(b.dtype)

    def regenerate_top_into(self, bottom: Blob, out: int) -> None:
        """Write this layer's last forward output into device pointer ``out`` again, bit for bit,
        from ``bottom`` (its input, which must be unchanged) and the statistics that forward used."""
        x = bottom.gpu_data()
        w = gm.vec_width(self.spatial, self.dtype, x, out)
        self._k(f"bn_normalize_v{w}")(bottom.count // w, self.channels, self.spatial, x, self._mean.gpu_data(),
                                      self._inv_std.gpu_data(), out)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        C, S, N, dt = self.channels, self.spatial, self.num, self.dtype
        dy, dx, inv_std = top[0].gpu_diff(), bottom[0].mutable_gpu_diff(), self._inv_std.gpu_data()
        if self.use_global_stats:
            if self.half_native:  # inv_std is a float buffer: dx = dy * inv_std in Mtype
                w = gm.vec_width(S, dt, dy, dx)
                self._k(f"bn_scale_v{w}")(top[0].count // w, C, S, dy, inv_std, dx)
            else:
                gm.channel_affine(N, C, S, dy, inv_std, None, dx, dt)
            return
        if self.in_place:  # _x_saved holds the normalized values
            self.chain_backward_gpu(top[0], self._x_saved, bottom[0], None, False)
            return
        x = bottom[0].gpu_data()
        mean, mean_dy, mean_dyxc = self._mean.gpu_data(), self._mean_dy.mutable_gpu_data(), self._mean_dyxc.mutable_gpu_data()
        # one pass over dy and x: mean(dy) and mean(dy·(x - mean)) per channel
        gm.channel_dot(N, C, S, dy, x, dt, sum_a=mean_dy, dot=mean_dyxc, alpha=1.0 / max(N * S, 1), shift=mean,
                       math_out=True)
        w = gm.vec_width(S, dt, dy, x, dx)
        self._k(f"bn_backward_v{w}")(top[0].count // w, C, S, dy, x, mean, inv_std, mean_dy, mean_dyxc, dx)

    # -- GPU chain: this layer, a per-channel Scale and a ReLU as one pass each way ----------------
    def _chain_apply(self, x: int, xhat: int, y: int, scale: Layer | None, relu: bool) -> None:
        """xhat = normalized x; y = relu?(xhat·gamma + beta) with ``scale``'s gamma (and beta)."""
        C, S, dt = self.channels, self.spatial, self.dtype
        if self.num * C * S == 0:
            return
        gamma = beta = self._inv_std.gpu_data()  # placeholders where there is no scale / shift
        has_b = False
        if scale is not None:
            gamma = scale.blobs[0].gpu_data()
            has_b = len(scale.blobs) > 1
            beta = scale.blobs[1].gpu_data() if has_b else gamma
        w = gm.vec_width(S, dt, x, xhat, y)
        self._k(f"bn_chain_forward_v{w}")(self.num * C * S // w, C, S, x, self._mean.gpu_data(),
                                          self._inv_std.gpu_data(), gamma, beta, int(scale is not None),
                                          int(has_b), int(relu), xhat, y)

    def saved_normalized(self) -> Blob:
        """The buffer an in-place chain keeps the normalized values in (this layer's own, shaped
        like its bottom)."""
        self._x_saved.reshape((self.num, self.channels, self.spatial))
        return self._x_saved

    def chain_forward_gpu(self, bottom: Blob, xhat: Blob, top: Blob, scale: Layer, relu: bool) -> None:
        """Forward of this layer, ``scale`` (a per-channel Scale: gamma, optional beta) and, when
        ``relu``, a ReLU (negative_slope 0) in one pass over ``bottom``: the normalized values go to
        ``xhat`` (this layer's top, or its saved buffer when the chain is in place; the Scale's input
        either way) and the result to ``top``. Statistics as :meth:`forward_gpu` (batch statistics
        update the running sums). The layers must have been reshaped."""
        x = bottom.gpu_data()
        self._statistics_gpu(x)
        self._chain_apply(x, xhat.mutable_gpu_data(), top.mutable_gpu_data(), scale, relu)

    def chain_backward_gpu(self, top: Blob, xhat: Blob, bottom: Blob | None, scale: Layer | None,
                           relu: bool) -> None:
        """Backward of the chain :meth:`chain_forward_gpu` ran (``scale`` None: this layer alone, in
        place): ``top.diff`` (the gradient of its result; ``top.data`` its result, the ReLU's mask)
        gives the Scale's param gradients (accumulated, where its ``param_propagate_down`` asks)
        and, when ``bottom`` is given, ``bottom.diff`` (assigned; it may be ``top``)."""
        C, S, N, dt = self.channels, self.spatial, self.num, self.dtype
        dx = bottom.mutable_gpu_diff() if bottom is not None else None
        dy, y, inv_std = top.gpu_diff(), top.gpu_data() if relu else top.gpu_diff(), self._inv_std.gpu_data()
        xh = xhat.gpu_data()
        gamma = scale.blobs[0].gpu_data() if scale is not None else inv_std
        want_gamma = scale is not None and scale.param_propagate_down[0]
        want_beta = scale is not None and len(scale.blobs) > 1 and scale.param_propagate_down[1]
        batch = not self.use_global_stats and dx is not None
        if (dx is None and not (want_gamma or want_beta)) or N * C * S == 0:
            return
        w = gm.vec_width(S, dt, dy, y, xh, *([dx] if dx is not None else []))
        chunks, part = gm.reduce_partials(N, C, S, w, dt)
        write_dx = dx is not None and not batch
        self._k(f"bn_chain_reduce_v{w}")(chunks, N, C, S, dy, y, xh, int(relu), gamma, int(scale is not None),
                                         inv_std, int(write_dx), dx if write_dx else part, part,
                                         grid=(chunks * C, 1, 1), block=gm.REDUCE_THREADS)
        coef, isz = self._coef.mutable_gpu_data(), self._coef.dtype.itemsize
        gamma_diff = scale.blobs[0].mutable_gpu_diff() if want_gamma and scale is not None else part
        beta_diff = scale.blobs[1].mutable_gpu_diff() if want_beta and scale is not None else part
        self._k("bn_chain_finish")(C, chunks, part, int(want_gamma), gamma_diff, int(want_beta), beta_diff, int(batch),
                                   1.0 / max(N * S, 1), gamma, int(scale is not None), inv_std,
                                   coef, coef + C * isz, coef + 2 * C * isz)
        if batch:
            assert dx is not None
            self._k(f"bn_chain_backward_v{w}")(N * C * S // w, C, S, dy, y, xh, int(relu), coef,
                                               coef + C * isz, coef + 2 * C * isz, dx)
