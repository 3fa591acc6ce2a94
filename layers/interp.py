"""Interp (DeepLab v2 / PSPNet): bilinear resize of (N, C, H, W) with aligned corners.

The input is first cropped by ``pad_beg`` / ``pad_end`` (both <= 0: ``-pad_beg`` rows and columns
dropped at the start, ``-pad_end`` at the end), giving ``Hi = H + pad_beg + pad_end`` (same for W).
The output size (the fork's precedence):

- ``shrink_factor`` s alone: ``(Hi - 1) / s + 1``;
- ``zoom_factor`` z alone: ``Hi + (Hi - 1)(z - 1)``;
- ``height`` and ``width``: as given;
- both factors: shrink, then zoom.

Output pixel (h, w) samples the cropped input at ``(h · (Hi - 1) / (Ho - 1), w · (Wi - 1) / (Wo - 1))``
(0 when the output side is 1), bilinearly; the ratios and source coordinates are computed in single
precision as the fork does, the blend in the layer's dtype. Equal sizes copy. Backward is the
adjoint (each output gradient spread over its four source pixels). The GPU backward accumulates
with atomics, so float32 sums may differ from the CPU in the last bits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_suffix(".cu")


def interp_weights(n_in: int, n_out: int, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per output index: the lower source index, its step to the upper one (0 or 1), the upper
    weight, with the fork's single-precision ratio."""
    ratio = np.float32(n_in - 1) / np.float32(n_out - 1) if n_out > 1 else np.float32(0)
    r = np.float32(ratio) * np.arange(n_out, dtype=np.float32)
    lo = r.astype(np.int64)
    step = (lo < n_in - 1).astype(np.int64)
    lam = (r - lo.astype(np.float32)).astype(dtype)
    return lo, step, lam


@register_layer("Interp")
class InterpLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.interp_param
        self.pad_beg, self.pad_end = p.pad_beg, p.pad_end
        if self.pad_beg > 0 or self.pad_end > 0:
            raise self.error(f"pad_beg and pad_end must be <= 0 (cropping), got {self.pad_beg} and {self.pad_end}")
        has_s, has_z = p.HasField("shrink_factor"), p.HasField("zoom_factor")
        if not (has_s or has_z or (p.HasField("height") and p.HasField("width"))):
            raise self.error("interp_param needs zoom_factor, shrink_factor, or both height and width")
        if has_s and p.shrink_factor < 1:
            raise self.error(f"shrink_factor must be >= 1, got {p.shrink_factor}")
        if has_z and p.zoom_factor < 1:
            raise self.error(f"zoom_factor must be >= 1, got {p.zoom_factor}")

    def reshape(self, bottom, top):
        if bottom[0].num_axes != 4:
            raise self.error(f"bottom must be (N, C, H, W), got shape {bottom[0].shape}")
        if top[0] is bottom[0]:
            raise self.error("does not allow in-place computation")
        p = self.layer_param.interp_param
        n, c, h, w = bottom[0].shape
        hi, wi = h + self.pad_beg + self.pad_end, w + self.pad_beg + self.pad_end
        if hi <= 0 or wi <= 0:
            raise self.error(f"cropping by pad_beg {self.pad_beg}, pad_end {self.pad_end} leaves no input of "
                             f"bottom {bottom[0].shape}")
        has_s, has_z = p.HasField("shrink_factor"), p.HasField("zoom_factor")
        if has_s and not has_z:
            ho, wo = (hi - 1) // p.shrink_factor + 1, (wi - 1) // p.shrink_factor + 1
        elif has_z and not has_s:
            ho, wo = hi + (hi - 1) * (p.zoom_factor - 1), wi + (wi - 1) * (p.zoom_factor - 1)
        elif p.HasField("height") and p.HasField("width"):
            ho, wo = p.height, p.width
        else:
            ho, wo = (hi - 1) // p.shrink_factor + 1, (wi - 1) // p.shrink_factor + 1
            ho, wo = ho + (ho - 1) * (p.zoom_factor - 1), wo + (wo - 1) * (p.zoom_factor - 1)
        if ho <= 0 or wo <= 0:
            raise self.error(f"output size must be positive, got {ho} x {wo}")
        self.hi, self.wi, self.ho, self.wo = hi, wi, ho, wo
        top[0].reshape((n, c, ho, wo))

    def _crop(self, a):
        o = -self.pad_beg
        return a[:, :, o:o + self.hi, o:o + self.wi]

    def forward_cpu(self, bottom, top):
        x = self._crop(bottom[0].cpu_data())
        y = top[0].mutable_cpu_data()
        if (self.hi, self.wi) == (self.ho, self.wo):
            y[...] = x
            return
        h0, hs, hl = interp_weights(self.hi, self.ho, self.dtype)
        w0, ws, wl = interp_weights(self.wi, self.wo, self.dtype)
        hl, wl = hl[:, None], wl[None, :]
        one = self.dtype.type(1)
        top_rows = x[:, :, h0]
        bot_rows = x[:, :, h0 + hs]
        upper = (one - wl) * top_rows[:, :, :, w0] + wl * top_rows[:, :, :, w0 + ws]
        lower = (one - wl) * bot_rows[:, :, :, w0] + wl * bot_rows[:, :, :, w0 + ws]
        y[...] = (one - hl) * upper + hl * lower

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx_full = bottom[0].mutable_cpu_diff()
        dx_full[...] = 0
        dx = self._crop(dx_full)
        dy = top[0].cpu_diff()
        if (self.hi, self.wi) == (self.ho, self.wo):
            dx[...] = dy
            return
        # The adjoint of the separable map y = A_h x A_w^T: dx = A_h^T dy A_w (two matrix products).
        ah, aw = self._matrix(self.hi, self.ho), self._matrix(self.wi, self.wo)
        dx[...] = np.matmul(np.matmul(ah.T, dy), aw)

    def _matrix(self, n_in: int, n_out: int) -> np.ndarray:
        """(n_out, n_in) interpolation weights along one axis."""
        lo, step, lam = interp_weights(n_in, n_out, self.dtype)
        m = np.zeros((n_out, n_in), self.dtype)
        rows = np.arange(n_out)
        np.add.at(m, (rows, lo), self.dtype.type(1) - lam)
        np.add.at(m, (rows, lo + step), lam)
        return m

    def forward_gpu(self, bottom, top):
        h, w = bottom[0].shape[2:]
        k = backend.kernel(KERNELS, "interp_forward", self.dtype)
        k(top[0].count, h, w, -self.pad_beg, self.hi, self.wi, self.ho, self.wo, bottom[0].gpu_data(),
          top[0].mutable_gpu_data())

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        h, w = bottom[0].shape[2:]
        dx = bottom[0].mutable_gpu_diff()
        backend.memset_zero(dx, bottom[0].count * self.dtype.itemsize)
        k = backend.kernel(KERNELS, "interp_backward", self.dtype)
        k(top[0].count, h, w, -self.pad_beg, self.hi, self.wi, self.ho, self.wo, top[0].gpu_diff(), dx)
