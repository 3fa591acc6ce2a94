"""Pooling (MAX, AVE) over 2-D windows with Caffe's output size and window clipping.

bottom (N, C, H, W); top (N, C, PH, PW) with ``PH = ceil((H + 2*pad_h - kernel_h) / stride_h) + 1``
(``floor`` with ``round_mode: FLOOR`` or the PyTorch-to-Caffe forks' ``ceil_mode: false``), minus one
when padding would make the last window start at or beyond ``H + pad_h`` (likewise PW). MAX reads the window part inside the image and may
write a second top: the argmax index ``h*W + w`` within the plane (-1 for a window with no
input, whose value is -FLT_MAX); backward routes each top diff to its argmax. AVE divides the
sum inside the image by the window area clipped to the padded image (Caffe's divisor).
``global_pooling`` pools each whole plane. Bottoms with other than two spatial axes, the per-axis
``*_nd`` fields and STOCHASTIC pooling take the general path of ``layers/pooling_nd.py``.

CPU: loops over the ``kh*kw`` kernel offsets, each a strided slice of the padded batch. MAX copies
the slices into one contiguous (kh*kw, N, C, PH, PW) stack and finds each window's first maximum
with whole-array reductions; backward routes each top diff to that offset's slice (assigned when
windows are disjoint, accumulated when they overlap). GPU: one thread per top element forward;
backward a gather in one pass, no atomics: one thread per bottom position (h, w) for a group of
planes, computing its covering window range once and writing coalesced rows; for equal strides of
2 or 1, blocked kernels (a thread per stride x stride block of pixels, each window loaded once;
AVE with a width of a multiple of 4 writes 4-wide rows: a thread per block row x 4 columns), all
bit-identical to the gather. The MAX argmax kept from forward to backward lives in an internal blob.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.blob import Blob, math_dtype
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import RELU_MASK, Layer, Traits, register_layer
from pycaffe_lite.memcheck import check_fits
from pycaffe_lite.schema import caffe_pb2

from .pooling_nd import PoolingND, pooled_size

KERNELS = Path(__file__).with_suffix(".cu")
# (parameters, body) of the fused ReLU mask: out = dy * (y > 0), in Mtype
RELU_MASK_KERNEL = ("const Dtype* dy, const Dtype* y, Dtype* out",
                    "out[i] = from_m(to_m(dy[i]) * (to_m(y[i]) > 0 ? Mtype(1) : Mtype(0)))")
PP = caffe_pb2.PoolingParameter
LOWEST = -np.finfo(np.float32).max  # Caffe's -FLT_MAX, for float and double alike
_BACKWARD_PLANES = 4  # planes per backward thread: POOL_BACKWARD_PLANES of pooling.cu
# (stride S, windows per axis WD) of the blocked backward kernels in pooling.cu, smallest WD first
BLOCKED_BACKWARD = ((2, 1), (2, 2), (1, 3))
# (S, WD, NW, R) of AVE's 4-wide blocked backward kernels (ave_pool_backward_q_*): NW windows per
# 4 columns, R block rows a thread; the first whose S, WD match and NW >= ceil((kernel_w + 3) / S)
QUAD_BACKWARD: tuple[tuple[int, int, int, int], ...] = ((2, 1, 3, 1), (2, 2, 3, 2), (1, 3, 6, 2))


def _window_slices(i: int, j: int, pooled: tuple[int, int], stride: tuple[int, int]) -> tuple[slice, slice]:
    """Slices of the padded plane that kernel offset (i, j) reads for every top element."""
    return (slice(i, i + stride[0] * (pooled[0] - 1) + 1, stride[0]),
            slice(j, j + stride[1] * (pooled[1] - 1) + 1, stride[1]))


@register_layer("Pooling")
class PoolingLayer(Layer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('top',), fuses=frozenset({RELU_MASK}))
    use_blocked_backward = True  # False: always the generic gather (tests compare the two)
    use_quad_backward = True  # False: AVE's blocked backward never takes the 4-wide kernels
    exact_num_bottom_blobs = 1
    min_top_blobs = 1
    max_top_blobs = 2  # the second (mask) top only for MAX: checked in layer_setup

    nd: PoolingND | None = None  # the general path (not 2-D, *_nd fields, STOCHASTIC), set in layer_setup

    def _ceil_mode(self, p) -> bool:
        """Round the pooled size up: BVLC's round_mode, or the forks' ceil_mode (which must agree)."""
        if p.HasField("ceil_mode"):
            if p.HasField("round_mode") and p.ceil_mode != (p.round_mode == PP.CEIL):
                raise self.error(f"ceil_mode: {str(p.ceil_mode).lower()} contradicts round_mode: "
                                 f"{PP.RoundMode.Name(p.round_mode)}")
            return bool(p.ceil_mode)
        return p.round_mode == PP.CEIL

    def _check_mask_storage(self, ntop: int) -> None:
        if ntop > 1 and self.half_native:
            raise self.error(f"its mask top holds window positions, which {self.dtype} does not store exactly "
                             "(a half type keeps integers up to 2048 or 256): give this layer forward_type: FLOAT")

    def layer_setup(self, bottom, top):
        p = self.layer_param.pooling_param
        self.method = p.pool
        self._argmax = Blob(dtype=np.float32)  # GPU MAX: int32 plane index per top element (raw bits)
        self.ceil_mode = self._ceil_mode(p)
        axes = bottom[0].num_axes - 2
        if axes < 1:
            raise self.error(f"bottom must have (num, channels) and at least one spatial axis, got {bottom[0].shape}")
        self._check_mask_storage(len(top))
        if axes != 2 or self.method == PP.STOCHASTIC or p.kernel_size_nd or p.pad_nd or p.stride_nd:
            self.nd = PoolingND(self, p, axes, self.ceil_mode, len(top))
            return
        if len(top) > 1 and self.method != PP.MAX:
            raise self.error("only MAX pooling has a second (mask) top")
        has_size, has_h, has_w = p.HasField("kernel_size"), p.HasField("kernel_h"), p.HasField("kernel_w")
        self.global_pooling = p.global_pooling
        if self.global_pooling:
            if has_size or has_h or has_w:
                raise self.error("global_pooling takes the kernel from the input: do not set kernel_size/h/w")
        elif has_size == (has_h or has_w):
            raise self.error("give kernel_size, or kernel_h and kernel_w; not both, not neither")
        elif not has_size and not (has_h and has_w):
            raise self.error("kernel_h and kernel_w must be given together")
        for name in ("pad", "stride"):
            if (p.HasField(f"{name}_h") or p.HasField(f"{name}_w")) and not (
                    p.HasField(f"{name}_h") and p.HasField(f"{name}_w") and not p.HasField(name)):
                raise self.error(f"give {name}, or {name}_h and {name}_w; not both")
        self.pad = (p.pad_h, p.pad_w) if p.HasField("pad_h") else (p.pad, p.pad)
        self.stride = (p.stride_h, p.stride_w) if p.HasField("stride_h") else (p.stride, p.stride)
        if min(self.stride) <= 0:
            raise self.error(f"stride must be positive, got {self.stride[0]}x{self.stride[1]}")
        if self.global_pooling:
            if self.pad != (0, 0) or self.stride != (1, 1):
                raise self.error("global_pooling requires pad 0 and stride 1")
            self.kernel = (0, 0)  # set from the bottom in reshape
            return
        self.kernel = (p.kernel_size, p.kernel_size) if has_size else (p.kernel_h, p.kernel_w)
        if min(self.kernel) <= 0:
            raise self.error(f"kernel size must be positive, got {self.kernel[0]}x{self.kernel[1]}")
        if self.pad[0] >= self.kernel[0] or self.pad[1] >= self.kernel[1]:
            raise self.error(f"pad {self.pad[0]}x{self.pad[1]} must be smaller than the kernel "
                             f"{self.kernel[0]}x{self.kernel[1]}")

    def reshape(self, bottom, top):
        if self.nd is not None:
            return self.nd.reshape(bottom, top)
        if bottom[0].num_axes != 4:
            raise self.error(f"bottom must have 4 axes (num, channels, height, width), got {bottom[0].shape}")
        n, c, h, w = bottom[0].shape
        self.in_hw = (h, w)
        if self.global_pooling:
            self.kernel = (h, w)
        ceil_mode = self.ceil_mode
        any_pad = self.pad != (0, 0)
        self.pooled = tuple(pooled_size(s, k, p, st, ceil_mode, any_pad)
                            for s, k, p, st in zip(self.in_hw, self.kernel, self.pad, self.stride))
        if min(self.pooled) <= 0:
            raise self.error(f"kernel {self.kernel[0]}x{self.kernel[1]} is larger than the input {h}x{w} "
                             f"padded by {self.pad[0]}x{self.pad[1]}: the output would be empty")
        (bh, bw), (ah, aw) = self.pad, self._pad_after()
        scratch, what = n * c * (h + bh + ah) * (w + bw + aw), "the padded input"
        if self.method == PP.MAX and common.mode() is common.Mode.CPU:  # forward_cpu's window stack
            scratch += self.kernel[0] * self.kernel[1] * n * c * self.pooled[0] * self.pooled[1]
            what += " and the stack of its kernel windows"
        check_fits(self.where, f"kernel {self.kernel[0]}x{self.kernel[1]}, stride "
                   f"{self.stride[0]}x{self.stride[1]} on a {h}x{w} input: {what}", scratch, np.dtype(self.dtype).itemsize)
        for t in top:
            t.reshape((n, c) + self.pooled)

    # -- CPU --------------------------------------------------------------------------------
    def _pad_after(self) -> tuple[int, int]:
        """Padding after the image so that every window, including clipped last ones, fits."""
        return tuple(max(0, (p - 1) * s + k - b - n)
                     for p, s, k, b, n in zip(self.pooled, self.stride, self.kernel, self.pad, self.in_hw))

    def _padded(self, x: np.ndarray, value: float) -> np.ndarray:
        (bh, bw), (ah, aw) = self.pad, self._pad_after()
        if (bh, bw, ah, aw) == (0, 0, 0, 0):
            return x
        return np.pad(x, ((0, 0), (0, 0), (bh, ah), (bw, aw)), constant_values=value)

    def _offsets(self):
        for i in range(self.kernel[0]):
            for j in range(self.kernel[1]):
                yield i, j, _window_slices(i, j, self.pooled, self.stride)

    def _ave_divisor(self) -> np.ndarray:
        """(PH, PW) window areas clipped to the padded image (1 for windows holding no input)."""
        sizes = []
        for p, s, k, pad, n in zip(self.pooled, self.stride, self.kernel, self.pad, self.in_hw):
            start = np.arange(p) * s - pad
            sizes.append(np.minimum(start + k, n + pad) - start)
        area = sizes[0][:, None] * sizes[1][None, :]
        return np.where(area > 0, area, 1).astype(self.dtype)

    def _max_codes(self, x: np.ndarray, top_data: np.ndarray) -> np.ndarray:
        """MAX forward into ``top_data``; returns the winner codes (see :meth:`forward_cpu`)."""
        kk = self.kernel[0] * self.kernel[1]
        xp = self._padded(x, -np.inf)
        stack = np.empty((kk,) + top_data.shape, dtype=self.dtype)  # window offset k = i*kw + j
        for i, j, (sh, sw) in self._offsets():
            stack[i * self.kernel[1] + j] = xp[:, :, sh, sw]
        best = np.fmax.reduce(stack, axis=0)  # NaN ignored, as by Caffe's ">" test
        valid = best > LOWEST  # a window whose inputs never beat -FLT_MAX keeps it and mask -1
        code_type = np.uint8 if kk < 256 else np.uint16 if kk < 65536 else np.uint32
        weights = np.arange(kk, 0, -1, dtype=code_type).reshape((kk,) + (1,) * best.ndim)
        codes = np.multiply(stack == best, weights, dtype=code_type).max(axis=0)  # kk - first maximum
        codes *= valid
        np.fmax(best, LOWEST, out=top_data)
        zeros = np.flatnonzero(top_data == 0)
        if zeros.size:  # a -0.0 ties +0.0: Caffe keeps the first one's sign
            flat = stack.reshape(kk, -1)
            top_data.reshape(-1)[zeros] = flat[kk - codes.reshape(-1)[zeros].astype(np.intp), zeros]
        return codes

    def _mask_from_codes(self, codes: np.ndarray) -> np.ndarray:
        """Caffe's mask (plane index ``h*W + w`` of each window's first maximum, -1 for none)."""
        kk = self.kernel[0] * self.kernel[1]
        k = kk - codes.astype(np.int64)
        hstart = np.arange(self.pooled[0]) * self.stride[0] - self.pad[0]
        wstart = np.arange(self.pooled[1]) * self.stride[1] - self.pad[1]
        mask = (hstart[:, None] + k // self.kernel[1]) * self.in_hw[1] + (wstart[None, :] + k % self.kernel[1])
        mask[codes == 0] = -1
        return mask

    def forward_cpu(self, bottom, top):
        """MAX keeps per top element a winner code ``kh*kw - k`` (0: none) for the window offset
        k = i*kw + j of its first maximum; AVE sums the offsets' strided slices."""
        if self.nd is not None:
            return self.nd.forward_cpu(bottom, top)
        x = bottom[0].cpu_data()
        if self.method == PP.MAX:
            self._codes = self._max_codes(x, top[0].mutable_cpu_data())
            if len(top) > 1:
                top[1].mutable_cpu_data()[...] = self._mask_from_codes(self._codes)
        else:
            xp = self._padded(x, 0.0)
            total = np.zeros(top[0].shape, dtype=self.dtype)
            for _, _, (sh, sw) in self._offsets():
                total += xp[:, :, sh, sw]
            top[0].mutable_cpu_data()[...] = total / self._ave_divisor()

    def _exact_tiling(self) -> bool:
        """Windows that tile the bottom exactly: each bottom pixel in exactly one window."""
        return (self.pad == (0, 0) and self.kernel == self.stride
                and all(p * s == n for p, s, n in zip(self.pooled, self.stride, self.in_hw)))

    def _route_max_diff(self, codes: np.ndarray, dy: np.ndarray) -> np.ndarray:
        """(kh*kw, N, C, PH, PW): entry k holds ``dy`` where offset k won the window, else +0.0.

        Selected with bit masks, not ``won * dy``: a NaN/inf top diff must not leak into the window's
        other pixels (0 * inf is NaN)."""
        kk = self.kernel[0] * self.kernel[1]
        bits = np.dtype(f"i{self.dtype.itemsize}")
        won = codes[None] == np.arange(kk, 0, -1, dtype=codes.dtype).reshape((kk,) + (1,) * codes.ndim)
        routed = np.negative(won, dtype=bits)  # all ones where won
        np.bitwise_and(routed, np.ascontiguousarray(dy).view(bits), out=routed)
        return routed.view(self.dtype)

    def backward_cpu(self, top, propagate_down, bottom):
        if self.nd is not None:
            return self.nd.backward_cpu(top, propagate_down, bottom)
        if not propagate_down[0]:
            return
        n, c, h, w = bottom[0].shape
        dy = top[0].cpu_diff()
        if self.method == PP.MAX:
            codes = getattr(self, "_codes", None)
            if codes is None or codes.shape != dy.shape:
                raise self.error("MAX pooling backward_cpu needs a forward_cpu on the same shapes first")
            routed = self._route_max_diff(codes, dy)  # (kh*kw, N, C, PH, PW)
            kh, kw = self.kernel
            overlap = kh > self.stride[0] or kw > self.stride[1]
            (ph, pw), (ah, aw) = self.pad, self._pad_after()
            direct = self._exact_tiling()  # every bottom pixel is in exactly one window: no zero fill
            dxp = bottom[0].mutable_cpu_diff() if direct else np.zeros((n, c, ph + h + ah, pw + w + aw), self.dtype)
            zero = self.dtype.type(0)
            for i, j, (sh, sw) in self._offsets():
                if overlap:
                    dxp[:, :, sh, sw] += routed[i * kw + j]
                else:  # disjoint windows: each pixel written once, as Caffe's 0.0 + dy (so never -0.0)
                    np.add(routed[i * kw + j], zero, out=dxp[:, :, sh, sw])
            if not direct:
                bottom[0].mutable_cpu_diff()[...] = dxp[:, :, ph:ph + h, pw:pw + w]
        else:
            g = dy / self._ave_divisor()
            (ph, pw), (ah, aw) = self.pad, self._pad_after()
            dxp = np.zeros((n, c, ph + h + ah, pw + w + aw), dtype=self.dtype)
            for _, _, (sh, sw) in self._offsets():
                dxp[:, :, sh, sw] += g  # one offset never touches a pixel twice
            bottom[0].mutable_cpu_diff()[...] = dxp[:, :, ph:ph + h, pw:pw + w]

    # -- GPU --------------------------------------------------------------------------------
    def _k(self, name: str) -> backend.Kernel:
        return backend.kernel(KERNELS, name, self.dtype)

    def _geometry(self) -> tuple[int, ...]:
        return (*self.in_hw, *self.pooled, *self.kernel, *self.stride, *self.pad)

    def forward_gpu(self, bottom, top):
        if self.nd is not None:
            return self.nd.forward_gpu(bottom, top) if self.nd.gpu() else super().forward_gpu(bottom, top)
        count = top[0].count
        if self.method == PP.MAX:
            self._argmax.reshape(top[0].shape)
            mask = self._argmax.mutable_gpu_data()
            self._k("max_pool_forward")(count, bottom[0].gpu_data(), *self._geometry(), top[0].mutable_gpu_data(), mask)
            self._argmax_shape = top[0].shape
            if len(top) > 1:
                self._k("pool_mask_to_dtype")(count, mask, top[1].mutable_gpu_data())
        else:
            self._k("ave_pool_forward")(count, bottom[0].gpu_data(), *self._geometry(), top[0].mutable_gpu_data())

    def _blocked_backward(self) -> tuple[int, int] | None:
        """(S, WD) of the blocked backward kernel for this geometry, or None (use the gather)."""
        (kh, kw), (sh, sw) = self.kernel, self.stride
        for s, wd in BLOCKED_BACKWARD:
            if sh == sw == s and -(-kh // s) <= wd and -(-kw // s) <= wd:
                return s, wd
        return None

    def _quad_backward(self, blocked: tuple[int, int], dx: int) -> tuple[int, int, int, int] | None:
        """(S, WD, NW, R) of AVE's 4-wide blocked backward for this geometry and bottom diff
        pointer ``dx`` (width a multiple of 4, ``dx`` aligned to 4 elements), or None."""
        if not self.use_quad_backward or gm.vec_width(self.in_hw[1], self.dtype, dx) != 4:
            return None
        s, wd = blocked
        for q in QUAD_BACKWARD:
            if q[:2] == (s, wd) and q[2] >= -(-(self.kernel[1] + 3) // s):
                return q
        return None

    def backward_gpu(self, top, propagate_down, bottom):
        if self.nd is not None:
            if self.nd.gpu():
                return self.nd.backward_gpu(top, propagate_down, bottom)
            return super().backward_gpu(top, propagate_down, bottom)
        if not propagate_down[0] or bottom[0].count == 0:
            return
        self._backward_2d(top[0].gpu_diff(), top, bottom)

    def backward_reads(self) -> tuple[str, ...] | None:
        """MAX reads its argmax (top-sized); AVE and STOCHASTIC only the top diffs."""
        return ("top",) if self.method == PP.MAX else ()

    def fuses_as(self, role, bottom=None) -> bool:
        return super().fuses_as(role, bottom) and self.method == PP.MAX and self.nd is None and len(
            self.layer_param.top) == 1

    def backward_relu_gpu(self, top: list[Blob], bottom: list[Blob]) -> None:
        """Backward of a ReLU (negative_slope 0, in place on ``bottom[0]``) and this MAX pooling
        as one: each top gradient masked by ``top > 0`` (the pooled value is the ReLU output it
        chose, so this is the ReLU's mask at that input), then the pooling's backward. Caffe's
        result, but for the sign of zero gradients where several windows choose one input."""
        if bottom[0].count == 0:
            return
        n, dt = top[0].count, self.dtype
        (masked,) = backend.workspace(n * dt.itemsize)
        backend.elementwise("pool_relu_mask", *RELU_MASK_KERNEL, dt)(
            n, top[0].gpu_diff(), top[0].gpu_data(), masked)
        self._backward_2d(masked, top, bottom)

    def _backward_2d(self, top_diff: int, top: list[Blob], bottom: list[Blob]) -> None:
        """The 2-D backward from the top gradient at device pointer ``top_diff``."""
        n, c, h, w = bottom[0].shape
        planes = n * c
        is_max = self.method == PP.MAX
        if is_max and getattr(self, "_argmax_shape", None) != top[0].shape:
            raise self.error("MAX pooling backward_gpu needs a forward_gpu on the same shapes first")
        mask = (self._argmax.gpu_data(),) if is_max else ()
        kind = "max" if is_max else "ave"
        blocked = self._blocked_backward() if self.use_blocked_backward else None
        if blocked is not None:
            s, wd = blocked
            blocks = (-(-(h + self.pad[0]) // s), -(-(w + self.pad[1]) // s))
            # AVE: RN(1 / kernel area), for pool_ave_div's correctly rounded quotients
            md = math_dtype(self.dtype)  # (half storage: the quotient is taken in its math type, float)
            inv = () if is_max else (float(md.type(1) / md.type(self.kernel[0] * self.kernel[1])),)
            dx = bottom[0].mutable_gpu_diff()
            quad = None if is_max else self._quad_backward(blocked, dx)
            if quad is not None:
                strips = -(-blocks[0] // quad[3])
                self._k("ave_pool_backward_q_s{}_w{}_n{}_r{}".format(*quad))(
                    planes * strips * (w // 4), top_diff, *self._geometry(), strips, *inv, dx)
                return
            self._k(f"{kind}_pool_backward_s{s}_w{wd}")(planes * blocks[0] * blocks[1], top_diff, *mask,
                                                      *self._geometry(), *blocks, *inv, dx)
        else:
            count = -(-planes // _BACKWARD_PLANES) * h * w
            self._k(f"{kind}_pool_backward")(count, planes, top_diff, *mask, *self._geometry(),
                                            bottom[0].mutable_gpu_diff())
