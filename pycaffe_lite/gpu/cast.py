"""Conversions between storage types on the device, and the loss-scale kernels of half training.

The storage types are float32, float64, float16 and bfloat16 (host arrays of uint16 bit patterns,
see :mod:`pycaffe_lite.precision`). :func:`convert` copies ``n`` values from one type into another,
rounding to nearest even, optionally through a third type first (a value as it would come back
from that storage). The kernels are graph-safe: no host reads, no allocations.
"""

from __future__ import annotations

import numpy as np

from . import backend

# storage dtype -> (C type, expression giving its value as float/double from ``v``)
_LOAD = {
    np.dtype(np.float32): ("float", "v"),
    np.dtype(np.float64): ("double", "v"),
    np.dtype(np.float16): ("__half", "__half2float(v)"),
    np.dtype(np.uint16): ("__nv_bfloat16", "__bfloat162float(v)"),
}
# storage dtype -> expression rounding the float ``v`` to it and back (None: no rounding)
_THROUGH = {
    np.dtype(np.float16): "__half2float(__float2half_rn((float)v))",
    np.dtype(np.uint16): "__bfloat162float(__float2bfloat16_rn((float)v))",
    np.dtype(np.float32): "(float)v",
}


def _name(dtype: np.dtype) -> str:
    return "bf16" if dtype == np.uint16 else dtype.name


def _loader(s: np.dtype, d: np.dtype) -> tuple[str, str]:
    """(the C type values travel in from ``s`` to ``d``: double if either is float64, else float; a
    preamble naming the source type ``Stype`` and ``load_s``, its value in that type)."""
    stype, load = _LOAD[s]
    wide = "double" if np.float64 in (s, d) else "float"
    return wide, (backend.HALF_HEADERS + f"typedef {stype} Stype;\n"
                  f"static __device__ __forceinline__ {wide} load_s(const Stype v) {{ return {load}; }}\n")


def convert(n: int, src: int, src_dtype, dst: int, dst_dtype, through=None) -> None:
    """``dst[i] = src[i]`` for ``i < n`` converted from ``src_dtype`` into ``dst_dtype`` (values
    rounded through ``through`` first when it is given and narrower than both)."""
    s, d = np.dtype(src_dtype), np.dtype(dst_dtype)
    t = None if through is None else np.dtype(through)
    if t is not None and (t == s or t == d or t == np.float64):
        t = None
    if s == d and t is None:
        backend.memcpy_dtod(dst, src, n * s.itemsize)
        return
    wide, preamble = _loader(s, d)
    step = _THROUGH[t] if t is not None else "v"
    preamble += f"static __device__ __forceinline__ {wide} round_t(const {wide} v) {{ return {step}; }}\n"
    name = f"cast_{_name(s)}_{_name(d)}" + (f"_via_{_name(t)}" if t is not None else "")
    backend.elementwise(name, "const Stype* x, Dtype* y", "y[i] = from_m((Mtype)round_t(load_s(x[i])))",
                        d, preamble)(n, src, dst)


def scale_by_slot(n: int, ptr: int, dtype, slot: int) -> None:
    """``x[i] *= s`` for ``i < n``, ``s`` the float32 at device address ``slot`` (a loss scale that
    changes on the device between replays of one graph)."""
    backend.elementwise("scale_by_slot", "Dtype* x, const float* s", "x[i] = from_m(to_m(x[i]) * (Mtype)s[0])",
                        dtype)(n, ptr, slot)


def unscale(n: int, src: int, src_dtype, dst: int, dst_dtype, inv_slot: int, found: int) -> None:
    """``dst[i] = src[i] * inv`` (``inv`` the float32 at ``inv_slot``, ``dst`` in ``dst_dtype``, may be
    ``src`` itself), setting the int at ``found`` to 1 where a result is not finite (inf or NaN):
    the loss-scaled gradient of a half param into its master's diff, or a float32 param's in place."""
    s, d = np.dtype(src_dtype), np.dtype(dst_dtype)
    wide, preamble = _loader(s, d)
    backend.elementwise(f"unscale_{_name(s)}_{_name(d)}", "const Stype* x, Dtype* y, const float* inv, int* found",
                        f"const {wide} v = load_s(x[i]) * ({wide})inv[0]; "
                        "if (!isfinite(v)) found[0] = 1; y[i] = from_m((Mtype)v)", d, preamble)(
        n, src, dst, inv_slot, found)
