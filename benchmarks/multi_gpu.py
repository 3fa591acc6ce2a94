"""Multi-GPU training: images/s on one and two GPUs, PyTorch DDP (NCCL) as the peer, LeNet accuracy.

    python benchmarks/multi_gpu.py [--only resnet50,caffenet,ddp,lenet] [--iters 100] [--out FILE.md]

Rows (issue 15, on 2 GPUs): ResNet-50 (DummyData, batch 32 per GPU) images/s on 2 GPUs vs 1
(target >= 1.95x) and vs PyTorch DDP's on 2 GPUs (target >= 1x); CaffeNet (batch 128 per GPU)
2 vs 1 GPU (>= 1.9x); LeNet with Caffe's recipe at batch 64 per GPU on 2 GPUs for 5,000
iterations: test accuracy (>= 99.0 %). Ours runs as ``pycaffe-lite train --gpu 0,1`` exactly as a
user would; images/s is read from rank 0's "iter/s" display lines after the warm-up (CUDA graph
capture, convolution autotuning). Both sides compute in float32 without TF32.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples" / "model_zoo"))

import model_zoo  # noqa: E402  (examples/model_zoo/model_zoo.py)

from pycaffe_lite.proto import caffe_pb2  # noqa: E402
from pycaffe_lite.proto.protoio import parse_text, write_text  # noqa: E402

DISPLAY = 20


def training_net(deploy: caffe_pb2.NetParameter, batch: int) -> caffe_pb2.NetParameter:
    """``deploy`` made trainable: DummyData (constant image and label) in, BatchNorm computing batch
    statistics, Gaussian/constant fillers, the final Softmax replaced by SoftmaxWithLoss."""
    shape = list(deploy.input_dim[1:]) if deploy.input_dim else list(deploy.layer[0].input_param.shape[0].dim[1:])
    net = caffe_pb2.NetParameter(name=deploy.name)
    net.layer.append(parse_text(
        f'name: "data" type: "DummyData" top: "data" top: "label" dummy_data_param {{ '
        f'shape {{ dim: {batch} {" ".join(f"dim: {d}" for d in shape)} }} shape {{ dim: {batch} }} '
        f'data_filler {{ type: "constant" value: 0.5 }} data_filler {{ type: "constant" value: 1 }} }}',
        caffe_pb2.LayerParameter()))
    layers = [lp for lp in deploy.layer if lp.type != "Input"]
    last = layers.pop()
    assert last.type == "Softmax", last.type
    for src in layers:
        lp = net.layer.add()
        lp.CopyFrom(src)
        if lp.type == "BatchNorm":
            lp.batch_norm_param.ClearField("use_global_stats")
        for p in (lp.convolution_param, lp.inner_product_param) if lp.type in ("Convolution", "InnerProduct") else ():
            p.weight_filler.type, p.weight_filler.std = "gaussian", 0.01
    net.layer.append(parse_text(f'name: "loss" type: "SoftmaxWithLoss" bottom: "{last.bottom[0]}" bottom: "label" '
                                f'top: "loss"', caffe_pb2.LayerParameter()))
    return net


def train(solver: Path, gpus: str, timeout: float, env: dict | None = None) -> str:
    """Run ``pycaffe-lite train`` and return its log (stderr); raises on failure."""
    cmd = [sys.executable, "-m", "pycaffe_lite", "train", "--solver", str(solver), "--gpu", gpus, "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return done.stderr


def iters_per_s(log: str) -> float:
    """Median iter/s of the display windows after the first two (warm-up)."""
    rates = [float(m.group(1)) for m in re.finditer(r"Iteration \d+ \(([\d.e+-]+) iter/s", log)]
    if len(rates) < 3:
        raise RuntimeError(f"too few display lines in the log:\n{log[-2000:]}")
    return statistics.median(rates[2:])


def ours_images_per_s(name: str, deploy, batch: int, gpus: str, iters: int, folder: Path, timeout: float) -> float:
    net = folder / f"{name}_train.prototxt"
    write_text(net, training_net(deploy, batch))
    solver = folder / f"{name}_{gpus.replace(',', '')}_solver.prototxt"
    solver.write_text(f'net: "{net}" base_lr: 0.001 momentum: 0.9 weight_decay: 0.0001 lr_policy: "fixed" '
                      f"max_iter: {iters} display: {DISPLAY} snapshot_after_train: false random_seed: 1\n")
    ngpu = len(gpus.split(","))
    return iters_per_s(train(solver, gpus, timeout)) * batch * ngpu


def lenet_accuracy(folder: Path, iters: int, timeout: float) -> float:
    from pycaffe_lite.data import mnist

    d = os.environ.get("MNIST_DIR") or str(REPO.parent / "shared" / "mnist")
    dbs = {}
    for split in ("train", "test"):
        files = mnist.find_files(d, split)
        if files is None:
            raise RuntimeError(f"full MNIST not found in {d} (set MNIST_DIR)")
        dbs[split] = folder / f"mnist_{split}_lmdb"
        mnist.convert(*files, dbs[split])
    text = (REPO / "examples/mnist/lenet_train_test.prototxt").read_text()
    text = text.replace("examples/mnist/mnist_train_lmdb", str(dbs["train"]))
    net = folder / "lenet_train_test.prototxt"
    net.write_text(text.replace("examples/mnist/mnist_test_lmdb", str(dbs["test"])))
    solver = folder / "lenet_solver.prototxt"
    solver.write_text(f'net: "{net}" test_iter: 100 test_interval: {iters} test_initialization: false '
                      'base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005 lr_policy: "inv" gamma: 0.0001 power: 0.75 '
                      f'display: 500 max_iter: {iters} snapshot_after_train: false random_seed: 1\n')
    log = train(solver, "0,1", timeout)
    found = re.findall(r"Test net output #\d+: accuracy = ([\d.]+)", log)
    if not found:
        raise RuntimeError(f"no test accuracy in the log:\n{log[-2000:]}")
    return float(found[-1])


# -- the peer: PyTorch DistributedDataParallel over NCCL --------------------------------------------
def _ddp_worker(rank: int, world: int, port: int, batch: int, iters: int, tf32: bool, out) -> None:
    import torch
    import torch.distributed as dist

    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank)
    model = torch.nn.parallel.DistributedDataParallel(_resnet50(torch).cuda(), device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9, weight_decay=1e-4)
    x = torch.full((batch, 3, 224, 224), 0.5, device="cuda")
    y = torch.ones(batch, dtype=torch.long, device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if rank == 0:
        out.put(iters * batch * world / elapsed)
    dist.destroy_process_group()


def _resnet50(torch):
    """torchvision's ResNet-50 when installed, else the same architecture written out."""
    try:
        import torchvision

        return torchvision.models.resnet50()
    except ImportError:
        pass
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, 4 * width, 1, bias=False), nn.BatchNorm2d(4 * width))
            self.short = (nn.Sequential(nn.Conv2d(cin, 4 * width, 1, stride, bias=False), nn.BatchNorm2d(4 * width))
                          if stride != 1 or cin != 4 * width else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.short(x))

    layers, cin = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                   nn.MaxPool2d(3, 2, 1)], 64
    for s, (blocks, width) in enumerate(model_zoo.RESNET50_STAGES):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, 2 if b == 0 and s > 0 else 1))
            cin = 4 * width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))


def ddp_images_per_s(batch: int, iters: int, tf32: bool, timeout: float) -> float:
    import torch.multiprocessing as tmp

    from pycaffe_lite.parallel.launch import free_port

    ctx = tmp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_ddp_worker, args=(r, 2, port, batch, iters, tf32, out), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        return float(out.get(timeout=timeout))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="resnet50,caffenet,ddp,lenet")
    ap.add_argument("--iters", type=int, default=100, help="iterations per throughput run (display every 20)")
    ap.add_argument("--lenet-iters", type=int, default=5000)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run")
    ap.add_argument("--out", help="append the markdown table to this file")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    rows = []

    def add(name: str, value: str, target: str, ok: bool | None) -> None:
        verdict = "n/a" if ok is None else ("met" if ok else "NOT met")
        rows.append((name, value, target, verdict))
        print(f"{name:48s} | {value:>28s} | {target:>10s} | {verdict}", flush=True)

    with tempfile.TemporaryDirectory(prefix="multi_gpu_bench_") as tmp:
        folder = Path(tmp)
        resnet2 = None
        for key, deploy, batch, target in (("resnet50", model_zoo.resnet50(1), 32, 1.95),
                                           ("caffenet", model_zoo.caffenet(1), 128, 1.9)):
            if key not in only:
                continue
            try:
                one = ours_images_per_s(key, deploy, batch, "0", args.iters, folder, args.timeout)
                two = ours_images_per_s(key, deploy, batch, "0,1", args.iters, folder, args.timeout)
            except Exception as exc:  # report and go on with the other rows
                add(f"{deploy.name} batch {batch}/GPU", f"failed: {str(exc).splitlines()[0][:60]}", f">= {target}x", False)
                continue
            if key == "resnet50":
                resnet2 = two
            add(f"{deploy.name} batch {batch}/GPU images/s 1 GPU -> 2 GPUs", f"{one:.0f} -> {two:.0f} ({two / one:.3f}x)",
                f">= {target}x", two / one >= target)
        if "ddp" in only:
            try:
                peer = ddp_images_per_s(32, args.iters, False, args.timeout)
                mine = f"ours {resnet2:.0f}" if resnet2 else "ours not run"
                add("ResNet-50 batch 32/GPU, 2 GPUs: ours vs PyTorch DDP", f"{mine} / DDP {peer:.0f}", ">= 1x",
                    None if resnet2 is None else resnet2 >= peer)
            except Exception as exc:
                add("ResNet-50 2 GPUs: PyTorch DDP", f"unavailable: {str(exc).splitlines()[0][:60]}", ">= 1x", None)
        if "lenet" in only:
            try:
                acc = lenet_accuracy(folder, args.lenet_iters, args.timeout)
                add(f"LeNet batch 64/GPU, 2 GPUs, {args.lenet_iters} iters: test accuracy", f"{100 * acc:.2f} %",
                    ">= 99.0 %", acc >= 0.99)
            except Exception as exc:
                add("LeNet 2 GPUs accuracy", f"failed: {str(exc).splitlines()[0][:60]}", ">= 99.0 %", False)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n| workload | value | target | verdict |\n| --- | --- | --- | --- |\n")
            f.writelines(f"| {' | '.join(r)} |\n" for r in rows)
    return 0 if all(r[3] != "NOT met" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
