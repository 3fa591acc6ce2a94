"""Data layer with worker processes: the same batches as the single prefetch thread (order, labels,
pixels, crop/mirror stream, rand_skip, resume, two ranks), the device kernel's pixels on the host,
clean errors and nothing left behind (processes, /dev/shm segments) after errors and kills."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import common
from pycaffe_lite.config import using_config
from pycaffe_lite.data import workers as data_workers
from pycaffe_lite.data.db import LMDBWriter
from pycaffe_lite.data.transformer import DataTransformer
from pycaffe_lite.errors import DataError
from pycaffe_lite.proto import caffe_pb2
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer

pytest.importorskip("lmdb")

N, C, H, W = 23, 3, 9, 8
TRANSFORM = "crop_size: 6 mirror: true mean_value: 10 mean_value: 20 mean_value: 30 scale: 0.25"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def raw_source(tmp_path_factory):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, size=(N, C, H, W), dtype=np.uint8)
    path = tmp_path_factory.mktemp("workers") / "raw"
    with LMDBWriter(path) as w:
        for i in range(N):
            d = caffe_pb2.Datum(channels=C, height=H, width=W, data=images[i].tobytes(), label=7 * i)
            w.put(b"%08d" % i, d.SerializeToString())
    return path


@pytest.fixture(scope="module")
def encoded_source(tmp_path_factory):
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(4)
    path = tmp_path_factory.mktemp("workers") / "jpeg"
    with LMDBWriter(path) as w:
        for i in range(N):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, size=(H, W, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=80)
            d = caffe_pb2.Datum(data=buf.getvalue(), encoded=True, label=i)
            w.put(b"%08d" % i, d.SerializeToString())
    return path


def layer_of(path, workers, batch=4, transform=TRANSFORM, extra="", dtype=np.float32, phase="TRAIN"):
    return make_layer(f'type: "Data" phase: {phase} data_param {{ source: "{path}" batch_size: {batch} '
                      f'backend: LMDB workers: {workers} {extra} }} transform_param {{ {transform} }}', dtype)


def batches(layer, count, seed=11, setup=True, between=None):
    """``count`` forwards: (data, labels, read_state after) each; ``between()`` after each."""
    top = empty_blobs(2, layer.dtype)
    if setup:
        caffe.set_random_seed(seed)
        layer.setup([], top)
    else:
        top = layer._test_top
    layer._test_top = top
    out = []
    for _ in range(count):
        layer.forward([], top)
        out.append((top[0].cpu_data().copy(), top[1].cpu_data().copy(), layer.read_state()))
        if between is not None:
            between()
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for k, ((da, la, sa), (db, lb, sb)) in enumerate(zip(a, b)):
        np.testing.assert_array_equal(la, lb, err_msg=f"batch {k} labels")
        np.testing.assert_array_equal(da, db, err_msg=f"batch {k} pixels")
        assert sa == sb, f"batch {k} read state"


def shm_segments() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_raw_batches_equal_the_single_thread_path(raw_source, dtype):
    extra = "rand_skip: 9"
    single = layer_of(raw_source, 0, extra=extra, dtype=dtype)
    parallel = layer_of(raw_source, 3, extra=extra, dtype=dtype)
    a, b = batches(single, 9), batches(parallel, 9)  # 36 records: wraps past the last
    assert_same(a, b)
    assert type(parallel._prefetcher).__name__ == "_ParallelPrefetcher"
    single.close()
    parallel.close()


def test_encoded_and_test_phase_batches_equal(encoded_source):
    for phase in ("TRAIN", "TEST"):
        a = batches(layer_of(encoded_source, 0, phase=phase), 7)
        b = batches(layer_of(encoded_source, 2, phase=phase), 7)
        assert_same(a, b)


def test_float_data_and_leveldb(tmp_path):
    rng = np.random.default_rng(5)
    values = rng.normal(size=(N, 2, 5, 5)).astype(np.float32)
    path = tmp_path / "float"
    with LMDBWriter(path) as w:
        for i in range(N):
            w.put(b"%04d" % i, caffe_pb2.Datum(channels=2, height=5, width=5, float_data=values[i].ravel(),
                                               label=i).SerializeToString())
    t = "crop_size: 3 mirror: true scale: 2"
    assert_same(batches(layer_of(path, 0, transform=t), 8), batches(layer_of(path, 2, transform=t), 8))
    plyvel = pytest.importorskip("plyvel")
    ldb = tmp_path / "leveldb"
    db = plyvel.DB(str(ldb), create_if_missing=True)
    for i in range(N):
        db.put(b"%04d" % i, caffe_pb2.Datum(channels=2, height=5, width=5, float_data=values[i].ravel(),
                                            label=i).SerializeToString())
    db.close()

    def leveldb_layer(workers):
        return make_layer(f'type: "Data" phase: TRAIN data_param {{ source: "{ldb}" batch_size: 4 backend: LEVELDB '
                          f"workers: {workers} }} transform_param {{ {t} }}", np.float32)

    a = batches(leveldb_layer(0), 8)
    b = batches(leveldb_layer(2), 8)
    assert_same(a, b)


def test_resume_reads_on_with_the_same_random_state(raw_source):
    reference = batches(layer_of(raw_source, 0), 8)
    first = layer_of(raw_source, 2)
    head = batches(first, 3)
    saved = first.read_state()
    first.close()
    resumed = layer_of(raw_source, 2)
    batches(resumed, 1, seed=99)  # another seed: the restored state must decide what follows
    resumed.restore_read_state(*saved)
    tail = batches(resumed, 5, setup=False)
    assert_same(reference, head + tail)
    resumed.close()


def test_two_ranks_read_interleaved_batches(raw_source):
    try:
        common.set_solver_count(2)
        per_rank = {}
        for rank in (0, 1):
            common.set_solver_rank(rank)
            per_rank[rank] = (batches(layer_of(raw_source, 0), 4), batches(layer_of(raw_source, 2), 4))
    finally:
        common.set_solver_count(1)
        common.set_solver_rank(0)
    for rank in (0, 1):
        assert_same(*per_rank[rank])
    labels0 = [lab for _, lab, _ in per_rank[0][1]]
    labels1 = [lab for _, lab, _ in per_rank[1][1]]
    np.testing.assert_array_equal(labels0[0], 7 * np.arange(4))
    np.testing.assert_array_equal(labels1[0], 7 * np.arange(4, 8))
    np.testing.assert_array_equal(labels0[1], 7 * np.arange(8, 12))


def test_worker_count_rules(monkeypatch, raw_source):
    with using_config(data_workers=None):
        assert data_workers.worker_count(3, heavy=False) == 3
        assert data_workers.worker_count(0, heavy=True) == 0
        assert data_workers.worker_count(-1, heavy=False) == 0  # small data keeps the prefetch thread
        monkeypatch.setattr(data_workers, "usable_cores", lambda: 6)
        assert data_workers.worker_count(-1, heavy=True) == 5
        monkeypatch.setattr(data_workers, "usable_cores", lambda: 1)
        assert data_workers.worker_count(-1, heavy=True) == 0
    with using_config(data_workers=2):
        assert data_workers.worker_count(0, heavy=False) == 2  # the environment overrides the prototxt
    assert 1 <= data_workers.usable_cores() <= (os.cpu_count() or 1)
    small = layer_of(raw_source, -1, batch=2)  # 2 x 216 bytes: automatic mode keeps the thread
    with using_config(data_workers=None):
        small.setup([], empty_blobs(2))
    assert type(small._prefetcher).__name__ == "_Prefetcher"
    small.close()


def test_cgroup_quota_caps_the_cores(monkeypatch, tmp_path):
    real_read = Path.read_text
    files = {"/proc/self/cgroup": "0::/job\n", "/sys/fs/cgroup/job/cpu.max": "250000 100000\n",
             "/sys/fs/cgroup/cpu.max": "max 100000\n"}

    def fake_read(self, *args, **kwargs):
        if str(self) in files:
            return files[str(self)]
        if str(self).startswith(("/sys/fs/cgroup", "/proc/self/cgroup")):
            raise FileNotFoundError(str(self))
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", fake_read)
    assert data_workers._cgroup_cpu_limit() == 2.5
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert data_workers.usable_cores() == 3


def test_corrupt_record_names_the_key_and_leaves_nothing(tmp_path):
    path = tmp_path / "bad"
    good = caffe_pb2.Datum(channels=1, height=4, width=4, data=bytes(16), label=1).SerializeToString()
    with LMDBWriter(path) as w:
        for i in range(12):
            w.put(b"%04d" % i, b"\xff\x03junk" if i == 6 else good)
    layer = layer_of(path, 2, transform="")
    top = empty_blobs(2)
    layer.setup([], top)
    pids = [p.pid for p in layer._prefetcher.loader.pool.procs]
    name = layer._prefetcher.loader.batches.name
    assert name in shm_segments()
    layer.forward([], top)  # records 0-3
    with pytest.raises(DataError, match=r"layer 'data' \(Data\): .*bad: record b'0006' is not a Datum"):
        layer.forward([], top)
    with pytest.raises(DataError, match="b'0006'"):  # and on, until the layer is closed
        layer.forward([], top)
    layer.close()
    assert name not in shm_segments()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_a_killed_worker_is_reported_and_cleaned_up(raw_source):
    layer = layer_of(raw_source, 2)
    top = empty_blobs(2)
    layer.setup([], top)
    layer.forward([], top)
    loader = layer._prefetcher.loader
    procs, name = list(loader.pool.procs), loader.batches.name
    os.kill(procs[1].pid, signal.SIGKILL)
    with pytest.raises(DataError, match=rf"data worker process {procs[1].pid} killed by SIGKILL"):
        for _ in range(20):  # batches decoded before the kill may still come
            layer.forward([], top)
    assert procs[0].is_alive()  # (the others run until the layer closes)
    layer.close()
    assert name not in shm_segments()
    assert not [p for p in procs if p.is_alive()]


KILLED_RUN = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # (a shell's background job starts with SIGINT ignored)
import numpy as np
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer
layer = make_layer('type: "Data" phase: TRAIN data_param {{ source: "{path}" batch_size: 4 backend: LMDB '
                   'workers: 2 }} transform_param {{ crop_size: 6 mirror: true }}', np.float32)
top = empty_blobs(2)
layer.setup([], top)
layer.forward([], top)
loader = layer._prefetcher.loader
print(loader.batches.name, *[p.pid for p in loader.pool.procs], flush=True)
while True:
    layer.forward([], top)
    time.sleep(0.01)
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_a_killed_run_leaves_no_processes_or_shared_memory(raw_source, tmp_path, sig):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(KILLED_RUN.format(path=raw_source)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, text=True)
    try:
        line = proc.stdout.readline().split()
        assert line, proc.stderr.read()
        name, pids = line[0], [int(p) for p in line[1:]]
        assert name in shm_segments()
        proc.send_signal(sig)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)]
        if not alive and name not in shm_segments():
            break
        time.sleep(0.1)
    assert not alive, f"worker processes {alive} outlived the run ({signal.Signals(sig).name})"
    assert name not in shm_segments(), f"/dev/shm/{name} outlived the run ({signal.Signals(sig).name})"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mean", ["mean_value", "mean_file", "none"])
def test_device_kernel_gives_the_host_pixels(tmp_path, dtype, mean):
    """transform.cu built for the host: each item crop/mean/scale/mirror equals DataTransformer.apply."""
    from pycaffe_lite.testing import host_kernels as hk

    if hk.CXX is None:
        pytest.skip("no C++ compiler for the host build of transform.cu")
    rng = np.random.default_rng(8)
    num, c, h, w, crop = 5, 3, 11, 9, 7
    items = rng.integers(0, 256, size=(num, c, h, w), dtype=np.uint8)
    text = f"crop_size: {crop} mirror: true scale: 0.0078125"
    if mean == "mean_value":
        text += " mean_value: 104.5 mean_value: 117 mean_value: 123.25"
    elif mean == "mean_file":
        blob = caffe_pb2.BlobProto(num=1, channels=c, height=h, width=w,
                                   data=rng.uniform(0, 255, size=c * h * w).astype(np.float32))
        (tmp_path / "mean.binaryproto").write_bytes(blob.SerializeToString())
        text += f' mean_file: "{tmp_path / "mean.binaryproto"}"'
    tp = parse_text(text, caffe_pb2.TransformationParameter())
    t = DataTransformer(tp, caffe.TRAIN, dtype, rng=np.random.default_rng(1))
    draws = np.array([t.draw((c, h, w)) for _ in range(num)], np.int32)
    expected = np.stack([t.apply(items[i], *draws[i]) for i in range(num)])
    mean_kind, mean_arr = 0, np.zeros(1, dtype)
    if t.mean is not None:
        full = t._mean_for(t.mean, (c, h, w))
        mean_kind, mean_arr = (2, np.ascontiguousarray(full, dtype)) if mean == "mean_file" else \
            (1, np.ascontiguousarray(full[:, 0, 0], dtype))
    lib, sigs = hk.serial_library(REPO / "pycaffe_lite" / "data" / "transform.cu", dtype)
    out = np.full((num, c, crop, crop), np.nan, dtype)
    args = [out.size, items.ctypes.data, draws.ctypes.data, mean_arr.ctypes.data, mean_kind, 1, float(tp.scale),
            c, h, w, crop, crop, out.ctypes.data]
    sig = sigs["data_transform_u8"]
    getattr(lib, sig.name)(*hk.kernel_args(sig, args, dtype))
    np.testing.assert_array_equal(out, expected)
    assert draws[:, 2].any() and not draws[:, 2].all()  # both flips taken


@pytest.mark.gpu
def test_gpu_uint8_path_gives_the_host_pixels(raw_source, encoded_source, gpu_mode):
    """GPU mode: uint8 batches transformed by transform.cu equal the single-thread host path (the
    JPEGs decoded by the workers: ``gpu_decode: false``; nvJPEG's pixels are test_nvjpeg.py's)."""
    for source in (raw_source, encoded_source):
        caffe.set_mode_cpu()
        a = batches(layer_of(source, 0), 7)
        caffe.set_mode_gpu()
        layer = layer_of(source, 2, extra="gpu_decode: false")
        b = batches(layer, 7)
        assert layer._prefetcher.raw
        assert_same(a, b)
        layer.close()


def test_records_of_different_shapes(tmp_path, monkeypatch, caplog):
    """Automatic workers go back to the prefetch thread at the first odd record (same batches);
    chosen workers raise naming it."""
    rng = np.random.default_rng(9)
    path = tmp_path / "mixed"
    shapes = [(3, 8, 8)] * 5 + [(3, 9, 7)] + [(3, 8, 8)] * 4
    with LMDBWriter(path) as w:
        for i, shape in enumerate(shapes):
            img = rng.integers(0, 256, size=shape, dtype=np.uint8)
            w.put(b"%02d" % i, caffe_pb2.Datum(channels=shape[0], height=shape[1], width=shape[2],
                                               data=img.tobytes(), label=i).SerializeToString())
    t = "crop_size: 5 mirror: true"
    reference = batches(layer_of(path, 0, batch=1, transform=t), 14)
    monkeypatch.setattr(data_workers, "HEAVY_BATCH_BYTES", 1)
    monkeypatch.setattr(data_workers, "usable_cores", lambda: 3)
    with using_config(data_workers=None):
        auto = layer_of(path, -1, batch=1, transform=t)
        got = batches(auto, 14)
        assert type(auto._prefetcher).__name__ == "_Prefetcher"  # went back at record 5
    assert "record b'05' has shape (3, 9, 7)" in caplog.text and "back to the prefetch thread" in caplog.text
    assert_same(reference, got)
    auto.close()
    chosen = layer_of(path, 2, batch=1, transform=t)
    with pytest.raises(data_workers.ItemShapeError, match=r"record b'05' has shape \(3, 9, 7\).*\(3, 8, 8\)"):
        batches(chosen, 14)
    chosen.close()


@pytest.fixture(scope="module")
def image_list(tmp_path_factory):
    """7 PNG/JPEG files of different sizes and a list file naming them (one line twice)."""
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(12)
    folder = tmp_path_factory.mktemp("images")
    lines = []
    for i in range(7):
        h, w = 10 + i, 14 - i
        name = f"img {i}.{'png' if i % 2 else 'jpg'}"
        Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(folder / name)
        lines.append(f"{name} {i}")
    lines.append(lines[2])
    (folder / "list.txt").write_text("\n".join(lines) + "\n")
    return folder


def image_layer(folder, workers, shuffle=True, extra=""):
    return make_layer(
        f'type: "ImageData" phase: TRAIN image_data_param {{ source: "{folder / "list.txt"}" '
        f'root_folder: "{folder}/" batch_size: 3 shuffle: {str(shuffle).lower()} new_height: 9 new_width: 8 '
        f"workers: {workers} {extra} }} transform_param {{ crop_size: 6 mirror: true mean_value: 5 scale: 0.5 }}",
        np.float32)


def test_image_data_workers_equal_the_single_thread_path(image_list):
    def dropout_like():  # another user of the process-wide generator between forwards
        common.rng().random(5)

    for shuffle in (True, False):
        a = batches(image_layer(image_list, 0, shuffle), 9, between=dropout_like)  # 27 images: 3 passes over 8
        layer = image_layer(image_list, 2, shuffle)
        b = batches(layer, 9, between=dropout_like)
        assert layer._parallel is not None
        assert_same(a, b)
        layer.close()


def test_image_data_workers_resume(image_list):
    reference = batches(image_layer(image_list, 0), 8)
    first = image_layer(image_list, 2)
    head = batches(first, 3)
    saved = first.read_state()
    generator = common.rng().bit_generator.state  # (a snapshot keeps it: later reshuffles draw from it)
    first.close()
    resumed = image_layer(image_list, 2)
    batches(resumed, 2, seed=5)
    resumed.restore_read_state(*saved)
    common.rng().bit_generator.state = generator
    tail = batches(resumed, 5, setup=False)
    assert resumed._parallel is not None
    assert_same(reference, head + tail)
    resumed.close()


def test_image_data_worker_error_names_the_file_and_line(image_list, tmp_path):
    lines = (image_list / "list.txt").read_text().splitlines()
    (tmp_path / "list.txt").write_text("\n".join([*lines[:4], "missing.png 1", *lines[4:]]) + "\n")
    for name in os.listdir(image_list):
        if name != "list.txt":
            (tmp_path / name).write_bytes((image_list / name).read_bytes())
    layer = image_layer(tmp_path, 2, shuffle=False)
    top = empty_blobs(2)
    caffe.set_random_seed(1)
    layer.setup([], top)
    assert layer._parallel is not None and layer._parallel.loader is not None
    procs, name = list(layer._parallel.loader.pool.procs), layer._parallel.loader.batches.name
    layer.forward([], top)
    with pytest.raises(DataError, match=r"image file .*missing.png not found \(.*list.txt line 5\)"):
        layer.forward([], top)
    layer.close()
    assert name not in shm_segments()
    assert not [p for p in procs if p.is_alive()]


def test_uint8_batches_transformed_on_the_host_when_run_on_the_cpu(raw_source, encoded_source):
    """Uint8 batches (what GPU mode keeps for the device kernel) forwarded on the CPU are
    transformed with the parent's draws on the host: the single-thread batches."""
    for source in (raw_source, encoded_source):
        a = batches(layer_of(source, 0), 7)
        layer = layer_of(source, 2)
        b = batches(layer, 2)
        layer._prefetcher.raw = True  # restarting keeps the kind: uint8 batches from here on
        layer.restore_read_state(*layer.read_state())
        assert layer._prefetcher.raw and layer._prefetcher.loader.batches.layout.item_dtype == "|u1"
        assert_same(a, b + batches(layer, 5, setup=False))
        layer.close()


@pytest.mark.gpu
def test_gpu_image_data_uint8_path_gives_the_host_pixels(image_list, gpu_mode):
    caffe.set_mode_cpu()
    a = batches(image_layer(image_list, 0), 7)
    caffe.set_mode_gpu()
    layer = image_layer(image_list, 2)
    b = batches(layer, 7)
    assert layer._parallel is not None and layer._parallel.raw
    assert_same(a, b)
    layer.close()


def test_too_little_shared_memory(raw_source, monkeypatch, caplog):
    """Automatic workers fall back to the prefetch thread; chosen workers raise, naming /dev/shm."""
    class Tiny:
        f_bavail, f_frsize = 1, 4096

    monkeypatch.setattr(data_workers.os, "statvfs", lambda path: Tiny())
    monkeypatch.setattr(data_workers, "HEAVY_BATCH_BYTES", 1)
    monkeypatch.setattr(data_workers, "usable_cores", lambda: 3)
    with using_config(data_workers=None):
        auto = layer_of(raw_source, -1)
        assert_same(batches(layer_of(raw_source, 0), 3), batches(auto, 3))
    assert type(auto._prefetcher).__name__ == "_Prefetcher"
    assert "/dev/shm has 0 MiB free" in caplog.text and "reading with the prefetch thread" in caplog.text
    auto.close()
    with pytest.raises(DataError, match=r"layer 'data' \(Data\): the data workers' 4 batches need .* MiB of "
                                        r"shared memory, /dev/shm has 0 MiB free"):
        layer_of(raw_source, 2).setup([], empty_blobs(2))


SOLVER_NET = """
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN }
  data_param { source: "%(db)s" batch_size: 7 backend: LMDB }
  transform_param { scale: 0.00390625 mirror: true crop_size: 24 } }
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TEST }
  data_param { source: "%(db)s" batch_size: 5 backend: LMDB }
  transform_param { scale: 0.00390625 crop_size: 24 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.mark.slow
def test_training_with_workers_resumes_bit_for_bit(tmp_path):
    """Solver runs: the single thread for 13 iterations against workers (PYCAFFE_LITE_DATA_WORKERS)
    for 6, a snapshot, and 7 more from it: the same weights."""
    from pycaffe_lite.data import mnist
    from pycaffe_lite.solvers.sgd_solvers import get_solver

    images, labels = mnist.load_split(mnist.SHIPPED_DIR, "test")
    mnist.write_lmdb(images[:45], labels[:45], tmp_path / "db")

    def solver(folder, max_iter, snap=0):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "net.prototxt").write_text(SOLVER_NET % {"db": tmp_path / "db"})
        sp = caffe_pb2.SolverParameter(net=str(folder / "net.prototxt"), base_lr=0.05, momentum=0.9,
                                       lr_policy="fixed", max_iter=max_iter, snapshot=snap,
                                       snapshot_prefix=str(folder / "t"), test_interval=4, random_seed=11,
                                       display=0)
        sp.test_iter.append(3)
        return get_solver(sp, progress=False)

    def close(s):
        for net in (s.net, *s.test_nets):
            for layer in net.layers:
                if hasattr(layer, "close"):
                    layer.close()

    a = solver(tmp_path / "a", 13)
    a.solve()
    want = {k: [b.data.copy() for b in v] for k, v in a.net.params.items()}
    close(a)
    with using_config(data_workers=2):
        b = solver(tmp_path / "b", 6, snap=6)
        assert type(b.net.layers[0]._prefetcher).__name__ == "_ParallelPrefetcher"
        b.solve()
        close(b)
        c = solver(tmp_path / "b", 13)
        c.solve(str(tmp_path / "b" / "t_iter_6.solverstate"))
    for name, blobs in want.items():
        for w, got in zip(blobs, c.net.params[name]):
            np.testing.assert_array_equal(got.data, w)
    close(c)


def test_window_data_workers_equal_the_single_thread_path(tmp_path):
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(2)
    lines = []
    for i, (h, w) in enumerate([(20, 24), (16, 18), (22, 15)]):
        path = tmp_path / f"w{i}.png"
        cv2.imwrite(str(path), rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        windows = [(1 + i, 0.8, 1, 2, w - 3, h - 4), (0, 0.1, 0, 0, w // 2, h // 2), (2, 0.9, 3, 1, w - 1, h - 1)]
        lines += [f"# {i}", str(path), f"3 {h} {w}", str(len(windows))] + [" ".join(map(str, x)) for x in windows]
    (tmp_path / "windows.txt").write_text("\n".join(lines) + "\n")

    def window_layer(workers, source="windows.txt"):
        return make_layer(
            f'type: "WindowData" transform_param {{ crop_size: 10 mirror: true mean_value: 9 }} window_data_param '
            f'{{ source: "{tmp_path / source}" batch_size: 8 fg_fraction: 0.25 context_pad: 2 scale: 0.5 '
            f"workers: {workers} }}", np.float32)

    def window_batches(layer, count):
        caffe.set_random_seed(4)
        top = empty_blobs(2)
        layer.setup([], top)
        out = []
        for _ in range(count):
            layer.forward([], top)
            out.append((top[0].cpu_data().copy(), top[1].cpu_data().copy(), None))
        return out

    parallel = window_layer(2)
    assert_same(window_batches(window_layer(0), 6), window_batches(parallel, 6))
    assert parallel._parallel is not None
    parallel.close()
    (tmp_path / "missing.txt").write_text("\n".join(lines).replace(str(tmp_path / "w1.png"), "/nonexistent.png") + "\n")
    broken = window_layer(2, "missing.txt")
    with pytest.raises(DataError, match=r"image file /nonexistent.png not found"):
        window_batches(broken, 6)
    broken.close()


def test_annotated_data_workers_equal_the_single_thread_path(tmp_path):
    """SSD augmentation (distortion, expansion, batch samplers, resize, mirror) through workers:
    the single-thread batches and label rows; a corrupt record is named."""
    from pycaffe_lite.commands import convert_annoset

    rng = np.random.default_rng(6)
    items = []
    for i in range(7):
        boxes = [(1 + i % 2, 4.0, 2.0, 16.0, 12.0), (3, 20.0, 10.0, 30.0, 22.0, 1)]
        items.append((f"img{i}.png", rng.integers(0, 256, (24, 32, 3), dtype=np.uint8), boxes[: 1 + i % 2]))
    assert convert_annoset.write_annoset(tmp_path / "anno", items) == 7
    aug = ("mean_value: 104 mean_value: 117 mean_value: 123 mirror: true "
           "resize_param { prob: 1 resize_mode: WARP height: 20 width: 20 interp_mode: LINEAR interp_mode: NEAREST } "
           "emit_constraint { emit_type: CENTER } "
           "distort_param { brightness_prob: 0.5 brightness_delta: 32 contrast_prob: 0.5 contrast_lower: 0.5 "
           "contrast_upper: 1.5 hue_prob: 0.5 hue_delta: 18 saturation_prob: 0.5 saturation_lower: 0.5 "
           "saturation_upper: 1.5 random_order_prob: 0.2 } expand_param { prob: 0.5 max_expand_ratio: 2 }")
    samplers = ("batch_sampler { max_sample: 1 max_trials: 1 } "
                "batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 max_aspect_ratio: 2 } "
                "sample_constraint { min_jaccard_overlap: 0.3 } max_sample: 1 max_trials: 50 }")

    def anno_layer(workers, source="anno"):
        return make_layer(f"type: 'AnnotatedData' data_param {{ source: '{tmp_path / source}' batch_size: 3 "
                          f"backend: LMDB workers: {workers} }} transform_param {{ {aug} }} "
                          f"annotated_data_param {{ {samplers} }}", np.float32)

    def anno_batches(layer, count):
        caffe.set_random_seed(8)
        top = empty_blobs(2, np.float32)
        layer.setup([], top)
        out = []
        for _ in range(count):
            layer.forward([], top)
            out.append((top[0].cpu_data().copy(), top[1].cpu_data().copy(), None))
        return out

    parallel = anno_layer(2)
    a, b = anno_batches(anno_layer(0), 5), anno_batches(parallel, 5)  # 15 items: wraps twice
    assert parallel._parallel is not None
    for (da, la, _), (db, lb, _) in zip(a, b):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(da, db)
    parallel.close()
    from pycaffe_lite.data.db import open_cursor

    with open_cursor(tmp_path / "anno", "lmdb") as cursor:
        records = []
        for _ in range(len(cursor)):
            records.append((bytes(cursor.key()), bytes(cursor.value())))
            cursor.next()
    with LMDBWriter(tmp_path / "bad") as w:
        for k, (key, value) in enumerate(records):
            w.put(key, b"\xff\x03junk" if k == 4 else value)
    broken = anno_layer(2, "bad")
    with pytest.raises(DataError, match=rf"bad: record {records[4][0]!r} is not an AnnotatedDatum"):
        anno_batches(broken, 3)
    broken.close()


def test_forking_while_another_reader_of_the_database_runs(raw_source):
    """Workers forked while another layer's thread reads the same LMDB start and read (a fork in
    the middle of a py-lmdb operation left the child's environment unclosable: a hang)."""
    import threading

    busy = layer_of(raw_source, 0, batch=1)
    top = empty_blobs(2)
    busy.setup([], top)
    stop = threading.Event()

    def consume():
        while not stop.is_set():
            busy.forward([], top)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    try:
        for _ in range(12):
            layer = layer_of(raw_source, 2, batch=2)
            out = empty_blobs(2)
            layer.setup([], out)
            layer.forward([], out)
            layer.close()
    finally:
        stop.set()
        reader.join()
        busy.close()
