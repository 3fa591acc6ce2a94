"""Convolution over 2-D images, with padding, stride, dilation and groups (BVLC semantics).

bottom (..., C, H, W) with the channel axis at ``axis`` (default 1; leading axes are the batch);
weight (num_output, C/group, kh, kw); bias (num_output,); top (..., num_output, Ho, Wo) with
``Ho = (H + 2*pad_h - (dilation_h*(kh-1)+1)) // stride_h + 1`` (likewise Wo). Several bottoms
may be given: each is convolved with the same weights into the top of the same index.

The whole minibatch is done at once. CPU: :mod:`pycaffe_lite.conv.cpu` (im2col and one GEMM per
group over the whole batch, or per-image GEMMs for large output planes). GPU: one of the registered
engines (:mod:`pycaffe_lite.conv.registry`) per pass, autotuned once per shape
(:mod:`pycaffe_lite.conv.engines`). ``engine`` DEFAULT, CAFFE and CUDNN let the autotune pick among
all engines; pycaffe-lite's additions to the enum (``GEMM`` for Caffe's im2col + cuBLAS,
``IMPLICIT_GEMM``, ``WINOGRAD``, ...) force one. A forced engine that cannot run the layer's geometry
is an error naming the layer, the engine, its requirement and the geometry (checked before any GPU
work).
:class:`ConvolutionBase` holds what Deconvolution shares (set-up, shapes, engine choice).

Other numbers of spatial axes (1-D, 3-D, ...), and 2-D with ``force_nd_im2col: true``, take the N-D
path: BVLC's per-axis ``kernel_size``/``pad``/``stride``/``dilation`` (one value broadcast), weight
``(num_output, C/group, *K)``, CPU :mod:`pycaffe_lite.conv.cpu_nd`, GPU :mod:`pycaffe_lite.conv.nd`
(im2col_nd + cuBLAS, 1 to 3 axes; more run on host copies). See ``docs/convolution_pooling.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pycaffe_lite import common, fillers
from pycaffe_lite.blob import Blob
from pycaffe_lite.conv import cpu as cpu_conv
from pycaffe_lite.conv import cpu_nd as cpu_conv_nd
from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.conv import im2col_nd
from pycaffe_lite.conv import nd as conv_nd
from pycaffe_lite.conv.geometry import Pair, geometry_nd, out_shape, out_shape_nd
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import CONVOLUTION, Layer, Traits, create_layer, register_layer
from pycaffe_lite.memcheck import check_fits
from pycaffe_lite.schema import caffe_pb2

__all__ = ["ConvGeometry", "ConvolutionBase", "ConvolutionLayer", "NDGeometry", "conv_geometry",
           "conv_geometry_nd"]


@dataclass(frozen=True)
class ConvGeometry:
    """Kernel, pad, stride and dilation of a 2-D convolution, each an ``(h, w)`` pair."""

    kernel: Pair
    pad: Pair
    stride: Pair
    dilation: Pair


def _pair(layer: Layer, p: Any, repeated: str, hw: str | None, default: int) -> Pair:
    """Read the repeated field ``repeated`` (0, 1 or 2 values) or the ``<hw>_h``/``<hw>_w`` pair."""
    values = list(getattr(p, repeated))
    has_h, has_w = (p.HasField(f"{hw}_h"), p.HasField(f"{hw}_w")) if hw else (False, False)
    if has_h or has_w:
        if not (has_h and has_w):
            raise layer.error(f"{hw}_h and {hw}_w must be given together")
        if values:
            raise layer.error(f"give either {repeated} or {hw}_h/{hw}_w, not both")
        return getattr(p, f"{hw}_h"), getattr(p, f"{hw}_w")
    if not values:
        return default, default
    if len(values) == 1:
        return values[0], values[0]
    if len(values) == 2:
        return values[0], values[1]
    raise layer.error(f"{repeated} has {len(values)} values; 2-D convolution takes 1 or 2")


def conv_geometry(layer: Layer, p: Any) -> ConvGeometry:
    """Parse and check the geometry of a ConvolutionParameter (shared with Deconvolution)."""
    if not p.kernel_size and not (p.HasField("kernel_h") or p.HasField("kernel_w")):
        raise layer.error("convolution_param needs kernel_size or kernel_h and kernel_w")
    geo = ConvGeometry(
        kernel=_pair(layer, p, "kernel_size", "kernel", 0),
        pad=_pair(layer, p, "pad", "pad", 0),
        stride=_pair(layer, p, "stride", "stride", 1),
        dilation=_pair(layer, p, "dilation", None, 1),
    )
    for what, values in (("kernel size", geo.kernel), ("stride", geo.stride), ("dilation", geo.dilation)):
        if min(values) <= 0:
            raise layer.error(f"{what} must be positive, got {values[0]}x{values[1]}")
    return geo


@dataclass(frozen=True)
class NDGeometry:
    """Kernel, pad, stride and dilation of an N-D convolution, one entry per spatial axis."""

    kernel: tuple[int, ...]
    pad: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]


def conv_geometry_nd(layer: Layer, p: Any, axes: int) -> NDGeometry:
    """Parse and check the geometry of a ConvolutionParameter for ``axes`` spatial axes (BVLC's rules,
    :func:`pycaffe_lite.conv.geometry.geometry_nd`)."""
    return NDGeometry(*geometry_nd(p, axes, layer.error))


class ConvolutionBase(Layer):
    """Shared by Convolution and Deconvolution (Caffe's BaseConvolutionLayer): parameters, group
    checks, the weight/bias blobs, top shapes, and the GPU engine choice for the convolution the
    engines run (:meth:`engine_problem_dims`). Subclasses give the weight shape, the output size
    and their math."""
    traits = Traits(half=True, half_kernels=True, graph_safe=True, pure_forward=True)

    min_bottom_blobs = 1
    min_top_blobs = 1
    equal_num_bottom_top_blobs = True
    engines_add_bias = True  # the engines' forward/weight passes handle this layer's bias
    # the engine passes (conv.engines.PASSES) this layer's forward and backward run
    forward_passes: tuple[str, ...] = ("forward",)
    backward_passes: tuple[str, ...] = ("backward_weight", "backward_data")

    def backward_reads_data(self, top: bool, i: int) -> bool:
        return not top  # the weight gradient reads the bottom; nothing reads the top

    def weight_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def output_hw(self) -> Pair:
        """Top (H, W) for the bottom's ``in_hw``; raise an error naming the layer when not positive."""
        raise NotImplementedError

    def engine_problem_dims(self) -> tuple[int, Pair, int]:
        """(input channels, input (H, W), output channels) of the convolution the engines run."""
        raise NotImplementedError

    nd = False  # True: the N-D path (not 2 spatial axes, or force_nd_im2col), set in layer_setup

    def layer_setup(self, bottom, top):
        p = self.layer_param.convolution_param
        self.axis = bottom[0].canonical_axis(p.axis)
        axes = bottom[0].num_axes - self.axis - 1
        if axes < 1:
            raise self.error(f"bottom shape {bottom[0].shape} has no spatial axis after channel axis {self.axis}")
        self.nd = axes != 2 or p.force_nd_im2col
        if self.nd:
            self.geo_nd = conv_geometry_nd(self, p, axes)
            engine = p.Engine.Name(p.engine)
            if engine not in ("DEFAULT", "CAFFE", "CUDNN"):
                why = "force_nd_im2col" if axes == 2 else f"{axes} spatial axes"
                raise self.error(f"engine {engine} runs 2-D convolutions only; this layer takes the N-D "
                                 f"im2col path ({why}): use DEFAULT, CAFFE or CUDNN")
        else:
            g = self.geo = conv_geometry(self, p)
            self.geo_nd = NDGeometry(g.kernel, g.pad, g.stride, g.dilation)
        self.num_spatial_axes = axes
        if axes > im2col_nd.MAX_AXES:
            if self.half_native:  # the host fallback below is numpy code, not for half storage
                raise self.error(f"{axes} spatial axes exceed the N-D GPU kernels' {im2col_nd.MAX_AXES}, and "
                                 f"their host fallback has no {self.dtype} path: run this layer in float32")
            self.traits = self.traits.but(graph_safe=False)  # its GPU passes run the CPU code on host copies
        self.bias_term = p.bias_term
        self.channels = bottom[0].shape[self.axis]
        self.num_output, self.group = self.output_and_group(p)
        if self.group <= 0:
            raise self.error(f"group must be positive, got {self.group}")
        if self.channels % self.group:
            raise self.error(f"{self.channels} input channels are not divisible by group {self.group}")
        if self.num_output % self.group:
            raise self.error(f"num_output {self.num_output} is not divisible by group {self.group}")
        w_shape = self.weight_shape()
        shapes = [w_shape] + ([(self.num_output,)] if self.bias_term else [])
        if self.blobs:
            if len(self.blobs) != len(shapes):
                raise self.error(f"has {len(self.blobs)} param blobs, expected {len(shapes)} "
                                 f"(bias_term: {self.bias_term})")
            self.check_param_shapes(shapes)
        else:
            self.blobs = [self.make_param_blob(w_shape)]
            fillers.fill(self.blobs[0], p.weight_filler)
            if self.bias_term:
                self.blobs.append(self.make_param_blob((self.num_output,)))
                fillers.fill(self.blobs[1], p.bias_filler)
        self.problem: ConvProblem | None = None
        self._choice: conv_engines.Choice | None = None
        self._choice_tf32 = False

    def output_and_group(self, p: Any) -> tuple[int, int]:
        """(num_output, group) from the parameters; :attr:`channels` is known (the forks' depthwise
        types derive them from it)."""
        if not p.HasField("num_output") or p.num_output == 0:
            raise self.error("convolution_param.num_output is required and must be positive")
        return p.num_output, p.group

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != shape:
                raise self.error(f"all bottoms must have one shape: bottom 0 is {shape}, bottom {i} is {b.shape}")
        if shape[self.axis] != self.channels:
            raise self.error(f"bottom has {shape[self.axis]} channels (shape {shape}), weights expect {self.channels}")
        self.num = bottom[0].count_range(0, self.axis)
        if self.nd:
            return self._reshape_nd(bottom, top)
        self.in_hw = shape[self.axis + 1:]
        if len(self.in_hw) != 2:
            raise self.error(f"bottom shape {shape} must have 2 spatial axes after channel axis {self.axis}")
        self.out_hw = self.output_hw()
        self.bottom_shape = (self.num, self.channels) + self.in_hw  # the (N, C, H, W) views of the math
        self.top_shape = (self.num, self.num_output) + self.out_hw
        for t in top:
            t.reshape(shape[:self.axis] + (self.num_output,) + self.out_hw)
        self._reshape_problem()

    # -- N-D path (pycaffe_lite.conv.cpu_nd, pycaffe_lite.conv.nd) ----------------------------
    def output_nd(self) -> tuple[int, ...]:
        """Top spatial sizes for the bottom's ``in_nd`` (N-D path); an error naming the layer when empty."""
        raise NotImplementedError

    def engine_problem_nd(self) -> conv_nd.NDProblem:
        """The convolution the N-D GPU code runs (Deconvolution's maps its top to its bottom)."""
        raise NotImplementedError

    def _reshape_nd(self, bottom, top) -> None:
        shape = bottom[0].shape
        if len(shape) - self.axis - 1 != self.num_spatial_axes:
            raise self.error(f"bottom shape {shape} must keep {self.num_spatial_axes} spatial axes after "
                             f"channel axis {self.axis} (as at set-up)")
        self.in_nd = tuple(shape[self.axis + 1:])
        self.out_nd = self.output_nd()
        self.bottom_shape = (self.num, self.channels) + self.in_nd
        self.top_shape = (self.num, self.num_output) + self.out_nd
        for t in top:
            t.reshape(shape[:self.axis] + (self.num_output,) + self.out_nd)
        g = self.geo_nd
        self.problem_nd = self.engine_problem_nd()
        if common.mode() is common.Mode.CPU:  # cpu_conv_nd's buffers for one chunk of images
            prob = self.problem_nd
            self.host_workspace = cpu_conv_nd.chunk_buffers(
                self.num, self.cpu_passes(), prob.channels, prob.in_shape, prob.num_output, self.group, g.kernel,
                g.pad, g.stride, g.dilation, self.dtype.itemsize)
            self._check_workspace(prob.in_shape, prob.out_shape)

    def gpu_nd(self) -> bool:
        """The N-D GPU kernels take this layer's axes (else its GPU passes run the CPU code on host copies)."""
        return self.num_spatial_axes <= im2col_nd.MAX_AXES

    def _param_diffs(self, gpu: bool) -> tuple:
        """(weight diff, bias diff) to accumulate into, each None when not propagated: device
        pointers with ``gpu``, else writable arrays of the blobs' shapes."""
        get = (lambda b: b.mutable_gpu_diff()) if gpu else (lambda b: b.mutable_cpu_diff())
        dw = get(self.blobs[0]) if self.param_propagate_down[0] else None
        db = get(self.blobs[1]) if self.bias_term and self.param_propagate_down[1] else None
        return dw, db

    # -- GPU engine choice ------------------------------------------------------------------
    def _reshape_problem(self) -> None:
        """Rebuild :attr:`problem`, the convolution the GPU engines run, when the batch or image
        size changed (nothing else can change after layer_setup); the engine choice goes with it."""
        c, hw, m = self.engine_problem_dims()
        have = self.problem
        if have is None or have.num != self.num or (have.height, have.width) != hw:
            g = self.geo
            if common.mode() is common.Mode.CPU:  # cpu_conv's scratch for one chunk of images
                self.host_workspace = cpu_conv.chunk_buffers(
                    self.num, self.cpu_passes(), c, hw, m, self.group, g.kernel, g.pad, g.stride, g.dilation,
                    self.dtype.itemsize)
                self._check_workspace(hw, out_shape(hw[0], hw[1], g.kernel, g.pad, g.stride, g.dilation))
            self.problem = ConvProblem(self.num, c, hw[0], hw[1], m, self.group, g.kernel, g.pad, g.stride,
                                       g.dilation, self.dtype.str)
            self._choice = None

    # host memory the CPU passes allocate for one chunk of images, by buffer (conv.cpu.chunk_buffers);
    # set by reshape in CPU mode
    host_workspace: dict[str, int] = {}

    @property
    def host_workspace_bytes(self) -> int:
        """The total of :attr:`host_workspace`."""
        return sum(self.host_workspace.values())

    def cpu_passes(self) -> tuple[str, ...]:
        """The CPU convolution passes (:data:`pycaffe_lite.conv.cpu.PASSES`) this layer runs: its
        forward's, and in the TRAIN phase its backward's too."""
        forward = ("forward",)
        if self.layer_param.phase != caffe_pb2.TRAIN:
            return forward
        return forward + ("weight", "data")

    def _check_workspace(self, image: tuple[int, ...], out: tuple[int, ...]) -> None:
        """Refuse (before allocating) when one chunk's CPU scratch (:attr:`host_workspace_bytes`) cannot fit."""
        check_fits("", f"the CPU convolution buffers of one chunk of images (padded input, columns; kernel "
                       f"{'x'.join(map(str, self.geo_nd.kernel))}, {'x'.join(map(str, image))} inputs, "
                       f"{'x'.join(map(str, out))} outputs)",
                   self.host_workspace_bytes // self.dtype.itemsize, self.dtype.itemsize)

    def engines(self, passes: tuple[str, ...] = conv_engines.PASSES,
                operands: Callable[[], dict[str, int]] | None = None) -> tuple[ConvProblem, conv_engines.Choice]:
        """:attr:`problem` and the engine per pass for it: autotuned once per shape and pass (cached
        across layers; only ``passes``, the engine passes this layer's call runs, so a net that never
        runs backward tunes no backward pass), narrowed by the ``engine`` field (DEFAULT/CAFFE/CUDNN:
        any engine; pycaffe-lite's values force theirs). ``operands`` (called only when choosing):
        the device pointers the autotune may time on (:meth:`autotune_operands`), else it times on
        workspace buffers. Raises an error naming the layer and its geometry when the forced engine
        cannot run it (checked before any GPU work)."""
        prob = self.problem
        assert prob is not None, "reshape() builds the problem before any engine is chosen"
        if (self._choice is None or self._choice_tf32 != common.tf32_allowed()  # TF32 changes the engines
                or not self._choice.has(passes)):
            self._choice_tf32 = common.tf32_allowed()
            g = self.geo
            p = self.layer_param.convolution_param
            engine = p.Engine.Name(p.engine)
            candidates = self.engine_candidates(engine, prob)
            if not any(conv_engines.ENGINES[n].supports(prob) for n in candidates):
                raise self.error(
                    f"engine {engine} needs {conv_engines.ENGINES[candidates[0]].requirement}; this layer has "
                    f"kernel {g.kernel}, stride {g.stride}, dilation {g.dilation}, group {self.group}, pad {g.pad}, "
                    f"batch {prob.num} (bottom {self.bottom_shape}, top {self.top_shape})")
            self._choice = conv_engines.choose(prob, self.bias_term and self.engines_add_bias, candidates, passes,
                                               operands=operands() if operands else None)
        return prob, self._choice

    def autotune_operands(self, bottom: Sequence[Blob], top: Sequence[Blob],
                          down: bool | None = None) -> dict[str, int]:
        """The engine operands (:func:`conv.engines.choose`'s ``operands``) of the first bottom/top
        pair that the autotune may time on, for this layer's forward (``down`` None) or its backward
        (``down``: whether that bottom's diff is written). Outputs are named only where the call
        that tunes assigns them right after, and never ``dw``/``db`` (accumulated)."""
        raise NotImplementedError

    def engine_candidates(self, engine: str, prob: ConvProblem) -> tuple[str, ...]:
        """The engines the autotune may pick for the ``engine`` field's value."""
        candidates = conv_engines.field_candidates(engine, self.name)
        if not candidates:
            raise self.error(f"engine {engine}: no convolution engine of this build registers it")
        return candidates

    def engine_choice(self) -> conv_engines.Choice:
        """The engine per pass for the current shape (see :meth:`engines`)."""
        return self.engines()[1]

    def _bias_backward_gpu(self, dy: int, db: int) -> None:
        """``db += dy`` summed over images and pixels of the top."""
        gm.channel_sum(self.num, self.num_output, self.out_hw[0] * self.out_hw[1], dy, db, self.dtype, beta=1.0)

    def backward_gpu(self, top, propagate_down, bottom):
        if self.nd:
            if not self.gpu_nd():
                return super().backward_gpu(top, propagate_down, bottom)
            w = self.blobs[0].gpu_data()
            dw, db = self._param_diffs(gpu=True)
            for i, (b, t) in enumerate(zip(bottom, top)):
                self.backward_gpu_nd(w, dw, db, t.gpu_diff(), b, propagate_down[i])
            return
        prob, choice = self.engines(self.backward_passes,
                                    lambda: self.autotune_operands(bottom, top, propagate_down[0]))
        w = self.blobs[0].gpu_data()
        dw, db = self._param_diffs(gpu=True)
        for i, (b, t) in enumerate(zip(bottom, top)):
            self.backward_gpu_pair(prob, choice, w, dw, db, t.gpu_diff(), b, propagate_down[i])

    def sums_bias_in_relu_backward(self) -> bool:
        """Whether :meth:`backward_gpu_relu` applies: a 2-D convolution whose bias learns."""
        return not self.nd and self.bias_term and self.param_propagate_down[1]

    def backward_gpu_relu(self, top, propagate_down, bottom) -> None:
        """Backward of this layer and the ReLU (negative_slope 0) in place on its top after it
        (runtime/fusion.py's ConvReLU, where :meth:`sums_bias_in_relu_backward`): the ReLU's pass
        over the top diff also sums it into the bias gradient, then the weight and data gradients
        as :meth:`backward_gpu` (one bottom/top pair)."""
        t, n, c = top[0], self.num, self.num_output
        dy, mask = t.mutable_gpu_diff(), t.gpu_data()
        dw, db = self._param_diffs(gpu=True)
        gm.relu_backward_channel_sum(n, c, t.count // max(n * c, 1), dy, mask, dy, db, self.dtype)
        prob, choice = self.engines(self.backward_passes,
                                    lambda: self.autotune_operands(bottom, top, propagate_down[0]))
        self.backward_gpu_pair(prob, choice, self.blobs[0].gpu_data(), dw, None, dy, bottom[0], propagate_down[0])

    def backward_gpu_pair(self, prob: ConvProblem, choice: conv_engines.Choice, w: int, dw: int | None,
                          db: int | None, dy: int, b: Blob, down: bool) -> None:
        """The GPU gradients of one bottom/top pair: accumulate into ``dw``/``db`` (None when not
        propagated) from the top diff ``dy``; write ``b``'s diff when ``down``."""
        raise NotImplementedError

    def backward_gpu_nd(self, w: int, dw: int | None, db: int | None, dy: int, b: Blob, down: bool) -> None:
        """:meth:`backward_gpu_pair` of the N-D path."""
        raise NotImplementedError


@register_layer("Convolution")
class ConvolutionLayer(ConvolutionBase):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, pure_forward=True, fuses=frozenset({CONVOLUTION}))

    def weight_shape(self) -> tuple[int, ...]:
        return (self.num_output, self.channels // self.group) + self.geo_nd.kernel

    def output_hw(self) -> Pair:
        g = self.geo
        out_hw = out_shape(self.in_hw[0], self.in_hw[1], g.kernel, g.pad, g.stride, g.dilation)
        if min(out_hw) <= 0:
            raise self.error(
                f"kernel {g.kernel[0]}x{g.kernel[1]} (dilation {g.dilation[0]}x{g.dilation[1]}) is larger "
                f"than the input {self.in_hw[0]}x{self.in_hw[1]} padded by {g.pad[0]}x{g.pad[1]}"
            )
        return out_hw

    def engine_problem_dims(self) -> tuple[int, Pair, int]:
        return self.channels, self.in_hw, self.num_output

    def fuses_as(self, role, bottom=None) -> bool:
        return super().fuses_as(role, bottom) and self.layer_param.convolution_param.axis == 1

    def folded_copy(self, bottom, top) -> Layer:
        """This convolution with a bias term and constant fillers, set up on ``bottom``/``top``: the
        executor's fused Convolution -> BatchNorm -> Scale writes the folded weights into its blobs."""
        lp = caffe_pb2.LayerParameter()
        lp.CopyFrom(self.layer_param)
        lp.name = f"{self.name} (folded BatchNorm)"
        del lp.blobs[:]
        cp = lp.convolution_param
        cp.bias_term = True
        cp.weight_filler.Clear()
        cp.weight_filler.type = "constant"
        cp.bias_filler.Clear()
        cp.bias_filler.type = "constant"
        fused = create_layer(lp, self.dtype)
        fused.setup(bottom, top)
        return fused

    def output_nd(self) -> tuple[int, ...]:
        g = self.geo_nd
        out = out_shape_nd(self.in_nd, g.kernel, g.pad, g.stride, g.dilation)
        if min(out) <= 0:
            raise self.error(f"kernel {g.kernel} (dilation {g.dilation}) is larger than the input {self.in_nd} "
                             f"padded by {g.pad}")
        return out

    def engine_problem_nd(self) -> conv_nd.NDProblem:
        g = self.geo_nd
        return conv_nd.NDProblem(self.num, self.channels, self.in_nd, self.num_output, self.group, g.kernel, g.pad,
                                 g.stride, g.dilation, self.dtype.str)

    def compute_forward_relu(self, bottom, top) -> None:
        """Forward followed by ReLU (negative_slope 0) on the tops, fused into the engines' epilogue on
        the GPU: what this layer and an in-place ReLU on its top leave (the executor's fusion)."""
        self.reshape(bottom, top)
        if common.mode() is common.Mode.GPU:
            self.forward_gpu(bottom, top, relu=True)
        else:
            self.forward_cpu(bottom, top, relu=True)

    # -- CPU (pycaffe_lite.conv.cpu) -------------------------------------------------------
    def forward_cpu(self, bottom, top, relu: bool = False):
        if self.nd:
            return self._forward_cpu_nd(bottom, top, relu)
        g = self.geo
        w = self.blobs[0].cpu_data()
        bias = self.blobs[1].cpu_data() if self.bias_term else None
        for b, t in zip(bottom, top):
            y = t.mutable_cpu_data().reshape(self.top_shape)
            cpu_conv.forward(b.cpu_data().reshape(self.bottom_shape), w, bias, g.kernel, g.pad, g.stride,
                             g.dilation, self.group, y)
            if relu:
                np.maximum(y, 0, out=y)  # ReLULayer's CPU formula at negative_slope 0

    def _forward_cpu_nd(self, bottom, top, relu: bool) -> None:
        g = self.geo_nd
        w = self.blobs[0].cpu_data()
        bias = self.blobs[1].cpu_data() if self.bias_term else None
        for b, t in zip(bottom, top):
            y = t.mutable_cpu_data().reshape(self.top_shape)
            cpu_conv_nd.forward(b.cpu_data().reshape(self.bottom_shape), w, bias, g.kernel, g.pad, g.stride,
                                g.dilation, self.group, y)
            if relu:
                np.maximum(y, 0, out=y)

    def backward_cpu(self, top, propagate_down, bottom):
        g = self.geo_nd if self.nd else self.geo
        conv = cpu_conv_nd if self.nd else cpu_conv
        w = self.blobs[0].cpu_data()
        for i, (b, t) in enumerate(zip(bottom, top)):
            dw, db = self._param_diffs(gpu=False)
            dx = b.mutable_cpu_diff().reshape(self.bottom_shape) if propagate_down[i] else None
            if dw is None and db is None and dx is None:
                continue
            conv.backward(b.cpu_data().reshape(self.bottom_shape), w, t.cpu_diff().reshape(self.top_shape),
                              g.kernel, g.pad, g.stride, g.dilation, self.group, dweight=dw, dbias=db, dx=dx)

    # -- GPU (pycaffe_lite.conv.engines) ------------------------------------------------
    def forward_gpu(self, bottom, top, relu: bool = False):
        if self.nd:
            return self._forward_gpu_nd(bottom, top, relu)
        prob, choice = self.engines(self.forward_passes, lambda: self.autotune_operands(bottom, top))
        w = self.blobs[0].gpu_data()
        bias = self.blobs[1].gpu_data() if self.bias_term else None
        for b, t in zip(bottom, top):
            conv_engines.run(prob, choice, "forward", b.gpu_data(), w, bias, t.mutable_gpu_data(), relu=relu)

    def autotune_operands(self, bottom, top, down=None):
        """Forward: ``x`` (bottom data), ``w``, ``b`` and ``y`` (top data, which the forward then
        assigns). Backward: ``x``, ``w``, ``dy`` (top diff) and, where ``down``, ``dx`` (bottom diff,
        which the data gradient then assigns)."""
        ops = {"x": bottom[0].gpu_data(), "w": self.blobs[0].gpu_data()}
        if down is None:
            if self.bias_term:
                ops["b"] = self.blobs[1].gpu_data()
            ops["y"] = top[0].mutable_gpu_data()
            return ops
        ops["dy"] = top[0].gpu_diff()
        if down:
            ops["dx"] = bottom[0].mutable_gpu_diff()
        return ops

    def _forward_gpu_nd(self, bottom, top, relu: bool) -> None:
        if not self.gpu_nd():  # more spatial axes than the kernels take: the CPU code on host copies
            super().forward_gpu(bottom, top)
            if relu:
                for t in top:
                    np.maximum(t.cpu_data(), 0, out=t.mutable_cpu_data())
            return
        w = self.blobs[0].gpu_data()
        bias = self.blobs[1].gpu_data() if self.bias_term else None
        for b, t in zip(bottom, top):
            conv_nd.forward(self.problem_nd, b.gpu_data(), w, bias, t.mutable_gpu_data(), relu=relu)

    def backward_gpu_nd(self, w, dw, db, dy, b, down):
        conv_nd.backward_weight(self.problem_nd, b.gpu_data(), dy, dw, db)
        if down:
            conv_nd.backward_data(self.problem_nd, w, dy, b.mutable_gpu_diff())

    def backward_gpu_pair(self, prob, choice, w, dw, db, dy, b, down):
        if dw is not None and down:  # both passes: the engines may share what they prepare
            conv_engines.run_backward(prob, choice, b.gpu_data(), w, dy, dw, db, b.mutable_gpu_diff())
            return
        if dw is not None:  # the bias gradient rides along (implicit GEMM folds it into its GEMM)
            conv_engines.run(prob, choice, "backward_weight", b.gpu_data(), dy, dw, db)
        elif db is not None:
            self._bias_backward_gpu(dy, db)
        if down:
            conv_engines.run(prob, choice, "backward_data", w, dy, b.mutable_gpu_diff())
