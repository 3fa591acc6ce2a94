"""Convolution engines side by side with cuDNN (PyTorch) on the benchmark shapes.

    python benchmarks/conv_engines.py [--tf32] [--reps 50]

For every shape of ``run_all.CONV_SHAPES``: forward and backward time (ms per layer call) of each
forced engine (``engine: CAFFE`` = im2col + cuBLAS, ``IMPLICIT_GEMM``, ``WINOGRAD`` where it
applies) and of the autotuned default, the autotune's own per-pass measurements, and the peer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ours  # noqa: E402
import peer_torch  # noqa: E402
from run_all import CONV_SHAPES  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args(argv)
    import pycaffe_lite as caffe
    from pycaffe_lite.gpu import backend, conv_engines

    caffe.set_mode_gpu()
    if args.tf32:
        caffe.set_allow_tf32(True)
        peer_torch.ALLOW_TF32 = True
    reason = peer_torch.available()
    print(f"device: {backend.device_name()}{' (TF32)' if args.tf32 else ''}; peer: {reason or 'PyTorch'}")
    for name, (n, c, h, w, k, ks, pad) in CONV_SHAPES.items():
        print(f"\n{name}")
        if not reason:
            peer = peer_torch.conv_fwd_bwd(n, c, h, w, k, ks, pad)
            peer_total = peer["fwd_ms"] + peer["bwd_ms"]
            print(f"  {'cuDNN (PyTorch)':16s} fwd {peer['fwd_ms']:.3f} bwd {peer['bwd_ms']:.3f} ms")
        for engine in ("CAFFE", "IMPLICIT_GEMM", "WINOGRAD", "DEFAULT"):
            if engine == "WINOGRAD" and ks != 3:
                continue
            conv_engines.clear_cache()
            r = ours.conv_fwd_bwd(n, c, h, w, k, ks, pad, reps=args.reps, engine=engine)
            total = r["fwd_ms"] + r["bwd_ms"]
            ratio = f"  {total / peer_total:.2f}x cuDNN time" if not reason else ""
            print(f"  {engine:16s} fwd {r['fwd_ms']:.3f} bwd {r['bwd_ms']:.3f} ms{ratio}   [{r['engines']}]")
        for choice in conv_engines.cached_choices().values():
            for pass_name, eng, ms in choice.timings:
                print(f"    autotune {pass_name:15s} {eng:18s} {ms:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
