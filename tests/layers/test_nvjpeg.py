"""GPU decode of JPEG Datums (``data/nvjpeg.py``) and the double-buffered device staging of the
data workers' batches (``data/parallel.py``).

CPU: the library lookup, the JPEG header reader and the routing rules, the workers' encoded
items, and the whole staging path on an emulated device (host memory for device memory, the host
build of ``transform.cu``, an nvJPEG stand-in decoding with Pillow): the batches equal the
single-thread path's, bit for bit. GPU (``-m gpu``): nvJPEG's pixels against Pillow's within the
stated tolerance, the same labels and crop/mirror stream, through a replayed training iteration.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import common, memcheck
from pycaffe_lite.config import using_config
from pycaffe_lite.data import nvjpeg
from pycaffe_lite.data import parallel as data_parallel
from pycaffe_lite.data import workers as data_workers
from pycaffe_lite.data.db import LMDBWriter
from pycaffe_lite.data.transformer import decode_image
from pycaffe_lite.proto import caffe_pb2
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("lmdb")

REPO = Path(__file__).resolve().parents[2]
N, H, W = 21, 24, 32
TRANSFORM = "crop_size: 16 mirror: true mean_value: 104 mean_value: 117 mean_value: 123 scale: 0.5"


def smooth_image(rng: np.random.Generator, h: int = H, w: int = W) -> np.ndarray:
    """An RGB ``(h, w, 3)`` uint8 image of gradients and low-frequency waves (crop offsets and
    flips show; little high-frequency chroma, where decoders' upsampling differs most)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    a, b, c = rng.uniform(0, 2 * np.pi, 3)
    r = 128 + 100 * np.sin(x / w * 3 + a) * np.cos(y / h * 2 + b)
    g = 40 + 180 * x / w
    bl = 200 - 150 * y / h + 20 * np.sin(x / 5 + c)
    return np.clip(np.stack([r, g, bl], -1), 0, 255).astype(np.uint8)


def jpeg(img: np.ndarray, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", **save)
    return buf.getvalue()


def write_lmdb(path: Path, encode, count: int = N, seed: int = 6) -> Path:
    rng = np.random.default_rng(seed)
    with LMDBWriter(path) as w:
        for i in range(count):
            d = caffe_pb2.Datum(data=encode(i, smooth_image(rng)), encoded=True, label=3 * i + 1)
            w.put(b"%08d" % i, d.SerializeToString())
    return path


def mixed(i: int, img: np.ndarray) -> bytes:
    """Mostly baseline 4:2:0; every 5th progressive (decoded by the workers), every 7th 4:4:4."""
    if i % 5 == 4:
        return jpeg(img, quality=90, progressive=True)
    return jpeg(img, quality=90, subsampling=0 if i % 7 == 3 else 2)


@pytest.fixture(scope="module")
def mixed_source(tmp_path_factory):
    return write_lmdb(tmp_path_factory.mktemp("nvjpeg") / "mixed", mixed)


def layer_of(path, workers, batch=4, gpu_decode: bool | None = False, transform=TRANSFORM, dtype=np.float32):
    """A TRAIN Data layer on ``path``; ``gpu_decode`` None leaves the field unset (the default)."""
    field = "" if gpu_decode is None else f"gpu_decode: {str(gpu_decode).lower()} "
    return make_layer(f'type: "Data" phase: TRAIN data_param {{ source: "{path}" batch_size: {batch} '
                      f'backend: LMDB workers: {workers} {field}prefetch: 4 }} '
                      f'transform_param {{ {transform} }}', dtype)


# -- the pure parts ----------------------------------------------------------------------------------
def test_candidates_look_in_the_wheels_the_toolkit_and_the_loader_path(tmp_path):
    wheel = tmp_path / "site" / "nvidia" / "nvjpeg" / "lib"
    wheel.mkdir(parents=True)
    for name in ("libnvjpeg.so.12", "libnvjpeg.so.13"):
        (wheel / name).write_bytes(b"")
    toolkit = tmp_path / "cuda" / "lib64"
    toolkit.mkdir(parents=True)
    (toolkit / "libnvjpeg.so.13").write_bytes(b"")
    bundled = tmp_path / "site" / "torchvision.libs"
    bundled.mkdir()
    (bundled / "libnvjpeg.1a2b3c4d.so.12").write_bytes(b"")
    found = nvjpeg.candidates({"CUDA_HOME": str(tmp_path / "cuda")}, [str(tmp_path / "site")])
    assert found[-1] == str(bundled / "libnvjpeg.1a2b3c4d.so.12")
    assert found[:3] == [str(toolkit / "libnvjpeg.so.13"), str(wheel / "libnvjpeg.so.13"), str(wheel / "libnvjpeg.so.12")]
    assert found.index("libnvjpeg.so.13") < found.index("libnvjpeg.so.12") < found.index("libnvjpeg.so")
    assert len(found) == len(set(found))


def test_a_missing_library_is_a_clear_error(tmp_path):
    with pytest.raises(nvjpeg.NvJpegError, match=r"nvJPEG \(libnvjpeg\) not found.*nowhere/libnvjpeg.so.13"):
        nvjpeg.load_library([str(tmp_path / "nowhere" / "libnvjpeg.so.13")])


def test_the_library_binds_where_it_is_installed():
    """Where a libnvjpeg is found (the device machine; the nvidia-nvjpeg wheel), every function
    used here exists in it with the argument types set."""
    try:
        lib, path = nvjpeg.load_library()
    except nvjpeg.NvJpegError as exc:
        pytest.skip(f"no libnvjpeg here: {exc}")
    nvjpeg._bind(lib)
    for name in ("nvjpegCreateEx", "nvjpegDestroy", "nvjpegJpegStateCreate", "nvjpegJpegStateDestroy",
                 "nvjpegDecodeBatchedInitialize", "nvjpegDecodeBatched"):
        assert getattr(lib, name).restype is ctypes.c_int, (path, name)
    assert ctypes.sizeof(nvjpeg._Image) == 2 * nvjpeg.MAX_COMPONENT * 8  # nvjpegImage_t: 4 pointers, 4 size_t


@pytest.mark.parametrize(("save", "mode", "expected"), [
    ({"quality": 90, "subsampling": 2}, "RGB", ((2, 2), True)),
    ({"quality": 90, "subsampling": 1}, "RGB", ((2, 1), True)),
    ({"quality": 90, "subsampling": 0}, "RGB", ((1, 1), True)),
    ({"quality": 90, "progressive": True}, "RGB", ((2, 2), False)),
    ({"quality": 90}, "L", (None, True)),
    ({"quality": 90}, "CMYK", (None, False)),
])
def test_headers_and_what_goes_to_the_device(save, mode, expected):
    img = Image.fromarray(smooth_image(np.random.default_rng(1))).convert(mode)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", **save)
    header = nvjpeg.jpeg_header(buf.getvalue())
    assert header is not None and (header.height, header.width, header.precision) == (H, W, 8)
    luma, decodable = expected
    channels = 1 if mode == "L" else 3
    assert len(header.components) == {"L": 1, "RGB": 3, "CMYK": 4}[mode]
    if luma is not None:
        assert header.components[0][1:] == luma
    assert (header.sof == nvjpeg.BASELINE) == (not save.get("progressive"))
    assert nvjpeg.gpu_decodable(header, (channels, H, W)) is decodable
    assert not nvjpeg.gpu_decodable(header, (channels, H + 1, W))  # not the batch's size
    if mode == "RGB":
        assert not nvjpeg.gpu_decodable(header, (1, H, W))  # colour into one channel: the host converts
        assert not nvjpeg.gpu_decodable(header, (3, H, W), force_gray=True)
    if mode == "L":
        assert not nvjpeg.gpu_decodable(header, (1, H, W), force_color=True)


def test_header_reader_refuses_what_is_no_jpeg():
    png = io.BytesIO()
    Image.fromarray(smooth_image(np.random.default_rng(2))).save(png, format="PNG")
    good = jpeg(smooth_image(np.random.default_rng(2)))
    assert nvjpeg.jpeg_header(png.getvalue()) is None
    assert nvjpeg.jpeg_header(b"") is None
    assert nvjpeg.jpeg_header(good[:30]) is None  # cut inside the headers
    assert nvjpeg.jpeg_header(memoryview(good)) == nvjpeg.jpeg_header(good)
    # an Adobe APP14 segment saying "no colour transform" (RGB stored as is): the host decodes
    adobe = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"
    header = nvjpeg.jpeg_header(good[:2] + adobe + good[2:])
    assert header is not None and header.adobe_transform == 0
    assert not nvjpeg.gpu_decodable(header, (3, H, W))


def test_worker_answers_planes_and_formats():
    assert nvjpeg.encoded_items(None) == [] and nvjpeg.item_keys(None) == []
    assert nvjpeg.encoded_items([None, (120, b"k1"), None, (7, b"k3")]) == [(1, 120), (3, 7)]
    assert nvjpeg.item_keys([None, (120, b"k1"), None, (7, b"k3")]) == [None, b"k1", None, b"k3"]
    assert nvjpeg.plane_pointers(1000, 2, (3, 4, 5)) == [1000 + 2 * 60, 1000 + 2 * 60 + 20, 1000 + 2 * 60 + 40]
    assert nvjpeg.output_format(3) == nvjpeg.OUTPUT_BGR and nvjpeg.output_format(1) == nvjpeg.OUTPUT_Y
    with pytest.raises(nvjpeg.NvJpegError, match="1 or 3 channels, not 4"):
        nvjpeg.output_format(4)
    assert nvjpeg.status_name(4) == "NVJPEG_STATUS_JPEG_NOT_SUPPORTED"


def test_image_array_holds_each_items_planes_and_pitch():
    """The nvjpegImage_t array the decode passes: per item its planes' addresses and the pitch for
    the used channels, zeros for the others (as filled field by field)."""
    for channels in (1, 3):
        planes = [nvjpeg.plane_pointers(1 << 40, k, (channels, 5, 7)) for k in range(4)]
        images = nvjpeg.image_array(planes, 7)
        assert len(images) == 4
        for k in range(4):
            assert list(images[k].channel)[:channels] == planes[k]
            assert list(images[k].pitch) == [7] * channels + [0] * (nvjpeg.MAX_COMPONENT - channels)
            assert not any(images[k].channel[channels:])
    assert len(nvjpeg.image_array([], 7)) == 0


def test_leave_encoded_writes_the_bytes_and_label_or_declines():
    layout = data_workers.BatchLayout(2, (3, H, W), np.dtype(np.uint8).str)
    batches = data_workers.SharedBatches(2, layout)
    try:
        img = smooth_image(np.random.default_rng(3))
        good = jpeg(img, quality=80)
        n = data_parallel.leave_encoded(batches, 1, 0, good, 5.0, (3, H, W), False, False)
        assert n == len(good)
        assert bytes(batches.data[1][0].reshape(-1)[:n]) == good and batches.labels[1][0] == 5.0
        progressive = jpeg(img, quality=80, progressive=True)
        assert data_parallel.leave_encoded(batches, 1, 1, progressive, 6.0, (3, H, W), False, False) is None
        big = jpeg(np.random.default_rng(4).integers(0, 256, (H, W, 3), dtype=np.uint8), quality=100, subsampling=0)
        assert len(big) > 3 * H * W  # noise at quality 100: larger than its pixels, so the worker decodes it
        assert data_parallel.leave_encoded(batches, 1, 1, big, 6.0, (3, H, W), False, False) is None
    finally:
        batches.close()


def test_gpu_decode_is_chosen_by_the_prototxt_or_the_environment():
    assert not data_parallel.gpu_decode_chosen(False)
    assert data_parallel.gpu_decode_chosen(True)
    assert data_parallel.gpu_decode_chosen(None)  # unset in the file: on
    with using_config(gpu_decode=False):
        assert not data_parallel.gpu_decode_chosen(True)
        assert not data_parallel.gpu_decode_chosen(None)
    with using_config(gpu_decode=True):
        assert data_parallel.gpu_decode_chosen(False)
    assert caffe_pb2.DataParameter().gpu_decode is False
    assert caffe_pb2.DataParameter.DESCRIPTOR.fields_by_name["gpu_decode"].number == 1002


# -- the staging path on an emulated device ----------------------------------------------------------
class _Log(list):
    """The emulated streams' log; :attr:`by_main` keeps the entries the main thread made (the
    staging thread's interleave with them)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_main: list = []

    def append(self, entry) -> None:
        super().append(entry)
        if threading.current_thread() is threading.main_thread():
            self.by_main.append(entry)


class _Event:
    def __init__(self, log: list, stream: str) -> None:
        self.stream = stream
        log.append(("record", stream))

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class _Stream:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.handle = name, log, 0

    def wait_for_event(self, event) -> None:
        self.log.append(("wait", self.name, event.stream))

    def synchronize(self) -> None:
        pass


class _FakeDecoder:
    """nvJPEG's stand-in: decodes each JPEG at its host address with Pillow into its planes."""

    calls: list = []
    fail: set = set()  # levels (of nvjpeg.BACKENDS) whose decode fails

    def __init__(self, states: int = 2, start: int = 0, library=None) -> None:
        self.level, self.path = start, "fake"
        self.backend = nvjpeg.BACKENDS[start][0]

    threads: list = []  # the thread of each decode
    hook = None  # called with the number of the decode (from 0) before it runs

    def decode(self, state, sources, lengths, planes, pitch, fmt, stream_handle) -> None:
        from pycaffe_lite.testing import host_kernels as hk

        cls = type(self)
        cls.threads.append(threading.current_thread())
        if cls.hook is not None:
            cls.hook(len(cls.calls))
        cls.calls.append((self.level, state, len(sources)))
        if self.level in self.fail:
            raise nvjpeg.NvJpegError(f"nvjpegDecodeBatched ({self.backend} backend) failed: NVJPEG_STATUS_EXECUTION_FAILED")
        assert fmt == nvjpeg.OUTPUT_BGR
        for src, n, ptrs in zip(sources, lengths, planes):
            values = decode_image(ctypes.string_at(src, n))
            for c, ptr in enumerate(ptrs):
                hk.host_array(ptr, values.shape[1:], np.uint8)[...] = values[c]

    def close(self) -> None:
        pass


@pytest.fixture
def emulated_device(monkeypatch):
    """The device API on the host: allocations are host buffers, copies memmove at once, the
    kernel is the host build of transform.cu, events are complete; returns the stream log."""
    from pycaffe_lite.gpu import backend, driver
    from pycaffe_lite.testing import host_kernels as hk

    if hk.CXX is None:
        pytest.skip("no C++ compiler for the host build of transform.cu")
    held: list[np.ndarray] = []
    log = _Log()
    compute, copy = _Stream("compute", log), _Stream("copy", log)

    def alloc(nbytes):
        arr = np.full(int(nbytes), 0xAB, np.uint8)
        held.append(arr)
        return arr.ctypes.data

    def memcpy_htod(dst, src, pinned=False, on=None):
        src = np.ascontiguousarray(src)
        ctypes.memmove(int(dst), src.ctypes.data, src.nbytes)
        log.append(("copy", "compute" if on is None else on.name))
        return _Event(log, "compute" if on is None else on.name) if pinned else None

    def kernel(path, name, dtype):
        lib, sigs = hk.serial_library(Path(path), dtype)

        def call(*args):
            log.append(("kernel", "compute"))
            getattr(lib, name)(*hk.kernel_args(sigs[name], args, dtype))
        return call

    hk.route_blobs_to_host(monkeypatch)
    monkeypatch.setattr(memcheck, "device_limit", lambda: 1 << 40)
    monkeypatch.setattr(backend, "alloc", alloc)
    monkeypatch.setattr(backend, "memcpy_htod", memcpy_htod)
    monkeypatch.setattr(backend, "record_event", lambda on=None: _Event(log, "compute" if on is None else on.name))
    monkeypatch.setattr(backend, "stream", lambda: compute)
    monkeypatch.setattr(backend, "copy_stream", lambda: copy)
    monkeypatch.setattr(backend, "kernel", kernel)
    monkeypatch.setattr(backend, "current_in_thread", contextlib.nullcontext)
    monkeypatch.setattr(driver, "register_host", lambda array: (lambda: None))
    monkeypatch.setattr(nvjpeg, "Decoder", _FakeDecoder)
    monkeypatch.setattr(nvjpeg, "load_library", lambda names=None: (None, "fake"))
    _FakeDecoder.calls, _FakeDecoder.fail, _FakeDecoder.threads, _FakeDecoder.hook = [], set(), [], None
    return log


def run_batches(layer, count: int, gpu: bool, monkeypatch=None, seed: int = 11):
    """``count`` forwards (``forward_gpu`` on the emulated device when ``gpu``): data, labels, read state."""
    top = empty_blobs(2, layer.dtype)
    caffe.set_random_seed(seed)
    if gpu:
        monkeypatch.setattr(common, "mode", lambda: common.Mode.GPU)
    layer.setup([], top)
    out = []
    for _ in range(count):
        (layer.forward_gpu if gpu else layer.forward_cpu)([], top)
        out.append((top[0].cpu_data().copy(), top[1].cpu_data().copy(), layer.read_state()))
    layer.close()
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for k, ((da, la, sa), (db, lb, sb)) in enumerate(zip(a, b)):
        np.testing.assert_array_equal(la, lb, err_msg=f"batch {k} labels")
        np.testing.assert_array_equal(da, db, err_msg=f"batch {k} pixels")
        assert sa == sb, f"batch {k} read state"


@pytest.mark.parametrize("gpu_decode", [False, True])
def test_staged_batches_equal_the_single_thread_path(mixed_source, emulated_device, monkeypatch, gpu_decode):
    """Uploads (or decodes) on the copy stream into two buffers in turn, the compute stream waiting
    for each: the batches, labels and read states of the single prefetch thread, bit for bit."""
    want = run_batches(layer_of(mixed_source, 0), 9, gpu=False)
    layer = layer_of(mixed_source, 2, gpu_decode=gpu_decode)
    got = run_batches(layer, 9, gpu=True, monkeypatch=monkeypatch)
    assert_same(want, got)
    log = emulated_device
    kernels = [k for k, e in enumerate(log.by_main) if e == ("kernel", "compute")]
    assert len(kernels) == 9
    for k in kernels:  # each kernel runs after the compute stream waited for the copy stream
        assert log.by_main[k - 1] == ("wait", "compute", "copy")
    assert all(e[1] == "copy" for e in log if e[0] == "copy" and e != ("copy", "compute"))
    assert ("wait", "copy", "compute") in log  # a buffer is rewritten only after the kernel that read it
    if gpu_decode:
        decoded = sum(n for _, _, n in _FakeDecoder.calls)
        baseline = [sum(1 for i in range(b * 4) if (i % N) % 5 != 4) for b in (9, 10, 11)]
        assert decoded in baseline  # progressive records were decoded by the workers (2 more batches may be staged)
        assert {state for _, state, _ in _FakeDecoder.calls} == {0, 1}  # two decode states in turn
    else:
        assert _FakeDecoder.calls == []


def test_the_next_batch_is_staged_while_the_net_computes(mixed_source, emulated_device, monkeypatch):
    """With the workers ahead (a pause between forwards stands for the net's compute), each forward
    queues the next batch's decode on the copy stream, and the next forward waits for nothing."""
    import time

    layer = layer_of(mixed_source, 2, gpu_decode=True)
    top = empty_blobs(2, layer.dtype)
    monkeypatch.setattr(common, "mode", lambda: common.Mode.GPU)
    layer.setup([], top)
    for _ in range(6):
        layer.forward_gpu([], top)
        time.sleep(0.3)
    parallel = layer._prefetcher
    assert parallel.staged_ahead >= 4
    assert layer.data_stats()[:2] == (6, 24)
    layer.close()


def test_nvjpeg_failures_fall_back_backend_by_backend_then_to_the_host(mixed_source, emulated_device, monkeypatch,
                                                                       caplog):
    """A failing backend: the host decodes that batch (same pixels), the next backend takes over."""
    want = run_batches(layer_of(mixed_source, 0), 5, gpu=False)
    _FakeDecoder.fail = {0, 1}
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        got = run_batches(layer_of(mixed_source, 2, gpu_decode=True), 5, gpu=True, monkeypatch=monkeypatch)
    assert_same(want, got)
    levels = [level for level, _, _ in _FakeDecoder.calls]
    assert levels[:2] == [0, 1] and set(levels[2:]) == {2}
    assert "the host decoded the batch" in caplog.text
    _FakeDecoder.calls, _FakeDecoder.fail = [], set(range(len(nvjpeg.BACKENDS)))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        got = run_batches(layer_of(mixed_source, 2, gpu_decode=True), 5, gpu=True, monkeypatch=monkeypatch)
    assert_same(want, got)
    assert [level for level, _, _ in _FakeDecoder.calls] == list(range(len(nvjpeg.BACKENDS)))
    assert "decoded on the host from now on" in caplog.text


def test_a_corrupt_jpeg_nvjpeg_refuses_is_an_error_naming_the_record(tmp_path, emulated_device, monkeypatch):
    """Bytes whose header reads as a baseline JPEG but whose data is garbage: nvJPEG fails, the
    host fails too, and the error names the layer and the record."""
    def corrupt(i, img):
        good = jpeg(img, quality=90)
        return good if i != 2 else good[:len(good) // 2] + bytes(len(good) // 2)

    source = write_lmdb(tmp_path / "db", corrupt, count=8)
    _FakeDecoder.fail = set(range(len(nvjpeg.BACKENDS)))
    with pytest.raises(caffe.errors.DataError, match=r"layer .*record b'00000002'.*cannot decode"):
        run_batches(layer_of(source, 2, gpu_decode=True), 2, gpu=True, monkeypatch=monkeypatch)


def test_resume_with_a_staged_batch_reads_on_from_the_last_batch_handed_out(mixed_source, emulated_device,
                                                                            monkeypatch):
    """A batch staged ahead is not handed out: read_state and a restore ignore it."""
    want = run_batches(layer_of(mixed_source, 0), 6, gpu=False)
    layer = layer_of(mixed_source, 2, gpu_decode=True)
    top = empty_blobs(2, layer.dtype)
    caffe.set_random_seed(11)
    monkeypatch.setattr(common, "mode", lambda: common.Mode.GPU)
    layer.setup([], top)
    for _ in range(3):
        layer.forward_gpu([], top)
    state = layer.read_state()
    assert state == want[2][2]
    layer.restore_read_state(*state)
    got = []
    for _ in range(3):
        layer.forward_gpu([], top)
        got.append((top[0].cpu_data().copy(), top[1].cpu_data().copy(), layer.read_state()))
    layer.close()
    assert_same(want[3:], got)


def test_missing_library_warns_and_decodes_on_the_host(mixed_source, emulated_device, monkeypatch, caplog):
    def missing(names=None):
        raise nvjpeg.NvJpegError("nvJPEG (libnvjpeg) not found; install ...")

    monkeypatch.setattr(nvjpeg, "load_library", missing)
    want = run_batches(layer_of(mixed_source, 0), 3, gpu=False)
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        layer = layer_of(mixed_source, 2, gpu_decode=True)
        got = run_batches(layer, 3, gpu=True, monkeypatch=monkeypatch)
    assert_same(want, got)
    assert "not found" in caplog.text and "decoded on the host" in caplog.text
    assert _FakeDecoder.calls == []


# -- the staging thread ------------------------------------------------------------------------------
def _started(layer, monkeypatch, forwards: int = 1):
    """``layer`` set up in (emulated) GPU mode after ``forwards`` device forwards; its tops."""
    top = empty_blobs(2, layer.dtype)
    caffe.set_random_seed(11)
    monkeypatch.setattr(common, "mode", lambda: common.Mode.GPU)
    layer.setup([], top)
    for _ in range(forwards):
        layer.forward_gpu([], top)
    return top


def _assert_stopped(parallel, stager, name: str) -> None:
    """The staging thread ended, the workers exited, the shared batches unlinked."""
    assert not stager.thread.is_alive()
    assert parallel.loader._closed and not [p for p in parallel.loader.pool.procs if p.is_alive()]
    assert not Path("/dev/shm", name).exists()


def test_decodes_run_on_the_staging_thread(mixed_source, emulated_device, monkeypatch):
    """nvJPEG's decodes are queued by the layer's staging thread, never by the forward's."""
    layer = layer_of(mixed_source, 2, gpu_decode=True)
    top = _started(layer, monkeypatch, forwards=5)
    parallel = layer._prefetcher
    stager = parallel._stager
    assert stager is not None and stager.thread.is_alive() and stager.thread.name.startswith("nvJPEG stager")
    assert _FakeDecoder.threads and set(_FakeDecoder.threads) == {stager.thread}
    assert ("wait", "copy", "compute") not in emulated_device.by_main  # the forward never queues a staging
    assert layer.data_stats()[:2] == (5, 20)
    name = parallel.loader.batches.name
    layer.close()
    _assert_stopped(parallel, stager, name)
    assert top[0].shape == (4, 3, 16, 16)


def test_an_error_in_the_staging_thread_is_raised_by_the_next_forwards_naming_the_layer(
        mixed_source, emulated_device, monkeypatch):
    """The batches staged before the failure are handed out first; then every forward raises."""
    want = run_batches(layer_of(mixed_source, 0), 2, gpu=False)

    def fail_third(n):
        if n == 2:
            raise RuntimeError("the decoder exploded")

    _FakeDecoder.hook = fail_third
    layer = layer_of(mixed_source, 2, gpu_decode=True)
    top = empty_blobs(2, layer.dtype)
    caffe.set_random_seed(11)
    monkeypatch.setattr(common, "mode", lambda: common.Mode.GPU)
    layer.setup([], top)
    got = []
    for _ in range(2):
        layer.forward_gpu([], top)
        got.append((top[0].cpu_data().copy(), top[1].cpu_data().copy(), layer.read_state()))
    assert_same(want, got)
    for _ in range(2):
        with pytest.raises(caffe.errors.DataError,
                           match=r"layer .*nvJPEG staging thread failed: RuntimeError\('the decoder exploded'\)"):
            layer.forward_gpu([], top)
    assert layer.read_state() == want[1][2]  # the failed batch was not handed out
    parallel, stager = layer._prefetcher, layer._prefetcher._stager
    name = parallel.loader.batches.name
    layer.close()
    _assert_stopped(parallel, stager, name)


def test_close_with_a_batch_in_flight_waits_for_it_and_stops_everything(mixed_source, emulated_device,
                                                                        monkeypatch):
    """close() while the thread is inside a decode: the decode finishes, the thread ends, the
    workers exit and the shared memory is unlinked (no hang, no error)."""
    import time

    inside, release = threading.Event(), threading.Event()

    def block_third(n):
        if n == 2:
            inside.set()
            release.wait(5)

    _FakeDecoder.hook = block_third
    layer = layer_of(mixed_source, 2, gpu_decode=True)
    _started(layer, monkeypatch, forwards=1)
    assert inside.wait(10), "the staging thread did not start the third batch"
    parallel, stager = layer._prefetcher, layer._prefetcher._stager
    name = parallel.loader.batches.name
    threading.Timer(0.3, release.set).start()
    start = time.perf_counter()
    layer.close()
    assert release.is_set() and time.perf_counter() - start < 5
    _assert_stopped(parallel, stager, name)
    assert len(_FakeDecoder.calls) == 3  # the one in flight finished; nothing staged after the stop


def test_a_stop_asked_from_the_staging_thread_is_finished_by_it(mixed_source, emulated_device, monkeypatch):
    """The layer collected by a garbage collection that runs in the staging thread: its stop cannot
    join the thread it runs in, so the thread finishes it on its way out; forwards then say so."""
    layer = layer_of(mixed_source, 2, gpu_decode=True)
    holder: dict = {}

    def stop_inside(n):
        if n == 2:
            holder["parallel"].stop()

    _FakeDecoder.hook = stop_inside
    top = empty_blobs(2, layer.dtype)
    monkeypatch.setattr(common, "mode", lambda: common.Mode.GPU)
    layer.setup([], top)
    parallel = holder["parallel"] = layer._prefetcher
    name = parallel.loader.batches.name
    layer.forward_gpu([], top)
    stager = parallel._stager
    stager.thread.join(10)
    _assert_stopped(parallel, stager, name)
    assert parallel._stager is None and not parallel._held
    with pytest.raises(caffe.errors.DataError, match="not running"):
        layer.forward_gpu([], top)
    layer.close()


def test_the_backend_lets_a_thread_copy_on_the_copy_stream_during_a_capture(monkeypatch):
    """While a capture records the compute stream, a host copy onto it is refused; onto another
    stream (the staging thread's copy stream) it is queued. A thread joins only a started device."""
    from types import SimpleNamespace

    from pycaffe_lite.errors import CudaError, GPUUnavailableError
    from pycaffe_lite.gpu import backend

    monkeypatch.setattr(backend, "_state", None)
    with pytest.raises(GPUUnavailableError, match="no device started"), backend.current_in_thread():
        pass
    copies: list = []
    compute, copy = object(), object()
    cuda = SimpleNamespace(memcpy_htod_async=lambda dst, src, stream: copies.append((dst, stream)))
    contexts: list = []
    context = SimpleNamespace(push=lambda: contexts.append("push"), pop=lambda: contexts.append("pop"))
    monkeypatch.setattr(backend, "_state", SimpleNamespace(recording=object(), stream=compute, cuda=cuda,
                                                           context=context))
    with pytest.raises(CudaError, match="while a CUDA graph is being captured"):
        backend.memcpy_htod(1, np.zeros(4, np.uint8))
    with pytest.raises(CudaError, match="while a CUDA graph is being captured"):
        backend.memcpy_htod(1, np.zeros(4, np.uint8), on=compute)
    assert backend.memcpy_htod(2, np.zeros(4, np.uint8), on=copy) is None
    assert copies == [(2, copy)]
    with backend.current_in_thread():
        assert contexts == ["push"]
    assert contexts == ["push", "pop"]


def png(i: int, img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def test_gpu_decode_is_on_by_default_for_jpeg_records_in_gpu_mode(mixed_source, tmp_path, emulated_device,
                                                                  monkeypatch, caplog):
    """Unset: nvJPEG is ready in GPU mode for JPEG records (not PNG ones), the workers decoding
    while they keep up (the log says so); ``gpu_decode: false`` in the file or
    PYCAFFE_LITE_GPU_DECODE=0 turn it off; CPU mode never uses it."""
    monkeypatch.setattr(data_parallel, "WATCH_SHARE", 2.0)  # (the workers always keep up)
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        layer = layer_of(mixed_source, 2, gpu_decode=None)
        _started(layer, monkeypatch, forwards=16)
    parallel = layer._prefetcher
    assert parallel.adaptive and not parallel.gpu_decode and parallel._stager is None  # (raw records' path)
    assert not parallel.loader.device_decode and not _FakeDecoder.calls and parallel.decoder is None
    assert "the workers decode JPEG records while they keep up" in caplog.text
    layer.close()
    for off, env in (("false", None), (None, False)):
        _FakeDecoder.calls = []
        caplog.clear()
        with using_config(gpu_decode=env), caplog.at_level(logging.INFO, logger="pycaffe_lite"):
            layer = layer_of(mixed_source, 2, gpu_decode=None if off is None else False)
            _started(layer, monkeypatch, forwards=2)
        assert not layer._prefetcher.gpu_decode and layer._prefetcher._stager is None and not _FakeDecoder.calls
        assert "the workers decode the records (gpu_decode off)" in caplog.text
        layer.close()
    pngs = write_lmdb(tmp_path / "png", png, count=8)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        layer = layer_of(pngs, 2, gpu_decode=None)
        _started(layer, monkeypatch, forwards=1)
    assert not layer._prefetcher.gpu_decode and "(not JPEG)" in caplog.text
    layer.close()
    monkeypatch.setattr(common, "mode", lambda: common.Mode.CPU)
    layer = layer_of(mixed_source, 2, gpu_decode=None)
    layer.setup([], empty_blobs(2, layer.dtype))
    assert not layer._prefetcher.raw and not layer._prefetcher.gpu_decode
    layer.close()


@pytest.mark.parametrize("share", [-1.0, 2.0])
def test_adaptive_decode_hands_over_to_nvjpeg_when_the_forwards_wait(mixed_source, emulated_device, monkeypatch,
                                                                     caplog, share):
    """Unset gpu_decode: once the forwards waited more than WATCH_SHARE of a window for the host
    decode (-1: any wait counts), the batches planned from then on are left encoded for nvJPEG (the
    log says so), and every batch still equals the single prefetch thread's; else the workers
    decode them all."""
    monkeypatch.setattr(data_parallel, "WATCH_SKIP", 1)
    monkeypatch.setattr(data_parallel, "WATCH_WINDOW", 2)
    monkeypatch.setattr(data_parallel, "WATCH_SHARE", share)
    want = run_batches(layer_of(mixed_source, 0), 14, gpu=False)
    layer = layer_of(mixed_source, 2, gpu_decode=None)
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        got = run_batches(layer, 14, gpu=True, monkeypatch=monkeypatch)
    assert_same(want, got)
    switched = share < 0
    assert bool(_FakeDecoder.calls) == switched
    assert ("decoded on the device by nvJPEG from now on" in caplog.text) == switched
    assert ("JPEG records decoded on the device by nvJPEG (" in caplog.text) == switched  # (opened then)


@pytest.mark.parametrize("share", [-1.0, 2.0])
def test_a_resume_keeps_the_adaptive_decode_where_it_was(mixed_source, emulated_device, monkeypatch, share):
    """restore_read_state (a solver's resume) after nvJPEG took over goes on with nvJPEG; before,
    the new readers still watch the workers (and hand over when they wait). Batches equal the single
    prefetch thread's across the resume."""
    monkeypatch.setattr(data_parallel, "WATCH_SKIP", 1)
    monkeypatch.setattr(data_parallel, "WATCH_WINDOW", 2)
    monkeypatch.setattr(data_parallel, "WATCH_SHARE", share)

    def run(layer, gpu: bool):
        top = empty_blobs(2, layer.dtype)
        caffe.set_random_seed(11)
        if gpu:
            monkeypatch.setattr(common, "mode", lambda: common.Mode.GPU)
        layer.setup([], top)
        out = []
        for k in range(12):
            if k == 6:
                layer.restore_read_state(*layer.read_state())
                if gpu:  # the new readers are adaptive too, on nvJPEG already when it had taken over
                    assert layer._prefetcher.adaptive and layer._prefetcher.gpu_decode == (share < 0)
                    calls = len(_FakeDecoder.calls)
            (layer.forward_gpu if gpu else layer.forward_cpu)([], top)
            out.append((top[0].cpu_data().copy(), top[1].cpu_data().copy(), layer.read_state()))
        layer.close()
        return out, (calls if gpu else 0)

    want, _ = run(layer_of(mixed_source, 0), False)
    got, calls = run(layer_of(mixed_source, 2, gpu_decode=None), True)
    assert_same(want, got)
    assert (len(_FakeDecoder.calls) > calls) == (share < 0)  # nvJPEG decoded after the resume


def test_a_missing_library_by_default_is_no_warning(mixed_source, emulated_device, monkeypatch, caplog):
    def missing(names=None):
        raise nvjpeg.NvJpegError("nvJPEG (libnvjpeg) not found; install ...")

    monkeypatch.setattr(nvjpeg, "load_library", missing)
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        layer = layer_of(mixed_source, 2, gpu_decode=None)
        _started(layer, monkeypatch, forwards=1)
    assert not layer._prefetcher.gpu_decode and "(libnvjpeg not found)" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    layer.close()


# -- on the device -----------------------------------------------------------------------------------
def _gpu_batches(source, count, gpu_decode, transform=TRANSFORM, resume_at: int | None = None):
    """``count`` forwards in GPU mode (restoring the read state after ``resume_at`` of them): data,
    labels, read state each; the decoder (None: the host decoded). Checks that nvJPEG ran on the
    staging thread exactly when it decoded."""
    caffe.set_mode_gpu()
    layer = layer_of(source, 2, batch=8, gpu_decode=gpu_decode, transform=transform)
    top = empty_blobs(2, layer.dtype)
    caffe.set_random_seed(11)
    layer.setup([], top)
    out = []
    for k in range(count):
        if k == resume_at:
            layer.restore_read_state(*layer.read_state())
        layer.forward([], top)
        out.append((top[0].cpu_data().copy(), top[1].cpu_data().copy(), layer.read_state()))
    decoder, stager = layer._prefetcher.decoder, layer._prefetcher._stager
    assert (stager is not None) == (decoder is not None)
    if stager is not None:
        assert stager.thread.is_alive()
    layer.close()
    if stager is not None:
        assert not stager.thread.is_alive()
    return out, decoder


def _within_tolerance(host, device, subsampling: int) -> np.ndarray:
    """Labels and read states equal; pixels within the module's tolerance; the differences."""
    diffs = []
    for k, ((dh, lh, sh), (dd, ld, sd)) in enumerate(zip(host, device, strict=True)):
        np.testing.assert_array_equal(lh, ld, err_msg=f"batch {k} labels")
        assert sh == sd, f"batch {k} read state"
        diffs.append(np.abs(dh.astype(np.float64) - dd))
    d = np.concatenate([x.ravel() for x in diffs])
    if subsampling == 0:
        assert d.max() <= nvjpeg.TOLERANCE_444
    else:
        assert np.quantile(d, 0.999) <= nvjpeg.TOLERANCE_420
    # a wrong crop offset or flip would move whole gradients: far beyond these bounds
    assert d.mean() <= nvjpeg.TOLERANCE_MEAN
    return d


@pytest.mark.gpu
@pytest.mark.parametrize(("subsampling", "bound"), [(0, nvjpeg.TOLERANCE_444), (2, nvjpeg.TOLERANCE_420)])
def test_nvjpeg_pixels_within_the_stated_tolerance(tmp_path, gpu_mode, subsampling, bound):
    """Same LMDB, nvJPEG against Pillow (no mean, no scale: pixel levels): labels, read states and
    the crop/mirror stream equal; pixels within the module's tolerance."""
    source = write_lmdb(tmp_path / "db", lambda i, img: jpeg(img, quality=90, subsampling=subsampling))
    transform = "crop_size: 16 mirror: true"
    host, _ = _gpu_batches(source, 6, False, transform)
    device, decoder = _gpu_batches(source, 6, True, transform)
    assert decoder is not None, "nvJPEG was not used (library missing or failed: see the log)"
    d = _within_tolerance(host, device, subsampling)
    print(f"nvJPEG vs Pillow ({decoder.backend} backend, subsampling {subsampling}, bound {bound}): max {d.max()}, "
          f"99.9% {np.quantile(d, 0.999)}, mean {d.mean():.3f} levels")


@pytest.mark.gpu
@pytest.mark.parametrize("level", range(1, len(nvjpeg.BACKENDS)))
@pytest.mark.parametrize("subsampling", [0, 2])
def test_every_nvjpeg_backend_within_the_stated_tolerance(tmp_path, gpu_mode, monkeypatch, level, subsampling):
    """The later backends of nvjpeg.BACKENDS (those a failing or missing earlier one hands over to)
    decode within the same tolerance; one the library or GPU lacks is reported as skipped."""
    source = write_lmdb(tmp_path / "db", lambda i, img: jpeg(img, quality=90, subsampling=subsampling))
    transform = "crop_size: 16 mirror: true"
    host, _ = _gpu_batches(source, 6, False, transform)
    monkeypatch.setattr(nvjpeg, "BACKENDS", nvjpeg.BACKENDS[level:])
    device, decoder = _gpu_batches(source, 6, True, transform)
    if decoder is None or decoder.backend != nvjpeg.BACKENDS[0][0]:
        pytest.skip(f"nvJPEG's {nvjpeg.BACKENDS[0][0]} backend is not available here")
    d = _within_tolerance(host, device, subsampling)
    print(f"nvJPEG vs Pillow ({decoder.backend} backend, subsampling {subsampling}): max {d.max()}, "
          f"99.9% {np.quantile(d, 0.999)}, mean {d.mean():.3f} levels")


@pytest.mark.gpu
def test_nvjpeg_resume_reads_on_from_the_last_batch_handed_out(tmp_path, gpu_mode):
    """A restore of the read state after 3 forwards, batches staged ahead on the thread dropped: the
    host decode's 6 batches (labels, read states, crop/mirror stream), pixels within tolerance."""
    source = write_lmdb(tmp_path / "db", lambda i, img: jpeg(img, quality=90, subsampling=0))
    transform = "crop_size: 16 mirror: true"
    host, _ = _gpu_batches(source, 6, False, transform)
    device, decoder = _gpu_batches(source, 6, True, transform, resume_at=3)
    assert decoder is not None
    _within_tolerance(host, device, 0)


@pytest.mark.gpu
def test_nvjpeg_close_with_batches_in_flight(tmp_path, gpu_mode):
    """close() right after a forward, while the staging thread decodes the next batches: the
    thread ends, the workers exit, the segment is unlinked, the device still works, and a new layer
    reads the same first batch."""
    from pycaffe_lite.gpu import backend

    source = write_lmdb(tmp_path / "db", lambda i, img: jpeg(img, quality=90), count=64)
    firsts = []
    for _ in range(3):
        layer = layer_of(source, 2, batch=16, gpu_decode=True)
        top = empty_blobs(2, layer.dtype)
        caffe.set_random_seed(5)
        layer.setup([], top)
        layer.forward([], top)
        firsts.append(top[0].cpu_data().copy())
        parallel = layer._prefetcher
        stager, name = parallel._stager, parallel.loader.batches.name
        assert stager is not None and parallel.decoder is not None
        layer.close()
        assert not stager.thread.is_alive()
        assert not [p for p in parallel.loader.pool.procs if p.is_alive()]
        assert not Path("/dev/shm", name).exists()
        backend.synchronize()
    np.testing.assert_array_equal(firsts[0], firsts[1])
    np.testing.assert_array_equal(firsts[0], firsts[2])


@pytest.mark.gpu
def test_nvjpeg_corrupt_record_is_named(tmp_path, gpu_mode):
    """A JPEG cut before its scan (its frame header reads as baseline, so it goes to nvJPEG):
    nvJPEG fails, the host fails too, and the forward raises naming the layer and the record,
    as does the next one; close is clean."""
    def cut(i, img):
        good = jpeg(img, quality=90)
        return good if i != 2 else good[:good.index(b"\xff\xda")]

    source = write_lmdb(tmp_path / "db", cut, count=16)
    layer = layer_of(source, 2, batch=8, gpu_decode=True)
    top = empty_blobs(2, layer.dtype)
    layer.setup([], top)
    for _ in range(2):
        with pytest.raises(caffe.errors.DataError, match=r"layer .*record b'00000002'.*cannot decode"):
            layer.forward([], top)
    stager = layer._prefetcher._stager
    layer.close()
    assert stager is not None and not stager.thread.is_alive()


@pytest.mark.gpu
def test_gpu_decode_in_a_replayed_training_iteration(tmp_path, gpu_mode):
    """A solver on a JPEG LMDB with nvJPEG and the copy stream: its iterations replay as CUDA
    graphs (the data layer runs before each replay) and its losses stay close to the host decode's."""
    from pycaffe_lite.solvers.sgd_solvers import get_solver

    source = write_lmdb(tmp_path / "db", lambda i, img: jpeg(img, quality=90), count=40)
    net = f"""
    layer {{ name: "data" type: "Data" top: "data" top: "label"
            data_param {{ source: "{source}" batch_size: 8 backend: LMDB workers: 2 %s }}
            transform_param {{ crop_size: 16 mirror: true mean_value: 110 scale: 0.01 }} }}
    layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
            inner_product_param {{ num_output: 128 weight_filler {{ type: "gaussian" std: 0.01 }} }} }}  # (labels are 3i+1 < 120)
    layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
    """
    losses, fallbacks = {}, {}
    for on in (False, True, None):  # None: the field unset (nvJPEG ready, the workers decode while they keep up)
        folder = tmp_path / str(on)
        folder.mkdir()
        (folder / "net.prototxt").write_text(net % ("" if on is None else f"gpu_decode: {str(on).lower()}"))
        sp = caffe_pb2.SolverParameter(net=str(folder / "net.prototxt"), base_lr=0.01, lr_policy="fixed",
                                       max_iter=12, display=0, snapshot_prefix=str(folder / "t"), random_seed=3)
        solver = get_solver(sp, progress=False)
        seen: list[float] = []
        solver.iteration_hooks.append(lambda it, loss, seen=seen: seen.append(loss))
        try:
            solver.solve()
        except Exception as exc:
            raise AssertionError(f"gpu_decode {on}: {exc}") from exc
        parallel = solver.net.layers[0]._prefetcher
        if on:  # nvJPEG decoded on the staging thread while the iterations replayed
            assert parallel.decoder is not None and parallel._stager is not None
            assert parallel._stager.thread.is_alive()
        elif on is None:  # the workers decoded, nvJPEG only if they fell behind
            assert parallel.adaptive and (parallel._stager is not None) == parallel.loader.device_decode
        else:
            assert parallel._stager is None
        assert solver.executor.replays > 0, solver.executor.fallbacks
        fallbacks[on] = list(solver.executor.fallbacks)
        solver.net.layers[0].close()
        losses[on] = np.array(seen)
    # the staging thread decodes while the main thread captures: no capture abandoned because of it
    assert fallbacks[True] == fallbacks[False] and fallbacks[None] == fallbacks[False], fallbacks
    for on in (True, None):
        assert len(losses[on]) == 12 and np.all(np.isfinite(losses[on]))
        np.testing.assert_allclose(losses[on], losses[False], rtol=0.05, atol=0.05)
