"""The ``tensorcore16-wgmma-BMxBN`` convolution engines: tensorcore16-nhwc's forward and data
gradient with the GEMM on Hopper's warpgroup tensor cores (``t16w_conv_<tile>`` in ``wgmma.cu``).

The passes stage their operands as tensorcore16-nhwc does (x or dy NCHW -> NHWC, the weights
permuted; :func:`.tensorcore16_nhwc.plan`) and run one ``wgmma.mma_async`` GEMM per stride phase:
both operands copied by 16-byte ``cp.async`` into a ring of :data:`STAGES` 128-byte-swizzled
stages that the tensor cores read through shared-memory descriptors, fp32 accumulation, one
rounding in the bias + ReLU epilogue. The weight gradient is not offered (``passes``): the autotune
keeps tensorcore16-nhwc's or another engine's for it, and tensorcore16-nhwc's ``backward_pair``
hands its staged dy to these data-gradient GEMMs.

Offered (:func:`supports`) where tensorcore16-nhwc is and the device is compute capability 9.0
(``wgmma`` needs the ``sm_90a`` code this module compiles; it does not run on later families).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..gpu import backend
from . import tensorcore16 as t16
from . import tensorcore16_nhwc as t16n
from .problem import ConvProblem
from .registry import register_engine
from .tiling import tile_shape

KERNELS = Path(__file__).with_suffix(".cu")
ARCH = "sm_90a"  # wgmma.mma_async: Hopper's architecture-specific features
TILES = ("128x256", "128x128", "64x128")  # T16W_CONV lines of the .cu
STAGES = {"128x256": 4, "128x128": 5, "64x128": 4}  # their STAGES (the fastest of the counts timed on ResNet-50's shapes, H200)
BK = 64  # contraction elements per slice: T16W_BK
ALIGN = 1024  # the stage ring's alignment (the 128-byte swizzle's 8-row atoms), found inside the allocation
REQUIREMENT = t16n.REQUIREMENT.replace("compute capability 8.0+", "compute capability 9.0")


def shared_bytes(tile: str) -> int:
    """Dynamic shared memory of ``t16w_conv_<tile>``: the stage ring (A and B rows of :data:`BK`
    halves) or the epilogue tile (BM rows of BN + 8 halves), whichever is larger, and room to align."""
    bm, bn = tile_shape(tile)
    return 2 * max(STAGES[tile] * (bm + bn) * BK, bm * (bn + 8)) + ALIGN


def conv_kernel(tile: str, dtype) -> tuple[Any, int]:
    """``t16w_conv_<tile>`` compiled for ``dtype`` and sm_90a, and its dynamic shared memory."""
    return backend.kernel(KERNELS, f"t16w_conv_{tile}", dtype, arch=ARCH), shared_bytes(tile)


def supports(prob: ConvProblem) -> bool:
    """tensorcore16-nhwc's requirements (checked first: float32/float64 problems are refused without
    a device) on a compute capability 9.0 device."""
    return t16n.supports(prob) and t16.compute_capability() == (9, 0)


@register_engine("TENSOR_CORE_16", order=57, summary="tensorcore16-nhwc's forward and data gradient with the "
                 "GEMM on Hopper's wgmma (cp.async into 128-byte-swizzled stages read by the tensor cores, fp32 "
                 "accumulation; float16 and bfloat16 blobs, compute capability 9.0, group 1, no dilation; no "
                 "weight gradient of its own)")
class Wgmma16Engine(t16n.TensorCore16NhwcEngine):
    """The NHWC-staged fp16/bf16 implicit GEMM on wgmma with ``tile`` tiles (forward, data gradient)."""

    requirement = REQUIREMENT
    prefix = "tensorcore16-wgmma"
    tiles: tuple[str, ...] = TILES
    passes = ("forward", "backward_data")
    kernel_of = staticmethod(conv_kernel)

    def supports(self, prob):
        return supports(prob)
