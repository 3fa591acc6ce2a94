"""Unpooling / UnPooling (DeconvNet-style forks): the inverse of a pooling layer's windows.

Parameters: ``unpooling_param`` (DeconvNet: ``unpool`` MAX / AVE / TILE, ``kernel_size`` or
``kernel_h``/``kernel_w``, ``stride``, ``pad`` (0 only, as the fork), ``unpool_size`` or
``unpool_h``/``unpool_w``), or, without it, the ``pooling_param`` of the pooling it undoes (MAX or
AVE; forks whose Unpooling reuses that message). Bottom 0: values (N, C, H, W). Pooled cell
(ph, pw) owns the window starting at ``(ph · stride - pad, pw · stride - pad)`` of ``kernel`` size.

- MAX puts each value at its switch: bottom 1 of the shape of bottom 0 is the pooling mask (flat
  ``h · Wo + w``; a mask with more channels than the values, (N, C' > C, H, W), gives its first C
  planes of each image, as DeconvNet's layer reads it); bottom 1 of another shape is the pre-pooling input, from which the switches are
  recomputed (each window's first maximum, as Caffe's MAX pooling); with no bottom 1, the window's
  first cell (clipped to the output). Other outputs are 0; if two values land on one cell, the CPU
  keeps the later in row-major order, on both devices. Backward gathers the top diff at the switches
  (so values sharing a switch, possible with overlapping windows, each get its gradient, as in the
  forks).
- AVE adds ``value / window size`` over the window (the size counted before clipping at the far
  edge, as Caffe's average pooling), TILE adds the value itself. Backward is the adjoint.

Output size: ``unpool_size`` / ``unpool_h``, ``unpool_w``; else the pre-pooling input's size when it
is bottom 1; else with unpooling_param DeconvNet's ``max((H - 1) · stride + kernel - 2 pad,
H · stride - pad + 1)``, with pooling_param ``(H - 1) · stride + kernel - 2 pad``. A third bottom
(the pooling's count top in some forks) is accepted and not read. Neither the mask nor the
pre-pooling input takes a gradient.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

KERNELS = Path(__file__).with_suffix(".cu")
UP = caffe_pb2.UnpoolingParameter
PP = caffe_pb2.PoolingParameter
MAX, AVE, TILE = 0, 1, 2


def _hw(p, name, default=None):
    """(h, w) of a size given as ``name`` (``kernel_size`` for the kernel) or ``name_h`` / ``name_w``."""
    field = "kernel_size" if name == "kernel" else name
    has_h, has_w = p.HasField(f"{name}_h"), p.HasField(f"{name}_w")
    if has_h != has_w:
        raise ValueError(f"both {name}_h and {name}_w are needed")
    if has_h:
        if p.HasField(field):
            raise ValueError(f"{field} and {name}_h/{name}_w are both set")
        return int(getattr(p, f"{name}_h")), int(getattr(p, f"{name}_w"))
    if p.HasField(field):
        v = int(getattr(p, field))
        return v, v
    if default is None:
        raise ValueError(f"{field} (or {name}_h and {name}_w) is required")
    return default, default


@register_layer("Unpooling")
class UnpoolingLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=())
    min_bottom_blobs = 1
    max_bottom_blobs = 3
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        lp = self.layer_param
        self.deconvnet = lp.HasField("unpooling_param") or not lp.HasField("pooling_param")
        p = lp.unpooling_param if self.deconvnet else lp.pooling_param
        if not self.deconvnet and p.global_pooling:
            raise self.error("pooling_param.global_pooling cannot be unpooled (give kernel_size and stride)")
        try:
            self.kernel = _hw(p, "kernel")
            self.stride = _hw(p, "stride", default=1)
            self.pad = _hw(p, "pad", default=0)
        except ValueError as exc:
            raise self.error(f"{'unpooling_param' if self.deconvnet else 'pooling_param'}: {exc}") from None
        if min(self.kernel) <= 0 or min(self.stride) <= 0:
            raise self.error(f"kernel {self.kernel} and stride {self.stride} must be positive")
        if self.deconvnet:
            self.method = int(p.unpool)
            if self.pad != (0, 0):
                raise self.error(f"unpooling_param: only zero padding is supported (as DeconvNet), got {self.pad}")
            if p.HasField("unpool_size") and (p.HasField("unpool_h") or p.HasField("unpool_w")):
                raise self.error("unpooling_param: give unpool_size or unpool_h and unpool_w, not both")
            if p.HasField("unpool_h") != p.HasField("unpool_w"):
                raise self.error("unpooling_param: both unpool_h and unpool_w are needed")
            self.size = ((int(p.unpool_size),) * 2 if p.HasField("unpool_size")
                         else (int(p.unpool_h), int(p.unpool_w)) if p.HasField("unpool_h") else None)
        else:
            if p.pool not in (PP.MAX, PP.AVE):
                raise self.error("pooling_param.pool must be MAX or AVE for unpooling")
            self.method = MAX if p.pool == PP.MAX else AVE
            self.size = None
        if self.size is not None and min(self.size) <= 0:
            raise self.error(f"the unpooled size must be positive, got {self.size}")
        self.switches = Blob((), self.dtype)  # MAX: each value's flat destination

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index == 0

    def reshape(self, bottom, top):
        x = bottom[0]
        if x.num_axes != 4:
            raise self.error(f"bottom 0 must be (N, C, H, W), got shape {x.shape}")
        if top[0] is x:
            raise self.error("does not allow in-place computation")
        n, c, h, w = x.shape
        self.mode = "start"
        if len(bottom) > 1:
            b1 = bottom[1]
            if b1.shape == x.shape or (b1.num_axes == 4 and b1.shape[0] == n and b1.shape[1] > c
                                       and b1.shape[2:] == (h, w)):
                self.mode = "mask"  # more mask channels than values: the first C planes (DeconvNet)
            elif b1.num_axes == 4 and b1.shape[:2] == x.shape[:2]:
                self.mode = "recompute"
            else:
                raise self.error(f"bottom 1 must be the pooling mask (shape {x.shape}, or ({n}, C >= {c}, {h}, {w}): "
                                 f"its first {c} channels) or the pre-pooling input ({n}, {c}, H, W), got {b1.shape}")
        if self.method != MAX and self.mode != "start":
            self.mode = "start"  # AVE / TILE read no switches
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.pad
        if self.size is not None:
            ho, wo = self.size
        elif len(bottom) > 1 and bottom[1].shape != x.shape and bottom[1].num_axes == 4:
            ho, wo = bottom[1].shape[2:]
        elif self.deconvnet:
            ho = max((h - 1) * sh + kh - 2 * ph, h * sh - ph + 1)
            wo = max((w - 1) * sw + kw - 2 * pw, w * sw - pw + 1)
        else:
            ho, wo = (h - 1) * sh + kh - 2 * ph, (w - 1) * sw + kw - 2 * pw
        if ho <= 0 or wo <= 0:
            raise self.error(f"the unpooled size must be positive, got {ho} x {wo}")
        self.out_hw = (ho, wo)
        top[0].reshape((n, c, ho, wo))
        self.switches.reshape(x.shape if self.method == MAX else ())

    # -- geometry -------------------------------------------------------------------------------
    def _windows(self, h, w):
        """Per pooled row / column: window start, clipped start, clipped end, and the window size
        counted before clipping at the start (rows then columns)."""
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.pad
        ho, wo = self.out_hw
        out = []
        for n_in, k, s, p, n_out in ((h, kh, sh, ph, ho), (w, kw, sw, pw, wo)):
            start = np.arange(n_in) * s - p
            end = np.minimum(start + k, n_out + p)
            span = end - start
            out.append((start, np.maximum(start, 0), np.minimum(end, n_out), span))
        return out

    def _switch_indices(self, bottom):
        """MAX: (N*C, H*W) flat destinations in the output plane."""
        x = bottom[0]
        n, c, h, w = x.shape
        ho, wo = self.out_hw
        if self.mode == "mask":
            m = bottom[1].cpu_data()[:, :c].reshape(n * c, h * w).astype(np.int64)
            if m.size and (m.min() < 0 or m.max() >= ho * wo):
                raise self.error(f"mask index {int(m.max() if m.max() >= ho * wo else m.min())} lies outside the "
                                 f"{ho} x {wo} output")
            return m
        (rs, r0, r1, _), (cs, c0, c1, _) = self._windows(h, w)
        if self.mode == "start":
            uh = np.clip(rs, 0, ho - 1)
            uw = np.clip(cs, 0, wo - 1)
            return np.broadcast_to((uh[:, None] * wo + uw[None, :]).ravel(), (n * c, h * w))
        ref = bottom[1].cpu_data().reshape(n * c, ho, wo)
        out = np.zeros((n * c, h, w), np.int64)
        grid = np.arange(ho * wo).reshape(ho, wo)
        for i in range(h):
            for j in range(w):
                if r1[i] <= r0[i] or c1[j] <= c0[j]:
                    out[:, i, j] = r0[i] * wo + c0[j]
                    continue
                win = ref[:, r0[i]:r1[i], c0[j]:c1[j]].reshape(n * c, -1)
                out[:, i, j] = grid[r0[i]:r1[i], c0[j]:c1[j]].ravel()[win.argmax(axis=1)]
        return out.reshape(n * c, h * w)

    # -- CPU ------------------------------------------------------------------------------------
    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        n, c, h, w = x.shape
        ho, wo = self.out_hw
        if self.method == MAX:
            idx = self._switch_indices(bottom)
            self.switches.mutable_cpu_data()[...] = idx.reshape(x.shape)
            out = np.zeros((n * c, ho * wo), self.dtype)
            out[np.arange(n * c)[:, None], idx] = x.reshape(n * c, h * w)
            top[0].mutable_cpu_data()[...] = out.reshape(top[0].shape)
            return
        y = np.zeros(top[0].shape, self.dtype)
        (_, r0, r1, rspan), (_, c0, c1, cspan) = self._windows(h, w)
        for i in range(h):
            for j in range(w):
                f = 1.0 / (rspan[i] * cspan[j]) if self.method == AVE else 1.0
                y[:, :, r0[i]:r1[i], c0[j]:c1[j]] += (x[:, :, i, j] * f)[:, :, None, None]
        top[0].mutable_cpu_data()[...] = y

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n, c, h, w = bottom[0].shape
        dy = top[0].cpu_diff()
        if self.method == MAX:
            idx = self.switches.cpu_data().reshape(n * c, h * w).astype(np.int64)
            flat = dy.reshape(n * c, -1)
            bottom[0].mutable_cpu_diff()[...] = flat[np.arange(n * c)[:, None], idx].reshape(bottom[0].shape)
            return
        dx = np.zeros(bottom[0].shape, self.dtype)
        (_, r0, r1, rspan), (_, c0, c1, cspan) = self._windows(h, w)
        for i in range(h):
            for j in range(w):
                f = 1.0 / (rspan[i] * cspan[j]) if self.method == AVE else 1.0
                dx[:, :, i, j] = dy[:, :, r0[i]:r1[i], c0[j]:c1[j]].sum(axis=(2, 3)) * f
        bottom[0].mutable_cpu_diff()[...] = dx

    # -- GPU ------------------------------------------------------------------------------------
    def _geometry(self, bottom):
        n, c, h, w = bottom[0].shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.pad
        return (h, w, *self.out_hw, kh, kw, sh, sw, ph, pw)

    def forward_gpu(self, bottom, top):
        geo = self._geometry(bottom)
        y = top[0].mutable_gpu_data()
        if self.method == MAX:
            mode = {"mask": 0, "recompute": 1, "start": 2}[self.mode]
            ref = bottom[1].gpu_data() if len(bottom) > 1 else bottom[0].gpu_data()
            sw = self.switches.mutable_gpu_data()
            c, cm = bottom[0].shape[1], bottom[1].shape[1] if self.mode == "mask" else bottom[0].shape[1]
            backend.kernel(KERNELS, "unpool_switches", self.dtype)(bottom[0].count, *geo, mode, c, cm, ref, sw)
            S, T = geo[0] * geo[1], geo[2] * geo[3]
            gm.plane_scatter(bottom[0].count // S, S, T, bottom[0].gpu_data(), sw, y, self.dtype)
            return
        backend.kernel(KERNELS, "unpool_window_forward", self.dtype)(
            top[0].count, *geo, int(self.method == AVE), bottom[0].gpu_data(), y)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        geo = self._geometry(bottom)
        dx = bottom[0].mutable_gpu_diff()
        if self.method == MAX:
            S, T = geo[0] * geo[1], geo[2] * geo[3]
            gm.plane_gather(bottom[0].count // S, S, T, top[0].gpu_diff(), self.switches.gpu_data(), dx, self.dtype)
            return
        backend.kernel(KERNELS, "unpool_window_backward", self.dtype)(
            bottom[0].count, *geo, int(self.method == AVE), top[0].gpu_diff(), dx)


@register_layer("UnPooling")
class UnPoolingLayer(UnpoolingLayer):
    """The same layer under the other forks' spelling."""
    traits = Traits(graph_safe=True, backward_reads=())
