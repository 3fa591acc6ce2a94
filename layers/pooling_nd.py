"""Pooling's general path: any number of spatial axes, and STOCHASTIC pooling (``layers/pooling.py``
keeps its tuned 2-D MAX/AVE code and hands everything else to :class:`PoolingND`).

bottom ``(N, C, *S)``; top ``(N, C, *Q)`` with Caffe's pooled size per axis (``pooling.pooled_size``:
ceil by default, floor with ``round_mode: FLOOR`` or ``ceil_mode: false``; one less when the last
window would start in the padding). Geometry: ``kernel_size``/``pad``/``stride`` give one value for every
axis; ``kernel_size_nd``/``pad_nd``/``stride_nd`` (pycaffe-lite's fields) one value or one per axis;
``kernel_h``/``_w`` & co. only for 2-D; ``global_pooling`` takes the whole input.

- MAX: the first maximum of the window part inside the input; the optional mask top holds its flat
  index in the plane (``(i0*S1 + i1)*S2 + i2`` for 3-D; -1 and -FLT_MAX for an empty window).
- AVE: the sum inside the input over the window volume clipped to the padded input (Caffe's divisor).
- STOCHASTIC (BVLC's GPU semantics, on the CPU too; padding is refused as in BVLC): at TRAIN each
  window picks the first element whose running sum (row-major window order) reaches ``u * sum``,
  ``u ~ U[0, 1)``, i.e. an element with probability proportional to its (non-negative) activation; top
  is its value and backward routes the top diff to it. When the running sum never reaches the
  threshold (negative inputs) the window's last element is taken. At TEST top is
  ``sum(x²) / sum(x)`` over the window (0 when the sum is not positive), the activation-weighted mean;
  backward needs a TRAIN forward first. CPU draws come from ``common.rng()``; GPU draws from Philox
  keyed by ``common.next_gpu_seed()`` with a device-side counter (fresh draws on every graph replay).

GPU: one thread per top element forward, a gather per bottom element backward (``pooling_nd.cu``), up
to :data:`GPU_AXES` spatial axes; more axes run the CPU code on host copies.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import CudaError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer
from pycaffe_lite.memcheck import check_fits
from pycaffe_lite.schema import caffe_pb2

KERNELS = Path(__file__).with_suffix(".cu")
PP = caffe_pb2.PoolingParameter
LOWEST = -np.finfo(np.float32).max
GPU_AXES = 3

Dims = tuple[int, ...]


def pooled_size(size: int, kernel: int, pad: int, stride: int, ceil_mode: bool, any_pad: bool) -> int:
    """Caffe's pooled length of one axis (the same rule as the 2-D path)."""
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if any_pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _per_axis(layer: Layer, p: Any, field: str, nd_field: str, hw: str, default: int, axes: int) -> Dims | None:
    """One field's per-axis values (None: not given, for the kernel)."""
    nd = list(getattr(p, nd_field))
    has = p.HasField(field)
    has_hw = p.HasField(f"{hw}_h") or p.HasField(f"{hw}_w")
    if sum((bool(nd), has, has_hw)) > 1:
        raise layer.error(f"give one of {field}, {nd_field} or {hw}_h/{hw}_w")
    if nd:
        if len(nd) == 1:
            return (nd[0],) * axes
        if len(nd) != axes:
            raise layer.error(f"{nd_field} has {len(nd)} values; give 1 or one per spatial axis ({axes})")
        return tuple(nd)
    if has_hw:
        if axes != 2:
            raise layer.error(f"{hw}_h and {hw}_w are for 2-D pooling; this bottom has {axes} spatial axes")
        if not (p.HasField(f"{hw}_h") and p.HasField(f"{hw}_w")):
            raise layer.error(f"{hw}_h and {hw}_w must be given together")
        return getattr(p, f"{hw}_h"), getattr(p, f"{hw}_w")
    if has or field != "kernel_size":
        return (getattr(p, field) if has else default,) * axes
    return None


def _k(name: str, dtype) -> backend.Kernel:
    return backend.kernel(KERNELS, name, dtype)


class PoolingND:
    """Pooling over ``axes`` spatial axes of a ``(N, C, *S)`` bottom for ``layer`` (a PoolingLayer)."""

    def __init__(self, layer: Layer, p: Any, axes: int, ceil_mode: bool, ntop: int):
        self.layer = layer
        if axes > GPU_AXES:
            layer.traits = layer.traits.but(graph_safe=False)  # its GPU passes run the CPU code on host copies
        self.method = p.pool
        self.axes = axes
        self.ceil_mode = ceil_mode
        self.global_pooling = p.global_pooling
        kernel = _per_axis(layer, p, "kernel_size", "kernel_size_nd", "kernel", 0, axes)
        self.pad = _per_axis(layer, p, "pad", "pad_nd", "pad", 0, axes) or (0,) * axes
        self.stride = _per_axis(layer, p, "stride", "stride_nd", "stride", 1, axes) or (1,) * axes
        if ntop > 1 and self.method != PP.MAX:
            raise layer.error("only MAX pooling has a second (mask) top")
        if min(self.stride) <= 0:
            raise layer.error(f"stride must be positive, got {self.stride}")
        if self.method == PP.STOCHASTIC and any(self.pad):
            raise layer.error(f"STOCHASTIC pooling takes no padding (as in BVLC), got pad {self.pad}")
        if self.global_pooling:
            if kernel is not None:
                raise layer.error("global_pooling takes the kernel from the input: do not set a kernel size")
            if any(self.pad) or any(s != 1 for s in self.stride):
                raise layer.error("global_pooling requires pad 0 and stride 1")
            self.kernel: Dims = (0,) * axes
        else:
            if kernel is None:
                raise layer.error("pooling needs kernel_size (or kernel_size_nd, or kernel_h and kernel_w for 2-D)")
            if min(kernel) <= 0:
                raise layer.error(f"kernel size must be positive, got {kernel}")
            if any(pd >= k for pd, k in zip(self.pad, kernel)):
                raise layer.error(f"pad {self.pad} must be smaller than the kernel {kernel} on every axis")
            self.kernel = kernel
        self.index = Blob(dtype=np.float32)  # GPU: int32 index per top element (raw bits): MAX / STOCHASTIC
        self.index_shape: tuple | None = None  # top shape of the forward that filled the indices
        self.cpu_index: np.ndarray | None = None
        self.draw_counter = Blob((1,), np.float32)  # device-only uint32 draw counter (raw bits)
        self.generator: tuple[int, int, int] | None = None

    # -- shapes -----------------------------------------------------------------------------
    def reshape(self, bottom: list[Blob], top: list[Blob]) -> None:
        layer = self.layer
        shape = bottom[0].shape
        if len(shape) - 2 != self.axes:
            raise layer.error(f"bottom shape {shape} must keep {self.axes} spatial axes (as at set-up)")
        n, c, *spatial = shape
        self.in_shape: Dims = tuple(spatial)
        if self.global_pooling:
            self.kernel = self.in_shape
        any_pad = any(self.pad)
        self.pooled: Dims = tuple(pooled_size(*a, self.ceil_mode, any_pad)
                                  for a in zip(self.in_shape, self.kernel, self.pad, self.stride))
        if min(self.pooled) <= 0:
            raise layer.error(f"kernel {self.kernel} is larger than the input {self.in_shape} padded by {self.pad}: "
                              "the output would be empty")
        if common.mode() is common.Mode.CPU:  # the padded input and the stack of its windows
            scratch = n * c * (math.prod(s + p + a for s, p, a in zip(self.in_shape, self.pad, self._pad_after()))
                               + 2 * math.prod(self.kernel) * math.prod(self.pooled))
            check_fits(f"layer '{layer.name}' (Pooling)", f"kernel {self.kernel}, stride {self.stride} on a "
                       f"{self.in_shape} input: the padded input and the stack of its windows", scratch,
                       np.dtype(layer.dtype).itemsize)
        for t in top:
            t.reshape((n, c) + self.pooled)

    def _pad_after(self) -> Dims:
        return tuple(max(0, (q - 1) * s + k - b - n)
                     for q, s, k, b, n in zip(self.pooled, self.stride, self.kernel, self.pad, self.in_shape))

    # -- CPU --------------------------------------------------------------------------------
    def _stack(self, x: np.ndarray, value: float) -> tuple[np.ndarray, np.ndarray]:
        """(K, N, C, *Q) window values of the padded input and the (K, *Q) mask of offsets inside it."""
        after = self._pad_after()
        widths = [(0, 0), (0, 0)] + list(zip(self.pad, after))
        xp = np.pad(x, widths, constant_values=value) if any(self.pad) or any(after) else x
        inside = np.pad(np.ones(self.in_shape, bool), list(zip(self.pad, after)))
        k = math.prod(self.kernel)
        stack = np.empty((k,) + x.shape[:2] + self.pooled, dtype=x.dtype)
        valid = np.empty((k,) + self.pooled, dtype=bool)
        for i, offset in enumerate(itertools.product(*map(range, self.kernel))):
            where = tuple(slice(o, o + s * (q - 1) + 1, s) for o, s, q in zip(offset, self.stride, self.pooled))
            stack[i] = xp[(slice(None), slice(None)) + where]
            valid[i] = inside[where]
        return stack, valid

    def _flat_index(self, k: np.ndarray) -> np.ndarray:
        """Flat plane index of window offset ``k`` (an array shaped (N, C, *Q)) of each window."""
        offs = np.unravel_index(k, self.kernel)
        flat = np.zeros(k.shape, np.int64)
        for axis, (o, s, p, q, n) in enumerate(zip(offs, self.stride, self.pad, self.pooled, self.in_shape)):
            start = (np.arange(q) * s - p).reshape((q,) + (1,) * (self.axes - axis - 1))
            flat = flat * n + (start + o)
        return flat

    def forward_cpu(self, bottom: list[Blob], top: list[Blob]) -> None:
        x = bottom[0].cpu_data()
        y = top[0].mutable_cpu_data()
        if self.method == PP.AVE:
            stack, _ = self._stack(x, 0.0)
            y[...] = stack.sum(axis=0) / self._ave_divisor()
            return
        if self.method == PP.MAX:
            stack, _ = self._stack(x, -np.inf)
            stack = np.where(np.isnan(stack), -np.inf, stack)  # NaN never wins Caffe's ">" test
            k = stack.argmax(axis=0)
            best = np.take_along_axis(stack, k[None], 0)[0]
            valid = best > LOWEST
            y[...] = np.where(valid, best, LOWEST)
            index = np.where(valid, self._flat_index(k), -1)
            self._keep_index(index, y.shape)
            if len(top) > 1:
                top[1].mutable_cpu_data()[...] = index
            return
        stack, valid = self._stack(x, 0.0)  # STOCHASTIC: no padding, only ceil windows running past the end
        if self.layer.phase != common.TRAIN:
            total = stack.sum(axis=0)
            y[...] = np.where(total > 0, (stack * stack).sum(axis=0) / np.where(total > 0, total, 1), 0)
            self.cpu_index = None
            self.index_shape = None
            return
        running = np.cumsum(stack, axis=0)
        draws = common.rng().random(y.shape).astype(y.dtype)
        thres = (draws * running[-1]).astype(np.float32)  # BVLC keeps the threshold as a float
        valid = np.broadcast_to(valid[:, None, None], stack.shape)
        hit = (running >= thres) & valid
        last = (valid.shape[0] - 1) - valid[::-1].argmax(axis=0)
        k = np.where(hit.any(axis=0), hit.argmax(axis=0), last)
        y[...] = np.take_along_axis(stack, k[None], 0)[0]
        self._keep_index(self._flat_index(k), y.shape)

    def _keep_index(self, index: np.ndarray, shape: tuple) -> None:
        self.cpu_index = index
        self.index_shape = tuple(shape)

    def _ave_divisor(self) -> np.ndarray:
        size = np.ones(self.pooled)
        for axis, (q, s, k, p, n) in enumerate(zip(self.pooled, self.stride, self.kernel, self.pad, self.in_shape)):
            start = np.arange(q) * s - p
            size = size * (np.minimum(start + k, n + p) - start).reshape((q,) + (1,) * (self.axes - axis - 1))
        return size.astype(self.layer.dtype)

    def _routed_needs_forward(self) -> None:
        if self.method == PP.STOCHASTIC and self.layer.phase != common.TRAIN:
            raise self.layer.error("STOCHASTIC pooling backward routes to the elements a TRAIN forward sampled; "
                                   "this layer runs in the TEST phase")

    def backward_cpu(self, top: list[Blob], propagate_down: list[bool], bottom: list[Blob]) -> None:
        if not propagate_down[0]:
            return
        dy = top[0].cpu_diff()
        dx = bottom[0].mutable_cpu_diff()
        n, c = dx.shape[:2]
        plane = math.prod(self.in_shape)
        if self.method == PP.AVE:
            g = dy / self._ave_divisor()
            after = self._pad_after()
            dxp = np.zeros((n, c) + tuple(s + p + a for s, p, a in zip(self.in_shape, self.pad, after)), dx.dtype)
            for offset in itertools.product(*map(range, self.kernel)):
                where = tuple(slice(o, o + s * (q - 1) + 1, s) for o, s, q in zip(offset, self.stride, self.pooled))
                dxp[(slice(None), slice(None)) + where] += g
            dx[...] = dxp[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(self.pad, self.in_shape))]
            return
        self._routed_needs_forward()
        if self.cpu_index is None or self.index_shape != dy.shape:
            raise self.layer.error("pooling backward_cpu needs a forward_cpu on the same shapes first")
        index = self.cpu_index.reshape(n * c, -1)
        rows = np.arange(n * c)[:, None] * plane
        ok = index >= 0
        sums = np.bincount((rows + index)[ok], weights=dy.reshape(n * c, -1)[ok], minlength=n * c * plane)
        dx[...] = sums.reshape(dx.shape)

    # -- GPU --------------------------------------------------------------------------------
    def gpu(self) -> bool:
        return self.axes <= GPU_AXES

    def _geometry(self) -> tuple[int, ...]:
        lead = GPU_AXES - self.axes

        def fill(values: Dims, unit: int) -> Dims:
            return (unit,) * lead + tuple(values)

        return (*fill(self.in_shape, 1), *fill(self.pooled, 1), *fill(self.kernel, 1), *fill(self.stride, 1),
                *fill(self.pad, 0))

    def _seed_and_stream(self) -> tuple[int, int]:
        generation = common.seed_generation()
        if self.generator is None or self.generator[0] != generation:
            if backend.recording() is not None:
                raise CudaError(f"Pooling '{self.layer.name}' re-seeds its generator: run once before capturing")
            self.generator = (generation, *common.next_gpu_seed())
            backend.memset_zero(self.draw_counter.mutable_gpu_data(), 4)
        return self.generator[1], self.generator[2]

    def forward_gpu(self, bottom: list[Blob], top: list[Blob]) -> None:
        count = top[0].count
        x, y, geo = bottom[0].gpu_data(), top[0].mutable_gpu_data(), self._geometry()
        if self.method == PP.AVE:
            _k("nd_ave_pool_forward", self.layer.dtype)(count, x, *geo, y)
            return
        if self.method == PP.STOCHASTIC and self.layer.phase != common.TRAIN:
            _k("nd_sto_pool_forward_test", self.layer.dtype)(count, x, *geo, y)
            self.index_shape = None
            return
        self.index.reshape(top[0].shape)
        index = self.index.mutable_gpu_data()
        if self.method == PP.MAX:
            _k("nd_max_pool_forward", self.layer.dtype)(count, x, *geo, y, index)
            if len(top) > 1:
                _k("nd_pool_index_to_dtype", self.layer.dtype)(count, index, top[1].mutable_gpu_data())
        else:
            seed, stream = self._seed_and_stream()
            counter = self.draw_counter.mutable_gpu_data()
            _k("nd_sto_pool_forward_train", self.layer.dtype)(count, x, *geo, counter, seed, stream, y, index)
            _k("nd_sto_pool_advance", self.layer.dtype)(counter, grid=1, block=1)
        self.index_shape = tuple(top[0].shape)

    def backward_gpu(self, top: list[Blob], propagate_down: list[bool], bottom: list[Blob]) -> None:
        if not propagate_down[0] or bottom[0].count == 0:
            return
        count, geo = bottom[0].count, self._geometry()
        dy, dx = top[0].gpu_diff(), bottom[0].mutable_gpu_diff()
        if self.method == PP.AVE:
            _k("nd_ave_pool_backward", self.layer.dtype)(count, dy, *geo, dx)
            return
        self._routed_needs_forward()
        if self.index_shape != tuple(top[0].shape):
            raise self.layer.error("pooling backward_gpu needs a forward_gpu on the same shapes first")
        _k("nd_routed_pool_backward", self.layer.dtype)(count, dy, self.index.gpu_data(), *geo, dx)
