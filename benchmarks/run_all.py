"""Run pycaffe-lite and the peer (PyTorch eager) side by side on one device and print the ratios.

    python benchmarks/run_all.py [--only lenet_train,conv,...] [--iters 10000] [--cpu] [--out FILE.md]

Workloads (issue "Performance"): LeNet training with Caffe's recipe, convolution forward+backward
at four shapes, max pooling bandwidth, LeNet batch-1 latency and batch-10000 throughput; with
``--cpu``, LeNet training on the CPU. The peer is optional: without PyTorch only our side runs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ours  # noqa: E402
import peer_torch  # noqa: E402

CONV_SHAPES = {
    "conv n64 c64 56x56 k64 3x3": (64, 64, 56, 56, 64, 3, 1),
    "conv n32 c256 14x14 k256 3x3": (32, 256, 14, 14, 256, 3, 1),
    "conv LeNet conv1 n64 c1 28x28 k20 5x5": (64, 1, 28, 28, 20, 5, 0),
    "conv LeNet conv2 n64 c20 12x12 k50 5x5": (64, 20, 12, 12, 50, 5, 0),
}


def mnist_arrays():
    from pycaffe_lite.data import mnist

    d = os.environ.get("MNIST_DIR") or str(Path(__file__).resolve().parents[2] / "shared" / "mnist")
    train = mnist.find_files(d, "train")
    test = mnist.find_files(d, "test")
    if train is None or test is None:
        raise SystemExit(f"full MNIST not found in {d} (set MNIST_DIR)")
    return (*mnist.load(*train), *mnist.load(*test))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="lenet_train,conv,pool,latency,throughput")
    ap.add_argument("--iters", type=int, default=10000)
    ap.add_argument("--cpu", action="store_true", help="CPU LeNet training instead of the GPU table")
    ap.add_argument("--out", help="append the markdown table to this file")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 GEMMs on both sides")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    peer_reason = peer_torch.available()
    rows: list[tuple[str, str, str, str]] = []

    def add(name, mine, peer, ratio):
        rows.append((name, mine, peer, ratio))
        print(f"{name:42s} | ours {mine:>24s} | peer {peer:>24s} | {ratio}", flush=True)

    gpu = not args.cpu
    if gpu:
        import pycaffe_lite as caffe
        from pycaffe_lite.gpu import backend

        caffe.set_mode_gpu()
        device = backend.device_name()
        if args.tf32:
            caffe.set_allow_tf32(True)
            peer_torch.ALLOW_TF32 = True
            device += " (TF32 allowed)"
    else:
        device = f"CPU ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"
    print(f"device: {device}; peer: {peer_reason or 'PyTorch ' + __import__('torch').__version__}")

    if "lenet_train" in only or args.cpu:
        data = mnist_arrays()
        mine = ours.lenet_train(*data, iters=args.iters, gpu=gpu)
        peer = None if peer_reason else peer_torch.lenet_train(*data, iters=args.iters, device="cuda" if gpu else "cpu")
        add(f"LeNet train {args.iters} it ({'GPU' if gpu else 'CPU'})",
            f"{mine['it_s']:.0f} it/s, {100 * mine['accuracy']:.2f}%",
            f"{peer['it_s']:.0f} it/s, {100 * peer['accuracy']:.2f}%" if peer else "-",
            f"{mine['it_s'] / peer['it_s']:.2f}x it/s" if peer else "-")
    if gpu and "conv" in only:
        for name, (n, c, h, w, k, ks, pad) in CONV_SHAPES.items():
            mine = ours.conv_fwd_bwd(n, c, h, w, k, ks, pad)
            peer = None if peer_reason else peer_torch.conv_fwd_bwd(n, c, h, w, k, ks, pad)
            tm, tp = mine["fwd_ms"] + mine["bwd_ms"], (peer["fwd_ms"] + peer["bwd_ms"]) if peer else None
            add(name, f"fwd {mine['fwd_ms']:.3f} bwd {mine['bwd_ms']:.3f} ms",
                f"fwd {peer['fwd_ms']:.3f} bwd {peer['bwd_ms']:.3f} ms" if peer else "-",
                f"{tm / tp:.2f}x time" if peer else "-")
    if gpu and "pool" in only:
        mine = ours.maxpool_fwd(64, 64, 112, 112)
        peer = None if peer_reason else peer_torch.maxpool_fwd(64, 64, 112, 112)
        add("max pool fwd 64x64x112x112 3x3/2", f"{mine['gb_s']:.0f} GB/s", f"{peer['gb_s']:.0f} GB/s" if peer else "-",
            f"{mine['gb_s'] / peer['gb_s']:.2f}x GB/s" if peer else "-")
    if gpu and "latency" in only:
        mine = ours.lenet_forward(1, reps=500, sync_each=True)
        peer = None if peer_reason else peer_torch.lenet_forward(1, reps=500, sync_each=True)
        add("LeNet batch-1 forward latency", f"{1000 * mine['ms']:.0f} us", f"{1000 * peer['ms']:.0f} us" if peer else "-",
            f"{mine['ms'] / peer['ms']:.2f}x time" if peer else "-")
    if gpu and "throughput" in only:
        mine = ours.lenet_forward(10000, reps=50)
        peer = None if peer_reason else peer_torch.lenet_forward(10000, reps=50)
        add("LeNet batch-10000 forward", f"{mine['images_s'] / 1e6:.2f} M img/s",
            f"{peer['images_s'] / 1e6:.2f} M img/s" if peer else "-",
            f"{mine['images_s'] / peer['images_s']:.2f}x img/s" if peer else "-")

    if args.out:
        lines = [f"\n### {datetime.date.today()} on {device}\n", f"`python benchmarks/run_all.py {' '.join(argv or sys.argv[1:])}`\n",
                 "| workload | pycaffe-lite | peer | ratio |", "| --- | --- | --- | --- |"]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
        with open(args.out, "a") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
