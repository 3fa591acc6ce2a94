"""The convolution engines' staging copies at ResNet-50's shapes, against a device-to-device copy
moving the same bytes.

    python benchmarks/conv_copies.py [--batch 256] [--precision fp16|bf16|fp32] [--reps 20] [--eager]
                                     [--only REGEX]

The copies: the gemm engine's ``copy_planes`` (7x7 planes to and from planes padded to 16 bytes, its
half-precision 1x1 path), ``subsample_planes`` / ``upsample_planes`` (its strided 1x1 path: the three
stride-2 downsampling shapes), ``swap_leading_axes`` ((M, N, P) <-> (N, M, P) of its column path) and
``tensorcore16_nhwc``'s ``t16n_to_nhwc`` staging (NCHW -> NHWC, half only). For each: the device time
per call (``bandwidth.Timer``: CUDA-graph replay of 5 calls, or ``--eager`` calls), the GB/s of the
bytes the copy must move (each value it reads or writes once; strided reads count only the values
used) and that as a percentage of a device-to-device copy of the same bytes (``bandwidth.CopyRates``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PRECISIONS = {"fp16": np.float16, "bf16": np.uint16, "fp32": np.float32}  # (bf16: uint16 bit patterns)


@dataclass(frozen=True)
class Case:
    """One copy: ``run(src, dst)`` on device buffers of ``src_elems`` / ``dst_elems`` values, moving ``moved``."""

    name: str
    src_elems: int
    dst_elems: int
    moved: int
    run: Callable[[int, int], None]


def cases(batch: int, dtype) -> list[Case]:
    """ResNet-50's staging copies at ``batch`` in storage ``dtype``."""
    from pycaffe_lite.conv import im2col

    out = []
    for c in (512, 2048):  # the 1x1 convolutions at 7x7 (the padded half path): in and out of the padding
        planes = batch * c
        out.append(Case(f"copy_planes 49 -> 56   {batch}x{c}x7x7", planes * 49, planes * 56, 2 * planes * 49,
                        partial(_copy_planes, planes=planes, strides=(49, 56), dtype=dtype)))
        out.append(Case(f"copy_planes 56 -> 49   {batch}x{c}x7x7", planes * 56, planes * 49, 2 * planes * 49,
                        partial(_copy_planes, planes=planes, strides=(56, 49), dtype=dtype)))
    for c, hw in ((256, 56), (512, 28), (1024, 14)):  # the stride-2 1x1 downsampling convolutions' inputs
        planes, o = batch * c, hw // 2
        out.append(Case(f"subsample_planes /2    {batch}x{c}x{hw}x{hw}", planes * hw * hw, planes * o * o,
                        2 * planes * o * o,
                        partial(_strided, im2col.subsample_planes, planes=planes, hw=hw, dtype=dtype)))
        out.append(Case(f"upsample_planes x2     {batch}x{c}x{hw}x{hw}", planes * o * o, planes * hw * hw,
                        planes * (o * o + hw * hw),
                        partial(_strided, im2col.upsample_planes, planes=planes, hw=hw, dtype=dtype)))
    for m, p in ((64, 3136), (256, 196), (512, 49)):  # (M, N, P) -> (N, M, P) of the column path
        n = m * batch * p
        out.append(Case(f"swap_leading_axes      {m}x{batch}x{p}", n, n, 2 * n,
                        partial(_swap, dims=(m, batch, p), dtype=dtype)))
    if np.dtype(dtype).itemsize == 2:
        for c, p in ((64, 3136), (256, 3136), (512, 784), (1024, 196), (2048, 49)):
            n = batch * c * p
            out.append(Case(f"t16n_to_nhwc           {batch}x{c}x{p}", n, n, 2 * n, _nhwc_stage(batch, c, p, dtype)))
    return out


def _copy_planes(src: int, dst: int, *, planes: int, strides: tuple[int, int], dtype) -> None:
    from pycaffe_lite.conv import im2col

    im2col.copy_planes(src, planes, 49, strides[0], dst, strides[1], dtype)


def _strided(copy: Callable, src: int, dst: int, *, planes: int, hw: int, dtype) -> None:
    copy(src, planes, (hw, hw), (2, 2), dst, dtype)


def _swap(src: int, dst: int, *, dims: tuple[int, int, int], dtype) -> None:
    from pycaffe_lite.conv import im2col

    im2col.swap_leading_axes(src, dims[0], dims[1], dims[2], dst, dtype)


def _nhwc_stage(batch: int, channels: int, plane: int, dtype) -> Callable[[int, int], None]:
    """``t16n_to_nhwc`` of a (batch, channels, plane) operand (its plan made on the first call)."""
    plan: list = []

    def run(src: int, dst: int) -> None:
        if not plan:
            from pycaffe_lite.conv import tensorcore16_nhwc as tc16n
            from pycaffe_lite.conv.problem import ConvProblem

            prob = ConvProblem(batch, channels, plane, 1, 8, 1, (1, 1), (0, 0), (1, 1), (1, 1), np.dtype(dtype).str)
            plan.append(tc16n.stage_plan(prob, batch, channels, plane))
        plan[0](src, dst)
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--precision", choices=sorted(PRECISIONS), default="fp16")
    ap.add_argument("--reps", type=int, default=20, help="timed graph launches (or calls with --eager)")
    ap.add_argument("--eager", action="store_true", help="time plain calls, not CUDA graph replays")
    ap.add_argument("--only", default="", help="a regular expression: time only the cases whose name it finds")
    args = ap.parse_args(argv)

    import bandwidth

    import pycaffe_lite as caffe
    from pycaffe_lite.gpu import backend

    caffe.set_mode_gpu()
    dtype = PRECISIONS[args.precision]
    isz = np.dtype(dtype).itemsize
    timer = bandwidth.Timer(args.reps, 5, args.eager)
    same = bandwidth.CopyRates(timer)
    todo = [c for c in cases(args.batch, dtype) if re.search(args.only, c.name)]
    if not todo:
        ap.error(f"--only {args.only!r} matches no case")
    src = backend.alloc(max(c.src_elems for c in todo) * isz)
    dst = backend.alloc(max(c.dst_elems for c in todo) * isz)
    backend.memset_zero(int(src), max(c.src_elems for c in todo) * isz)
    print(f"device: {backend.device_name()}; {args.precision}, batch {args.batch}; "
          f"timing: {'eager calls' if args.eager else 'CUDA graph replay'}\n")
    print(f"{'copy / shape':40s} {'ms':>8s} {'GB/s':>7s} {'same-size copy GB/s':>19s} {'% copy':>7s}")
    for case in todo:
        ms = timer(lambda c=case: c.run(int(src), int(dst)))
        moved = case.moved * isz
        gbs = moved / ms / 1e6
        copy = same(max(4, moved // 2 // 4 * 4))  # a copy reading half the bytes and writing half
        print(f"{case.name:40s} {ms:8.3f} {gbs:7.0f} {copy:19.0f} {100 * gbs / copy:6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
