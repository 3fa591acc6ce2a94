"""One layer's GPU kernels on half storage against the same layer in float64 on the CPU.

:func:`check_half_gpu` creates the layer as a half net built in GPU mode creates it (its
precision from ``default_forward_type``/``default_backward_type``: float16, or bfloat16 as uint16
bit patterns), so a layer declaring ``Traits.half_kernels`` gets ``dtype`` = the storage type and
runs its kernels on half blobs directly (``Mtype`` float inside). Inputs, params and top gradients
are rounded to the format first and the float64 reference gets the same values, so the two differ
only by what half storage does: one rounding per stored value (tops, bottom diffs, values a layer
stores between passes) and float32 arithmetic. Each compared array must agree within
``k · eps · max|reference|`` (eps: 2^-11 fp16, 2^-8 bf16, the unit roundoff; k per layer, stated by
the caller: about 1-2 for one rounding, more where a result depends on several stored roundings).
Needs a GPU (PyCUDA).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from .. import common
from ..blob import Blob
from ..errors import CaffeError
from .gradient_check import UNIT_ROUNDOFF


class HalfCheckError(CaffeError):
    """A half layer's result is past its bound (or the layer does not run natively in half)."""


def representable(values: np.ndarray, dtype) -> np.ndarray:
    """``values`` rounded to ``dtype`` (float16, or uint16 for bfloat16), as float64."""
    probe = Blob(np.shape(values), dtype)
    probe.set_math_data(np.asarray(values, np.float32))
    return probe.math_data().astype(np.float64)


def check_half_gpu(text: str, arrays: Sequence[np.ndarray], dtype, k: float, ntop: int = 1,
                   propagate: Sequence[bool] | None = None, seed: int = 1701,
                   params: Sequence[np.ndarray] | None = None) -> dict[str, float]:
    """Run layer ``text`` on the GPU in ``dtype`` (np.float16, or np.uint16 for bfloat16) on
    ``arrays`` (rounded to it) forward and backward, and the same layer in float64 on the CPU;
    ``params``: values for its param blobs (rounded too; default: what its fillers made). Returns
    each compared array's error over its bound (tops, bottom diffs, param diffs; all <= 1), and
    raises :class:`HalfCheckError` naming the first array past ``k · eps · max|reference|``."""
    from ..layer import create_layer
    from ..precision import layer_precision, type_of_dtype
    from ..schema import caffe_pb2
    from .layer_testing import blobs, empty_blobs, make_layer

    half_dtype = np.dtype(dtype)
    eps = UNIT_ROUNDOFF[half_dtype]
    name = "bfloat16" if half_dtype == np.uint16 else half_dtype.name
    inputs = [representable(a, half_dtype) for a in arrays]
    net = caffe_pb2.NetParameter()
    net.default_forward_type = net.default_backward_type = cast("caffe_pb2.Type", type_of_dtype(half_dtype))
    common.set_mode_gpu()
    param = make_layer(text, np.float32).layer_param
    layer = create_layer(param, np.float32, layer_precision(net, param))
    if not layer.half_native:
        raise HalfCheckError(f"{layer!r} does not run its kernels on {name} (traits.half_kernels is False)")
    ref = make_layer(text, np.float64)
    prop = list(propagate) if propagate is not None else [ref.allow_force_backward(i) for i in range(len(inputs))]
    hb = []
    for i, a in enumerate(inputs):
        b = Blob(a.shape, half_dtype if layer.allow_force_backward(i) else np.float32)
        b.set_math_data(a.astype(np.float32))
        hb.append(b)
    ht = [Blob((), layer.top_dtype, layer.top_diff_dtype) for _ in range(ntop)]
    common.set_random_seed(seed)
    layer.setup(hb, ht)
    common.set_mode_cpu()
    rb, rt = blobs(inputs), empty_blobs(ntop)
    common.set_random_seed(seed)
    ref.setup(rb, rt)
    for j, (hp, rp) in enumerate(zip(layer.blobs, ref.blobs)):
        if params is not None and j < len(params):
            hp.set_math_data(representable(params[j], hp.dtype).astype(np.float32) if hp.dtype.itemsize == 2
                             else np.asarray(params[j], np.float32))
        rp.mutable_cpu_data()[...] = hp.math_data()
    common.set_mode_gpu()
    common.set_random_seed(seed)
    layer.forward(hb, ht)
    common.set_mode_cpu()
    common.set_random_seed(seed)
    ref.forward(rb, rt)
    rng = np.random.default_rng(seed)
    for h, r in zip(ht, rt):
        w = representable(rng.uniform(-1, 1, r.shape), half_dtype)
        h.set_math_diff(w.astype(np.float32))
        r.mutable_cpu_diff()[...] = w
    for p in (*layer.blobs, *ref.blobs):
        p.set_math_diff(np.zeros(p.shape, np.float32))
    common.set_mode_gpu()
    layer.backward(ht, prop, hb)
    common.set_mode_cpu()
    ref.backward(rt, prop, rb)
    compared = [(f"top {i}", h.math_data(), r.cpu_data()) for i, (h, r) in enumerate(zip(ht, rt))]
    compared += [(f"bottom {i} diff", h.math_diff(), r.cpu_diff())
                 for i, (h, r, p) in enumerate(zip(hb, rb, prop)) if p]
    compared += [(f"param {j} diff", h.math_diff(), r.cpu_diff())
                 for j, (h, r) in enumerate(zip(layer.blobs, ref.blobs))
                 if j < len(layer.param_propagate_down) and layer.param_propagate_down[j]]
    compared += [(f"param {j} (running statistics)", h.math_data(), r.cpu_data())
                 for j, (h, r) in enumerate(zip(layer.blobs, ref.blobs))
                 if j >= len(layer.param_propagate_down) or not layer.param_propagate_down[j]]
    ratios: dict[str, float] = {}
    for label, got, want in compared:
        bound = k * eps * max(float(np.abs(want).max(initial=0.0)), float(np.finfo(np.float32).tiny))
        err = float(np.abs(got.astype(np.float64) - want).max(initial=0.0))
        ratios[label] = err / bound
        if not np.isfinite(err) or err > bound:
            raise HalfCheckError(f"{layer!r} on the GPU in {name}: {label} differs from float64 by {err:.3g} > "
                                 f"{bound:.3g} ({k:g} eps max|ref|, eps = {eps:.3g})")
    return ratios
