"""Convolution over 2-D images, with padding, stride, dilation and groups (BVLC semantics).

bottom (..., C, H, W) with the channel axis at ``axis`` (default 1; leading axes are the batch);
weight (num_output, C/group, kh, kw); bias (num_output,); top (..., num_output, Ho, Wo) with
``Ho = (H + 2*pad_h - (dilation_h*(kh-1)+1)) // stride_h + 1`` (likewise Wo). Several bottoms
may be given: each is convolved with the same weights into the top of the same index.

The whole minibatch is done at once. CPU: :mod:`pycaffe_lite.cpu_conv` (im2col and one GEMM per
group over the whole batch, or per-image GEMMs for large output planes). GPU: one of the engines
of :mod:`pycaffe_lite.gpu.conv_engines` per pass (im2col + cuBLAS, implicit GEMM, Winograd),
autotuned once per shape; ``engine: CAFFE`` forces im2col + cuBLAS, ``IMPLICIT_GEMM`` and
``WINOGRAD`` (pycaffe-lite's additions to the enum) force those, DEFAULT and CUDNN pick the fastest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pycaffe_lite import cpu_conv, fillers
from pycaffe_lite.gpu import backend, conv_engines, winograd
from pycaffe_lite.gpu.conv_engines import COL_BUFFER_BYTES
from pycaffe_lite.gpu.conv_problem import ConvProblem
from pycaffe_lite.im2col import Pair, out_shape
from pycaffe_lite.layer import Layer, register_layer

__all__ = ["COL_BUFFER_BYTES", "ConvGeometry", "ConvolutionBase", "ConvolutionLayer", "conv_geometry"]


@dataclass(frozen=True)
class ConvGeometry:
    """Kernel, pad, stride and dilation of a 2-D convolution, each an ``(h, w)`` pair."""

    kernel: Pair
    pad: Pair
    stride: Pair
    dilation: Pair

    @property
    def is_1x1(self) -> bool:
        """A pointwise convolution whose columns are the input itself."""
        return self.kernel == (1, 1) and self.stride == (1, 1) and self.pad == (0, 0)


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


class ConvolutionBase(Layer):
    """Set-up shared by Convolution and Deconvolution (Caffe's BaseConvolutionLayer): parameters,
    group checks and the weight/bias blobs, whose weight shape each subclass gives."""

    min_bottom_blobs = 1
    min_top_blobs = 1
    equal_num_bottom_top_blobs = True

    def weight_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def layer_setup(self, bottom, top):
        p = self.layer_param.convolution_param
        self.geo = conv_geometry(self, p)
        if not p.HasField("num_output") or p.num_output == 0:
            raise self.error("convolution_param.num_output is required and must be positive")
        self.num_output = p.num_output
        self.group = p.group
        self.bias_term = p.bias_term
        self.axis = bottom[0].canonical_axis(p.axis)
        if bottom[0].num_axes - self.axis - 1 != 2:
            raise self.error(
                f"only 2-D {self.type.lower()} is supported: bottom shape {bottom[0].shape} has "
                f"{bottom[0].num_axes - self.axis - 1} spatial axes after channel axis {self.axis}"
            )
        self.channels = bottom[0].shape[self.axis]
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
        self._gpu_buffers: dict[str, tuple[int, Any]] = {}
        self._choice: tuple[ConvProblem, conv_engines.Choice] | None = None

    def _buffer(self, name: str, count: int) -> int:
        """A device buffer of at least ``count`` elements, kept on the layer and grown as needed."""
        nbytes = max(1, count) * self.dtype.itemsize
        have = self._gpu_buffers.get(name)
        if have is None or have[0] < nbytes:
            self._gpu_buffers[name] = have = (nbytes, backend.alloc(nbytes))
        return int(have[1])

    def _reshape_bottoms(self, bottom) -> None:
        """Check the bottoms against the weights; set ``num`` and ``in_hw``."""
        shape = bottom[0].shape
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != shape:
                raise self.error(f"all bottoms must have one shape: bottom 0 is {shape}, bottom {i} is {b.shape}")
        if shape[self.axis] != self.channels:
            raise self.error(f"bottom has {shape[self.axis]} channels (shape {shape}), weights expect {self.channels}")
        self.num = bottom[0].count_range(0, self.axis)
        self.in_hw = shape[self.axis + 1:]
        if len(self.in_hw) != 2:
            raise self.error(f"bottom shape {shape} must have 2 spatial axes after channel axis {self.axis}")


@register_layer("Convolution")
class ConvolutionLayer(ConvolutionBase):
    def weight_shape(self) -> tuple[int, ...]:
        return (self.num_output, self.channels // self.group) + self.geo.kernel

    def reshape(self, bottom, top):
        self._reshape_bottoms(bottom)
        g = self.geo
        self.out_hw = out_shape(self.in_hw[0], self.in_hw[1], g.kernel, g.pad, g.stride, g.dilation)
        if min(self.out_hw) <= 0:
            raise self.error(
                f"kernel {g.kernel[0]}x{g.kernel[1]} (dilation {g.dilation[0]}x{g.dilation[1]}) is larger "
                f"than the input {self.in_hw[0]}x{self.in_hw[1]} padded by {g.pad[0]}x{g.pad[1]}"
            )
        for t in top:
            t.reshape(bottom[0].shape[:self.axis] + (self.num_output,) + self.out_hw)

    # -- CPU (pycaffe_lite.cpu_conv) -------------------------------------------------------
    def forward_cpu(self, bottom, top):
        g = self.geo
        w = self.blobs[0].cpu_data()
        bias = self.blobs[1].cpu_data() if self.bias_term else None
        for b, t in zip(bottom, top):
            x = b.cpu_data().reshape((self.num, self.channels) + self.in_hw)
            y = t.mutable_cpu_data().reshape((self.num, self.num_output) + self.out_hw)
            cpu_conv.forward(x, w, bias, g.kernel, g.pad, g.stride, g.dilation, self.group, y)

    def backward_cpu(self, top, propagate_down, bottom):
        g = self.geo
        w = self.blobs[0].cpu_data()
        x_shape, y_shape = (self.num, self.channels) + self.in_hw, (self.num, self.num_output) + self.out_hw
        for i, (b, t) in enumerate(zip(bottom, top)):
            dw = self.blobs[0].mutable_cpu_diff() if self.param_propagate_down[0] else None
            db = self.blobs[1].mutable_cpu_diff() if self.bias_term and self.param_propagate_down[1] else None
            dx = b.mutable_cpu_diff().reshape(x_shape) if propagate_down[i] else None
            if dw is None and db is None and dx is None:
                continue
            x, dy = b.cpu_data().reshape(x_shape), t.cpu_diff().reshape(y_shape)
            cpu_conv.backward(x, w, dy, g.kernel, g.pad, g.stride, g.dilation, self.group,
                              dweight=dw, dbias=db, dx=dx)

    # -- GPU --------------------------------------------------------------------------------
    def _problem(self) -> ConvProblem:
        g = self.geo
        return ConvProblem(self.num, self.channels, self.in_hw[0], self.in_hw[1], self.num_output, self.group,
                           g.kernel, g.pad, g.stride, g.dilation, self.dtype.str)

    def engine_choice(self) -> conv_engines.Choice:
        """The engines for the current shape: autotuned once per shape (cached), narrowed by the
        ``engine`` field (CAFFE: im2col + GEMM; IMPLICIT_GEMM; WINOGRAD; DEFAULT/CUDNN: any)."""
        if self._choice is not None:  # only the batch and image size change between layer_setup calls
            have = self._choice[0]
            if have.num == self.num and (have.height, have.width) == self.in_hw:
                return self._choice[1]
        prob = self._problem()
        p = self.layer_param.convolution_param
        engine = p.Engine.Name(p.engine)
        if engine == "WINOGRAD" and not winograd.supports(prob):
            raise self.error("engine WINOGRAD needs a 3x3 kernel, stride 1, no dilation, group 1 and "
                             f"pad <= 2; this layer has kernel {self.geo.kernel}, stride {self.geo.stride}, "
                             f"dilation {self.geo.dilation}, group {self.group}, pad {self.geo.pad}")
        self._choice = (prob, conv_engines.choose(prob, self.bias_term, conv_engines.ENGINE_CANDIDATES[engine]))
        return self._choice[1]

    def forward_gpu(self, bottom, top):
        choice = self.engine_choice()
        prob, engine = self._choice[0], conv_engines.ENGINES[choice.forward]
        w = self.blobs[0].gpu_data()
        bias = self.blobs[1].gpu_data() if self.bias_term else None
        for b, t in zip(bottom, top):
            engine.forward(prob, b.gpu_data(), w, bias, t.mutable_gpu_data(), self._buffer)

    def backward_gpu(self, top, propagate_down, bottom):
        choice = self.engine_choice()
        prob = self._choice[0]
        w = self.blobs[0].gpu_data()
        dw = self.blobs[0].mutable_gpu_diff() if self.param_propagate_down[0] else None
        db = self.blobs[1].mutable_gpu_diff() if self.bias_term and self.param_propagate_down[1] else None
        for i, (b, t) in enumerate(zip(bottom, top)):
            dy = t.gpu_diff()
            dx = b.mutable_gpu_diff() if propagate_down[i] else None
            x = b.gpu_data()
            if choice.backward_data == choice.backward_weight:
                conv_engines.ENGINES[choice.backward_data].backward(prob, x, w, dy, dx, dw, db, self._buffer)
                continue
            if dw is not None or db is not None:
                conv_engines.ENGINES[choice.backward_weight].backward(prob, x, w, dy, None, dw, db, self._buffer)
            if dx is not None:
                conv_engines.ENGINES[choice.backward_data].backward(prob, x, w, dy, dx, None, None, self._buffer)
