"""The ``direct`` convolution engine: forward for small batches (kernels in ``direct.cu``): one launch per layer,
no column buffer, bias in the epilogue; a block computes a 16x16 output tile of 8 output channels of one
image from input patches and filter taps staged in shared memory.

Forward only (``passes``): a layer forced to it (``engine: DIRECT``) back-propagates with the gemm
engine, and the autotune (per pass) picks other engines for the gradients.
"""

from __future__ import annotations

from pathlib import Path

from ..gpu import backend
from .problem import ConvProblem, epilogue_flags
from .registry import Engine, register_engine

KERNELS = Path(__file__).with_name("direct.cu")
MAX_BATCH = 4
KERNEL_SIZES = (1, 3, 5, 7)
TILE, TM = 16, 8  # DC_TILE x DC_TILE outputs of DC_TM channels per block; (DC_TILE, 8) threads


def supports(prob: ConvProblem) -> bool:
    """Batch <= 4, group 1, square 1/3/5/7 kernel, equal strides of 1 or 2, no dilation."""
    k, s = prob.kernel[0], prob.stride[0]
    big = max(prob.num * prob.channels * prob.in_plane, prob.num * prob.num_output * prob.out_plane,
              prob.num_output * prob.kg)
    return (prob.num <= MAX_BATCH and prob.group == 1 and prob.kernel == (k, k) and k in KERNEL_SIZES
            and prob.stride == (s, s) and s in (1, 2) and prob.dilation == (1, 1) and big <= backend.INT32_MAX)


@register_engine("DIRECT", order=40, summary="small-batch direct forward (its gradients run on the gemm "
                 "engine when forced)")
class DirectEngine(Engine):
    name = "direct"
    requirement = "batch <= 4, group 1, square 1/3/5/7 kernel, stride 1 or 2, no dilation"
    passes = ("forward",)

    def supports(self, prob):
        return supports(prob)

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        """``y = conv(x, w) (+ bias)``, then ReLU when ``relu``."""
        ho, wo = prob.out_hw
        k = backend.kernel(KERNELS, f"dc_forward_k{prob.kernel[0]}s{prob.stride[0]}", prob.np_dtype)
        grid = (-(-ho // TILE) * -(-wo // TILE), -(-prob.num_output // TM), prob.num)
        k(x, w, bias or w, epilogue_flags(bias, relu), y, prob.channels, prob.height, prob.width, prob.num_output,
          *prob.pad, ho, wo, grid=grid, block=(TILE, 8, 1))
