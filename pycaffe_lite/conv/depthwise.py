"""The ``depthwise`` convolution engine (kernels in ``depthwise.cu``): group == channels, each output channel
``m`` filters input channel ``m // mult`` alone (``mult = num_output / channels``, MobileNet's is 1).

Direct kernels, no column buffer, any kernel size, stride, pad and dilation: the forward runs one thread
per output (bias fused), the data gradient assigns ``dx`` one thread per input element, the weight
gradient accumulates ``dw``/``db`` with a block per (output channel, chunk of the positions) reducing in
shared memory, then a fixed-order sum over chunks: no atomics, so the weight gradient is bitwise reproducible. 3x3 kernels with
stride 1 or 2 and no dilation (MobileNet's) run row-vector variants: a thread handles :data:`V`
neighbours along W (outputs; input pixels for the stride-1 data gradient) from one register copy of the
input row segment they share. Scratch comes from :func:`backend.workspace`.
"""

from __future__ import annotations

from pathlib import Path

from ..gpu import backend
from .problem import ConvProblem, epilogue_flags
from .registry import Engine, register_engine

KERNELS = Path(__file__).with_name("depthwise.cu")
THREADS = 256  # DW_THREADS in the .cu
MIN_CHUNK = 4 * THREADS  # positions per weight-gradient block, at least
BLOCKS_PER_SM = 8  # weight-gradient blocks wanted per multiprocessor
V = 4  # DW_V in the .cu: neighbours along W per thread in the k3 variants


def supports(prob: ConvProblem) -> bool:
    """Depthwise (group == channels), indices within int32."""
    big = max(prob.num * prob.channels * prob.in_plane, prob.num * prob.num_output * prob.out_plane)
    return prob.group == prob.channels and big <= backend.INT32_MAX


def _variant(prob: ConvProblem) -> str:
    if prob.kernel == (3, 3) and prob.stride in ((1, 1), (2, 2)) and prob.dilation == (1, 1):
        return f"k3s{prob.stride[0]}"
    return "any"


def _quads(width: int, prob: ConvProblem) -> int:
    """Threads per row of ``width``: one per V neighbours in the k3 variants, else one per pixel."""
    return -(-width // V) if _variant(prob) != "any" else width


def _geometry(prob: ConvProblem) -> tuple[int, ...]:
    """The kernels' DW_GEOMETRY_PARAMS."""
    return (prob.channels, prob.height, prob.width, prob.num_output // prob.channels, *prob.kernel, *prob.stride,
            *prob.pad, *prob.dilation, *prob.out_hw)


def _kernel(prob: ConvProblem, name: str):
    return backend.kernel(KERNELS, f"{name}_{_variant(prob)}", prob.np_dtype)


def chunking(prob: ConvProblem) -> tuple[int, int]:
    """(chunk, chunks): the weight gradient splits each channel's positions (``num * Ho * Wo``
    outputs, or ``num * Ho * ceil(Wo / V)`` row vectors in the k3 variants) into
    ``chunks`` blocks of ``chunk`` so that about BLOCKS_PER_SM blocks per SM run (fixed per shape
    and device, so the summation order is too)."""
    total = prob.num * prob.out_hw[0] * _quads(prob.out_hw[1], prob)
    want = -(-BLOCKS_PER_SM * backend.multiprocessor_count() // prob.num_output)
    chunks = max(1, min(want, total // MIN_CHUNK))
    chunk = -(-total // chunks)
    return chunk, -(-total // chunk)


def weight_scratch(prob: ConvProblem) -> int:
    """Bytes of partial sums the weight pass needs (0 when one chunk covers a channel)."""
    chunk, chunks = chunking(prob)
    return prob.num_output * chunks * (prob.khkw + 1) * prob.itemsize if chunks > 1 else 0


@register_engine("DEPTHWISE", order=30, summary="direct kernels for group == channels (depthwise), no "
                 "column buffer")
class DepthwiseEngine(Engine):
    name = "depthwise"
    requirement = "group == channels == num_output / k (a depthwise convolution)"

    def supports(self, prob):
        return supports(prob)

    def scratch(self, prob, pass_, has_bias):
        size = weight_scratch(prob) if pass_ == "backward_weight" else 0
        return (size,) if size else ()

    def forward(self, prob, x, w, bias, y, ws, relu=False):
        """``y = conv(x, w) (+ bias)``, then ReLU when ``relu``."""
        count = prob.num * prob.num_output * prob.out_hw[0] * _quads(prob.out_hw[1], prob)
        _kernel(prob, "dw_forward")(count, x, w, bias or w, epilogue_flags(bias, relu), y, *_geometry(prob))

    def backward_data(self, prob, w, dy, dx, ws):
        """``dx = dL/dx`` (assigned)."""
        per_row = _quads(prob.width, prob) if _variant(prob) == "k3s1" else prob.width
        count = prob.num * prob.channels * prob.height * per_row
        _kernel(prob, "dw_backward_data")(count, dy, w, dx, *_geometry(prob))

    def backward_weight(self, prob, x, dy, dw, db, ws):
        """``dw += dL/dw`` and ``db += dL/db`` (when given); ``ws[0]`` holds :func:`weight_scratch`
        bytes of partial sums when the positions split into several chunks."""
        chunk, chunks = chunking(prob)
        has_bias, taps = int(db is not None), prob.khkw
        part = ws[0] if ws else None
        if chunks > 1 and part is None:
            raise ValueError("depthwise weight gradient: the partial-sum scratch is missing")
        out = part if chunks > 1 else dw
        _kernel(prob, "dw_backward_weight")(x, dy, prob.num, chunk, chunks, has_bias, out, dw, db or dw,
                                            *_geometry(prob), grid=prob.num_output * chunks, block=THREADS)
        if chunks > 1:
            reduce = backend.kernel(KERNELS, "dw_reduce_weight", prob.np_dtype)
            reduce(prob.num_output * (taps + 1), part, chunks, taps, has_bias, dw, db or dw)
