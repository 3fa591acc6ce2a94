"""The Data layer alone at ImageNet shapes: images/s from raw and encoded-JPEG LMDBs, by worker count.

    python benchmarks/data.py [--gpu] [--records 1024] [--batch 256] [--size 256] [--crop 224]
                              [--workers 0,4,8,15] [--kinds raw,jpeg] [--seconds 3] [--no-torch]
                              [--no-host-decode]
                              [--train [--tf32 | --precision fp32,tf32,fp16,bf16] [--iters 10] [--timeline]
                                       [--no-nvjpeg]]

Writes two LMDBs into a temporary folder: ``--records`` synthetic ``--size`` x ``--size`` colour
images (smooth noise, so JPEG quality 90 gives ~23 kB a record, as ImageNet's resized images) as
raw uint8 Datums and as encoded JPEG Datums (``convert_imageset -encoded``). For each kind and worker
count (``data_param.workers``; 0 is the single prefetch thread) a TRAIN-phase Data layer with
``crop_size``, ``mirror`` and three ``mean_value`` fills its float32 tops batch after batch; after a
warm-up of a few batches the forwards of ``--seconds`` seconds (at least 3 batches) are timed, the
device synchronized at the end in GPU mode (where uint8 batches are transformed on the device).
Prints images/s per row. The ``jpeg`` rows run the layer as a user gets it (``gpu_decode`` unset:
in GPU mode with workers the workers decode while the forwards do not wait for them, and nvJPEG
takes over, on the layer's staging thread, once they do, where libnvjpeg loads; the path column
says which decoder ran). In GPU mode each JPEG row with workers is followed by a ``jpeg-host`` row: the same layer with
``gpu_decode: false`` (the workers decode with Pillow; ``--no-host-decode`` leaves these out). The
peers, when PyTorch is importable: a
``DataLoader`` with one worker per usable core decoding the same JPEG bytes with PIL, random 224
crop and flip, batches of uint8 tensors; in GPU mode also torchvision's nvJPEG batch decode
(``decode_jpeg(list, device="cuda")``) of the same records with a random crop and flip per image
into a uint8 batch on the device (``--no-torch`` leaves both out; torch is imported only then).

``--train``: instead, ResNet-50 training iterations (the model zoo's deploy file as a training net,
Solver SGD, random He-normal weights) fed by a Data layer from each LMDB (automatic workers; the
JPEG LMDB as a user gets it, and in GPU mode once more with ``gpu_decode: false``, the host decode,
and once with ``gpu_decode: true``, nvJPEG: ``--no-host-decode``, ``--no-nvjpeg`` leave them out) against
the same net fed by an Input layer of random values (synthetic input: what ``zoo.py`` times), with
``--tf32`` allowed or not, in each ``--precision`` in turn; the mean time of ``--iters`` iterations after ``--warmup`` ones, the
device synchronized at both ends. Neither net computes the data gradient (a Caffe training net does
not). ``--timeline`` (GPU) then runs ``--iters`` more under ``torch.profiler`` and gives each row's
device busy time (any stream) and idle time per iteration, the idle split by gap length: a starved
net idles in gaps, a data path that competes for the GPU adds busy time.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pycaffe_lite as caffe  # noqa: E402
from pycaffe_lite.data.db import LMDBWriter  # noqa: E402
from pycaffe_lite.data.workers import usable_cores  # noqa: E402
from pycaffe_lite.proto import caffe_pb2  # noqa: E402
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer  # noqa: E402


def synthetic_images(count: int, size: int, seed: int = 0):
    """``count`` (size, size, 3) uint8 RGB images: bicubic-upsampled 16x16 noise plus fine noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for _ in range(count):
        low = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
        img = np.asarray(Image.fromarray(low).resize((size, size), Image.BICUBIC)).astype(np.int16)
        yield np.clip(img + rng.integers(-12, 13, img.shape), 0, 255).astype(np.uint8)


def write_lmdbs(folder: Path, count: int, size: int) -> tuple[Path, Path, float]:
    """The raw and the JPEG LMDB of the same images; the JPEGs' mean size in bytes."""
    from PIL import Image

    raw, jpeg = folder / "raw_lmdb", folder / "jpeg_lmdb"
    sizes = []
    with LMDBWriter(raw, map_size=1 << 34) as wr, LMDBWriter(jpeg, map_size=1 << 32) as wj:
        for i, rgb in enumerate(synthetic_images(count, size)):
            key = b"%08d" % i
            bgr = np.ascontiguousarray(rgb[:, :, ::-1].transpose(2, 0, 1))
            wr.put(key, caffe_pb2.Datum(channels=3, height=size, width=size, data=bgr.tobytes(),
                                        label=i % 1000).SerializeToString())
            buf = io.BytesIO()
            Image.fromarray(rgb).save(buf, format="JPEG", quality=90)
            sizes.append(len(buf.getvalue()))
            wj.put(key, caffe_pb2.Datum(data=buf.getvalue(), encoded=True, label=i % 1000).SerializeToString())
    return raw, jpeg, float(np.mean(sizes))


def gpu_decode_field(gpu_decode: bool | None) -> str:
    """``data_param``'s ``gpu_decode`` as written in a prototxt (None: unset, the default)."""
    return "" if gpu_decode is None else f"gpu_decode: {str(gpu_decode).lower()} "


def layer_rate(source: Path, workers: int, batch: int, crop: int, seconds: float, gpu: bool,
               gpu_decode: bool | None = None) -> tuple[float, str]:
    """Images/s of a Data layer's forwards (after a warm-up), and how the batches travel
    (``gpu_decode``: ``data_param.gpu_decode``, None leaves it unset: the default)."""
    layer = make_layer(
        f'type: "Data" phase: TRAIN data_param {{ source: "{source}" batch_size: {batch} backend: LMDB '
        f"workers: {workers} prefetch: 4 {gpu_decode_field(gpu_decode)}}} transform_param {{ "
        f"crop_size: {crop} mirror: true mean_value: 104 mean_value: 117 mean_value: 123 }}", np.float32)
    top = empty_blobs(2, np.float32)
    layer.setup([], top)
    def sync() -> None:
        if gpu:
            from pycaffe_lite.gpu import backend

            backend.synchronize()

    try:
        for _ in range(48):  # (unset gpu_decode: past the layer's judgement of the host decode, 32 forwards)
            layer.forward([], top)
        sync()
        start, done = time.perf_counter(), 0
        while done < 3 or time.perf_counter() - start < seconds:
            layer.forward([], top)
            done += 1
        sync()
        rate = done * batch / (time.perf_counter() - start)
        return rate, path_of(layer._prefetcher, gpu)
    finally:
        layer.close()


def path_of(pre, gpu: bool) -> str:
    """How a Data layer's batches travel: the thread, or workers with a host or device transform
    (page-locked or not; nvJPEG decoding or not; how many batches were staged ahead)."""
    if not hasattr(pre, "raw"):
        return "thread"
    if not (pre.raw and gpu):
        return "workers, host transform"
    path = "workers, uint8 + device kernel" + (", page-locked" if pre._registered is not None else
                                                f", pageable ({pre.register_error})")
    adaptive = getattr(pre, "adaptive", False)
    if adaptive and not pre.loader.device_decode:
        path += ", host decode by the workers (they keep up: nvJPEG not needed)"
    elif pre.gpu_decode:
        path += f", nvJPEG ({pre.decoder.backend} backend)" if pre.decoder is not None else ", nvJPEG failed: host"
        if getattr(pre, "_stager", None) is not None:
            path += " on the staging thread"
        if adaptive:
            path += " (the workers' host decode fell behind)"
    return path + f", {pre.staged_ahead} staged ahead"


def torchvision_gpu_rate(source: Path, batch: int, crop: int, seconds: float) -> tuple[float, str] | None:
    """Images/s of torchvision's nvJPEG batch decode (``decode_jpeg(list, device="cuda")``) of the
    same JPEG records, then a random crop and flip per image into one uint8 batch on the device
    (the peer of ``gpu_decode``); None without torch, torchvision or a GPU."""
    try:
        import torch
        from torchvision import io as tvio
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    import lmdb

    env = lmdb.open(str(source), readonly=True, lock=False)
    with env.begin() as txn:
        records = [torch.frombuffer(bytearray(caffe_pb2.Datum.FromString(bytes(v)).data), dtype=torch.uint8)
                   for _, v in txn.cursor()]
    env.close()
    rng = np.random.default_rng(0)
    out = torch.empty((batch, 3, crop, crop), dtype=torch.uint8, device="cuda")

    def step(k: int) -> None:
        images = tvio.decode_jpeg([records[(k * batch + i) % len(records)] for i in range(batch)], device="cuda")
        for i, img in enumerate(images):
            y, x = int(rng.integers(img.shape[1] - crop + 1)), int(rng.integers(img.shape[2] - crop + 1))
            view = img[:, y:y + crop, x:x + crop]
            out[i] = view.flip(-1) if rng.integers(2) else view

    for k in range(3):
        step(k)
    torch.cuda.synchronize()
    start, done = time.perf_counter(), 0
    while done < 3 or time.perf_counter() - start < seconds:
        step(done)
        done += 1
    torch.cuda.synchronize()
    import torchvision

    return done * batch / (time.perf_counter() - start), f"torch {torch.__version__}, torchvision {torchvision.__version__}"


def torch_rate(source: Path, batch: int, crop: int, seconds: float) -> float | None:
    """Images/s of a PyTorch DataLoader (PIL decode, random crop + flip) over the JPEG records."""
    try:
        import torch
        from torch.utils.data import DataLoader, Dataset
    except ImportError:
        return None
    import lmdb
    from PIL import Image

    env = lmdb.open(str(source), readonly=True, lock=False)
    with env.begin() as txn:
        records = [bytes(v) for _, v in txn.cursor()]
    env.close()

    class Jpegs(Dataset):
        def __len__(self) -> int:
            return 1 << 30

        def __getitem__(self, i: int):
            datum = caffe_pb2.Datum.FromString(records[i % len(records)])
            img = Image.open(io.BytesIO(datum.data)).convert("RGB")
            w, h = img.size
            rng = np.random.default_rng(i)
            x, y = int(rng.integers(w - crop + 1)), int(rng.integers(h - crop + 1))
            img = img.crop((x, y, x + crop, y + crop))
            if rng.integers(2):
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            return torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy()), datum.label

    loader = DataLoader(Jpegs(), batch_size=batch, num_workers=usable_cores(), persistent_workers=True,
                        prefetch_factor=4)
    it = iter(loader)
    for _ in range(6):
        next(it)
    start, done = time.perf_counter(), 0
    while done < 3 or time.perf_counter() - start < seconds:
        next(it)
        done += 1
    rate = done * batch / (time.perf_counter() - start)
    del it, loader
    return rate


def train_ms(source: Path | None, batch: int, crop: int, iters: int, gpu: bool,
             gpu_decode: bool | None = None, warmup: int = 5, timeline: bool = False) -> tuple[float, str]:
    """Mean ms of a ResNet-50 training iteration fed from the LMDB ``source`` (None: synthetic input;
    ``gpu_decode``: ``data_param.gpu_decode``, None leaves it unset) after ``warmup`` untimed ones
    (autotune, capture, the first replays), and how the batches travel; ``timeline``: then as many
    iterations again under ``torch.profiler``, whose device busy and idle time the second part gives."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ours

    param = ours.zoo_param(Path(__file__).resolve().parents[1] / "examples" / "model_zoo" / "resnet50_deploy.prototxt",
                           batch, train=True)
    param.force_backward = False
    first = param.layer[0]
    if source is None:
        first.input_param.shape[0].dim[:] = [batch, 3, crop, crop]
    else:
        data = caffe_pb2.LayerParameter(name="data", type="Data", top=["data", "label"])
        data.data_param.source, data.data_param.batch_size = str(source), batch
        data.data_param.backend = caffe_pb2.DataParameter.LMDB
        if gpu_decode is not None:
            data.data_param.gpu_decode = gpu_decode
        data.transform_param.crop_size, data.transform_param.mirror = crop, True
        data.transform_param.mean_value.extend([104, 117, 123])
        first.CopyFrom(data)
    sp = caffe_pb2.SolverParameter(net_param=param, base_lr=0.001, momentum=0.9, lr_policy="fixed", max_iter=10**6,
                                   display=0, snapshot_after_train=False, random_seed=1)
    solver = caffe.get_solver(sp, progress=False)
    solver.stop_on_nonfinite_loss = False
    ours.randomize_params(solver.net)
    if source is None:
        rng = np.random.default_rng(0)
        solver.net.blobs["data"].data[...] = rng.normal(0, 50, solver.net.blobs["data"].shape)
        solver.net.blobs["label"].data[...] = rng.integers(0, 1000, batch)

    def sync() -> None:
        if gpu:
            from pycaffe_lite.gpu import backend

            backend.synchronize()

    try:
        solver.step(warmup)
        sync()
        stats = getattr(solver.net.layers[0], "data_stats", None)
        before = stats() if stats is not None else None
        start = time.perf_counter()
        solver.step(iters)
        sync()
        ms = (time.perf_counter() - start) / iters * 1e3
        reader = getattr(solver.net.layers[0], "_prefetcher", None)
        how = "synthetic" if source is None else path_of(reader, gpu)
        if before is not None and stats is not None:  # the forwards' wait for staged batches (host clock)
            batches, _, waited = (a - b for a, b in zip(stats(), before))
            how += f"; the forward waited {waited / max(batches, 1) * 1e3:.2f} ms/iter for batches"
        if timeline:
            from kernel_profile import device_intervals, idle_line
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                solver.step(iters)
                sync()
            how += "; " + idle_line(device_intervals(prof), iters)
        return ms, how
    finally:
        for layer in solver.net.layers:
            close = getattr(layer, "close", None)
            if close is not None:
                close()


def train_rows(args, raw: Path, jpeg: Path, precision: str | None) -> None:
    """The ``--train`` rows of one precision: synthetic input, each ``--kinds`` LMDB (JPEG: the
    default decode, and unless left out the host's and nvJPEG's), synthetic again, the shares."""
    if args.tf32:
        caffe.set_allow_tf32(True)
    if precision:
        caffe.set_precision(precision)
    what = precision or ("TF32" if args.tf32 else "fp32")
    timeline = args.timeline and args.gpu
    base, how = train_ms(None, args.batch, args.crop, args.iters, args.gpu, warmup=args.warmup, timeline=timeline)
    print(f"ResNet-50 training, batch {args.batch}, {what}: synthetic input "
          f"{base:.1f} ms ({args.batch / base * 1e3:.0f} img/s; {how})", flush=True)
    rows: list[tuple[str, float, str]] = []
    for kind in args.kinds.split(","):
        runs: list[tuple[str, bool | None]] = [(f"from the {kind} LMDB", None)]
        if kind == "jpeg" and args.gpu and not args.no_host_decode:
            runs.append(("from the jpeg LMDB, host decode (gpu_decode: false)", False))
        if kind == "jpeg" and args.gpu and not args.no_nvjpeg:
            runs.append(("from the jpeg LMDB, nvJPEG (gpu_decode: true)", True))
        for label, gpu_decode in runs:
            ms, path = train_ms(raw if kind == "raw" else jpeg, args.batch, args.crop, args.iters, args.gpu,
                                gpu_decode, warmup=args.warmup, timeline=timeline)
            rows.append((label, ms, path))
            print(f"  {label}: {ms:.1f} ms ({args.batch / ms * 1e3:.0f} img/s; {path})", flush=True)
    again, _ = train_ms(None, args.batch, args.crop, args.iters, args.gpu, warmup=args.warmup)
    base = min(base, again)  # the faster synthetic run is the reference (a warming GPU gives no credit)
    print(f"{what}: synthetic input again: {again:.1f} ms; against the faster, {base:.1f} ms:", flush=True)
    for label, ms, _ in rows:
        print(f"  {what} {label}: {base / ms * 100:.1f} % of the synthetic rate", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true", help="GPU mode (uint8 batches transformed on the device)")
    ap.add_argument("--records", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--workers", default="", help="comma-separated worker counts (default: 0, cores/2, cores-1)")
    ap.add_argument("--kinds", default="raw,jpeg")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--no-torch", action="store_true", help="leave out the PyTorch peers")
    ap.add_argument("--no-host-decode", action="store_true",
                    help="with --gpu: leave out the host-decode rows (jpeg-host: gpu_decode: false)")
    ap.add_argument("--train", action="store_true", help="time ResNet-50 training from the LMDBs and synthetic")
    ap.add_argument("--tf32", action="store_true", help="with --train: allow TF32")
    ap.add_argument("--precision", default=None,
                    help="with --train: caffe.set_precision, or several comma-separated (fp32, tf32, fp16, bf16), "
                         "one after the other in this process")
    ap.add_argument("--no-nvjpeg", action="store_true", help="with --train --gpu: leave out the gpu_decode: true row")
    ap.add_argument("--iters", type=int, default=10, help="with --train: timed iterations")
    ap.add_argument("--warmup", type=int, default=5, help="with --train: untimed iterations first")
    ap.add_argument("--timeline", action="store_true",
                    help="with --train and --gpu: each row's device busy and idle time per iteration (torch.profiler "
                         "over --iters more iterations; needs PyTorch)")
    args = ap.parse_args()
    cores = usable_cores()
    counts = [int(w) for w in args.workers.split(",")] if args.workers else sorted({0, max(1, cores // 2),
                                                                                     max(1, cores - 1)})
    if args.gpu:
        caffe.set_mode_gpu()
    print(f"usable cores {cores}; mode {'GPU' if args.gpu else 'CPU'}; batch {args.batch}, {args.size}x{args.size} "
          f"-> crop {args.crop}, mirror, mean values; {args.records} records", flush=True)
    with tempfile.TemporaryDirectory(prefix="pycaffe-lite-data-bench-") as tmp:
        t0 = time.perf_counter()
        raw, jpeg, jpeg_bytes = write_lmdbs(Path(tmp), args.records, args.size)
        print(f"LMDBs written in {time.perf_counter() - t0:.1f} s; JPEG records {jpeg_bytes / 1000:.1f} kB on average",
              flush=True)
        if args.train:
            for precision in (args.precision or "").split(","):
                train_rows(args, raw, jpeg, precision or None)
            return
        print(f"{'source':8} {'workers':>7} {'img/s':>10}  path")
        for kind in args.kinds.split(","):
            source = raw if kind == "raw" else jpeg
            for n in counts:
                rate, path = layer_rate(source, n, args.batch, args.crop, args.seconds, args.gpu)
                print(f"{kind:8} {n:7d} {rate:10.0f}  {path}", flush=True)
                if kind == "jpeg" and args.gpu and n > 0 and not args.no_host_decode:  # the host-decode row
                    rate, path = layer_rate(source, n, args.batch, args.crop, args.seconds, args.gpu, gpu_decode=False)
                    print(f"{'jpeg-host':9} {n:6d} {rate:10.0f}  {path}", flush=True)
        if not args.no_torch:
            rate = torch_rate(jpeg, args.batch, args.crop, args.seconds)
            if rate is not None:
                print(f"PyTorch DataLoader, {cores} workers, PIL decode + random crop + flip (jpeg): {rate:.0f} img/s",
                      flush=True)
            peer = torchvision_gpu_rate(jpeg, args.batch, args.crop, args.seconds) if args.gpu else None
            if peer is not None:
                print(f"torchvision nvJPEG decode_jpeg(device='cuda') + random crop + flip (jpeg): {peer[0]:.0f} img/s "
                      f"({peer[1]})", flush=True)


if __name__ == "__main__":
    main()
