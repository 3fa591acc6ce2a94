"""Eltwise: element-wise PROD, SUM (with optional per-bottom ``coeff``) or MAX of >= 2 bottoms.

All bottoms and the top have the same shape. MAX records which bottom won each element (an
argmax mask, kept as a float blob of indices) and routes the gradient there only; ties follow
Caffe (between bottoms 0 and 1 the later wins, afterwards the earlier). PROD's gradient is
``top_diff * prod_{j != i} bottom_j`` with ``stable_prod_grad`` (default), else
``top_diff * top / bottom_i``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import SUM_RELU, Layer, Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

KERNELS = Path(__file__).with_suffix(".cu")
# (parameters, body) of PROD's gradient dx = dy * y / x, in Mtype
PROD_GRAD_KERNEL = ("const Dtype* dy, const Dtype* y, const Dtype* x, Dtype* dx",
                    "dx[i] = from_m(to_m(dy[i]) * to_m(y[i]) / to_m(x[i]))")
Op = caffe_pb2.EltwiseParameter


@register_layer("Eltwise")
class EltwiseLayer(Layer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, writes_all_bottom_diffs=True, backward_reads=(), fuses=frozenset({SUM_RELU}))
    min_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.eltwise_param
        self.op = p.operation
        if p.coeff and len(p.coeff) != len(bottom):
            raise self.error(f"takes one coeff per bottom blob: {len(p.coeff)} coeffs for {len(bottom)} bottoms")
        if p.coeff and self.op != Op.SUM:
            raise self.error("coeff is only allowed for operation SUM")
        self.coeffs = list(p.coeff) if p.coeff else [1.0] * len(bottom)
        self.stable_prod_grad = p.stable_prod_grad
        self.mask = Blob((), self.dtype) if self.op == Op.MAX else None

    def reshape(self, bottom, top):
        for i in range(1, len(bottom)):
            if bottom[i].shape != bottom[0].shape:
                raise self.error(
                    f"bottom {i} has shape {bottom[i].shape}, "
                    f"bottom 0 has {bottom[0].shape}; all bottoms must have the same shape", ShapeError
                )
        top[0].reshape(bottom[0].shape)
        if self.mask is not None:
            self.mask.reshape(bottom[0].shape)

    # -- CPU --------------------------------------------------------------------------------
    def forward_cpu(self, bottom, top):
        xs = [b.cpu_data() for b in bottom]
        if self.op == Op.PROD:
            y = xs[0] * xs[1]
            for x in xs[2:]:
                y = y * x
        elif self.op == Op.SUM:
            y = np.zeros_like(xs[0])
            for c, x in zip(self.coeffs, xs):
                y = y + c * x
        else:
            mask = np.where(xs[0] > xs[1], 0, 1)
            y = np.where(xs[0] > xs[1], xs[0], xs[1])
            for i, x in enumerate(xs[2:], start=2):
                win = x > y
                mask = np.where(win, i, mask)
                y = np.where(win, x, y)
            self.mask.mutable_cpu_data()[...] = mask
        top[0].mutable_cpu_data()[...] = y

    def backward_cpu(self, top, propagate_down, bottom):
        dy = top[0].cpu_diff()
        for i, b in enumerate(bottom):
            if not propagate_down[i]:
                continue
            if self.op == Op.PROD:
                if self.stable_prod_grad:
                    others = np.ones_like(dy)
                    for j, other in enumerate(bottom):
                        if j != i:
                            others = others * other.cpu_data()
                    dx = dy * others
                else:
                    dx = dy * top[0].cpu_data() / b.cpu_data()
            elif self.op == Op.SUM:
                dx = self.coeffs[i] * dy
            else:
                dx = np.where(self.mask.cpu_data() == i, dy, 0)
            b.mutable_cpu_diff()[...] = dx

    # -- GPU: one pass per output (SUM over up to four bottoms per pass) ------------------------
    def forward_gpu(self, bottom, top):
        n, dt = top[0].count, self.dtype
        y = top[0].mutable_gpu_data()
        if self.op == Op.PROD:
            gm.mul(n, bottom[0].gpu_data(), bottom[1].gpu_data(), y, dt)
            for b in bottom[2:]:
                gm.mul(n, y, b.gpu_data(), y, dt)
        elif self.op == Op.SUM:
            gm.weighted_sum(n, [b.gpu_data() for b in bottom], self.coeffs, y, dt)
        else:
            mask = self.mask.mutable_gpu_data()
            k = backend.kernel(KERNELS, "eltwise_max_forward", dt)
            k(n, bottom[0].gpu_data(), bottom[1].gpu_data(), 0, y, mask)
            for i in range(2, len(bottom)):
                k(n, y, bottom[i].gpu_data(), i - 1, y, mask)

    def backward_gpu(self, top, propagate_down, bottom):
        n, dt = top[0].count, self.dtype
        dy = top[0].gpu_diff()
        for i, b in enumerate(bottom):
            if not propagate_down[i]:
                continue
            dx = b.mutable_gpu_diff()
            if self.op == Op.PROD:
                if self.stable_prod_grad:  # dx = dy · Π_{j≠i} bottom_j
                    others = [o.gpu_data() for j, o in enumerate(bottom) if j != i]
                    gm.mul(n, dy, others[0], dx, dt)
                    for o in others[1:]:
                        gm.mul(n, dx, o, dx, dt)
                else:
                    k = backend.elementwise("eltwise_prod_grad", *PROD_GRAD_KERNEL, dt)
                    k(n, dy, top[0].gpu_data(), b.gpu_data(), dx)
            elif self.op == Op.SUM:
                gm.scale(n, self.coeffs[i], dy, dx, dt)
            else:
                backend.kernel(KERNELS, "eltwise_max_backward", dt)(n, dy, self.mask.gpu_data(), i, dx)

    # -- GPU chain: SUM, the in-place ReLU after it and the Split after that (runtime/fusion.py) ----
    def backward_reads(self) -> tuple[str, ...] | None:
        """SUM reads no data; PROD the bottoms and the top; MAX its winner mask (top-sized)."""
        return {Op.PROD: ("bottom", "top"), Op.MAX: ("top",)}.get(self.op, ())

    def backward_reads_data(self, top: bool, i: int) -> bool:
        """PROD reads the bottoms and the top; SUM nothing; MAX a mask of its own."""
        return self.op == Op.PROD

    def fuses_as(self, role, bottom=None) -> bool:
        return super().fuses_as(role, bottom) and self.op == Op.SUM and len(self.coeffs) <= 4

    def chain_forward_relu_gpu(self, bottom, top) -> None:
        """``top = relu(Σ coeff_i·bottom_i)`` in one pass (the ReLU's negative_slope 0)."""
        n, dt = top[0].count, self.dtype
        if n == 0:
            return
        xs, y = [b.gpu_data() for b in bottom], top[0].mutable_gpu_data()
        w = gm.vec_width(n, dt, y, *xs)
        coeffs = [float(c) for c in self.coeffs]
        backend.kernel(KERNELS, f"eltwise_sum_relu_v{w}", dt)(
            n // w, len(xs), *(xs + [xs[0]] * (4 - len(xs))), *(coeffs + [0.0] * (4 - len(coeffs))), y)

    def chain_backward_relu_gpu(self, sources: list[Blob], top, propagate_down, bottom) -> None:
        """Backward of the chain :meth:`chain_forward_relu_gpu` ran: the gradient is ``top``'s diff
        (``sources == [top]``) or the sum of a Split's top diffs (``sources``, at most 4); masked
        by the ReLU (``top`` data > 0) it is written to ``top``'s diff and, times coeff_i, to the
        diff of each bottom ``i`` in ``propagate_down``."""
        n, dt = top[0].count, self.dtype
        if n == 0:
            return
        srcs = [s.gpu_diff() for s in sources]
        # the outputs may share storage with the sources (a gradient memory plan): no zero fill
        t = top[0].mutable_gpu_diff() if sources[0] is top[0] else top[0].overwritten_gpu_diff()
        y = top[0].gpu_data()
        dxs = [b.overwritten_gpu_diff() if propagate_down[i] else t for i, b in enumerate(bottom)]
        prop = sum(1 << i for i in range(len(bottom)) if propagate_down[i])
        w = gm.vec_width(n, dt, t, y, *srcs, *dxs)
        coeffs = [float(c) for c in self.coeffs]
        backend.kernel(KERNELS, f"eltwise_sum_relu_backward_v{w}", dt)(
            n // w, len(srcs), *(srcs + [srcs[0]] * (4 - len(srcs))), y, t, len(bottom), prop,
            *(coeffs + [0.0] * (4 - len(coeffs))), *(dxs + [t] * (4 - len(dxs))))
