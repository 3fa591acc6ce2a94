"""DepthwiseConvolution: the MobileNet forks' depthwise convolution type (yonghenglh6/DepthwiseConvolution).

A Convolution (same ``convolution_param``, weights ``(num_output, 1, *kernel)``, bias ``(num_output,)``,
blobs stored as Convolution stores them, so the forks' caffemodels load by layer name) whose group is
the number of input channels C: each output channel ``o`` convolves input channel ``o // (num_output/C)``
alone. ``group`` may be left out (it is C); any other value is an error. ``num_output`` defaults to C
and must be a multiple of it (a depth multiplier). On the GPU the default engine is the depthwise one
(``engine: CAFFE`` and the other forced engines still apply); the N-D and CPU paths are Convolution's.
"""

from __future__ import annotations

from typing import Any

from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.layer import CONVOLUTION, Traits, register_layer

from .convolution import ConvolutionLayer


def depthwise_candidates(engine: str, prob: ConvProblem) -> tuple[str, ...] | None:
    """The depthwise engine for DEFAULT/CAFFE/CUDNN where it takes the problem (the forks' types
    mean it); None: the field's candidates."""
    if engine in ("DEFAULT", "CAFFE", "CUDNN") and conv_engines.ENGINES["depthwise"].supports(prob):
        return ("depthwise",)
    return None


@register_layer("DepthwiseConvolution")
class DepthwiseConvolutionLayer(ConvolutionLayer):
    traits = Traits(graph_safe=True, pure_forward=True, fuses=frozenset({CONVOLUTION}))

    def output_and_group(self, p: Any) -> tuple[int, int]:
        c = self.channels
        if p.HasField("group") and p.group != c:
            raise self.error(f"a depthwise convolution has group = input channels ({c}); got group {p.group}")
        num_output = p.num_output if p.HasField("num_output") and p.num_output else c
        if num_output % c:
            raise self.error(f"num_output {num_output} must be a multiple of the {c} input channels")
        return num_output, c

    def engine_candidates(self, engine: str, prob: ConvProblem) -> tuple[str, ...]:
        return depthwise_candidates(engine, prob) or super().engine_candidates(engine, prob)
