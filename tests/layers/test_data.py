"""Data layer: batches, labels, wrap-around, transformations vs numpy, rand_skip, errors, thread."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.data.db import LMDBWriter
from pycaffe_lite.errors import DataError
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer

pytest.importorskip("lmdb")

N, C, H, W = 10, 3, 5, 4


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """An LMDB of N uint8 Datums (C, H, W) with labels 100 + i; returns (path, images, labels)."""
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, size=(N, C, H, W), dtype=np.uint8)
    labels = 100 + np.arange(N)
    path = tmp_path_factory.mktemp("data") / "lmdb"
    with LMDBWriter(path) as w:
        for i in range(N):
            d = caffe_pb2.Datum(channels=C, height=H, width=W, data=images[i].tobytes(), label=int(labels[i]))
            w.put(b"%08d" % i, d.SerializeToString())
    return path, images, labels


def data_layer(path, batch=4, extra="", transform="", dtype=np.float64, phase=None):
    phase_text = f"phase: {phase}" if phase is not None else ""
    return make_layer(
        f'type: "Data" {phase_text} data_param {{ source: "{path}" batch_size: {batch} backend: LMDB {extra} }} '
        f"transform_param {{ {transform} }}",
        dtype,
    )


def test_batches_labels_and_wraparound(source, mode):
    path, images, labels = source
    layer = data_layer(path, batch=4, transform="scale: 0.5", dtype=np.float32)
    top = empty_blobs(2, np.float32)
    layer.setup([], top)
    assert top[0].shape == (4, C, H, W) and top[1].shape == (4,)
    order = np.arange(4 * 6) % N  # 6 batches: wraps to the first record after the last
    for b in range(6):
        layer.forward([], top)
        idx = order[4 * b : 4 * b + 4]
        got = top[0].cpu_data()
        if mode == "gpu":  # the next layer reads the batch on the device: check that copy
            from pycaffe_lite.gpu import backend

            got = np.empty(top[0].shape, np.float32)
            backend.memcpy_dtoh(got, top[0].gpu_data())
        np.testing.assert_array_equal(got, images[idx].astype(np.float32) * np.float32(0.5))
        np.testing.assert_array_equal(top[1].cpu_data(), labels[idx])
    layer.close()


def test_data_only_top_and_mean_center_crop(source):
    path, images, _ = source
    layer = data_layer(path, batch=3, transform="crop_size: 3 mean_value: 10 mean_value: 20 mean_value: 30 scale: 2",
                       phase="TEST")
    top = empty_blobs(1)
    layer.setup([], top)
    layer.forward([], top)
    assert top[0].shape == (3, C, 3, 3)
    h0, w0 = (H - 3) // 2, (W - 3) // 2
    mean = np.array([10.0, 20.0, 30.0]).reshape(1, 3, 1, 1)
    expected = (images[:3, :, h0 : h0 + 3, w0 : w0 + 3].astype(np.float64) - mean) * 2
    np.testing.assert_allclose(top[0].cpu_data(), expected, atol=1e-12)
    layer.close()


def test_random_crop_and_mirror_at_train(source):
    path, images, _ = source
    caffe.set_random_seed(11)
    layer = data_layer(path, batch=N, transform="crop_size: 3 mirror: true", phase="TRAIN")
    top = empty_blobs(2)
    layer.setup([], top)
    seen_flip = seen_plain = 0
    offsets = set()
    for _ in range(4):
        layer.forward([], top)
        for i in range(N):
            out = top[0].cpu_data()[i]
            hits = [(h, w, f) for h in range(H - 2) for w in range(W - 2) for f in (False, True)
                    if np.array_equal(out, images[i][:, h : h + 3, w : w + 3][:, :, ::-1] if f
                                      else images[i][:, h : h + 3, w : w + 3])]
            assert hits, f"item {i} is not a (mirrored) 3x3 window of record {i}"
            offsets.add(hits[0][:2])
            seen_flip += any(f for *_, f in hits)
            seen_plain += any(not f for *_, f in hits)
    assert seen_flip > 5 and seen_plain > 5 and len(offsets) > 3
    layer.close()


def test_legacy_data_param_transform_fields(source):
    path, images, _ = source
    layer = data_layer(path, batch=2, extra="scale: 0.25")
    top = empty_blobs(1)
    layer.setup([], top)
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].cpu_data(), images[:2] * 0.25)
    layer.close()


def test_rand_skip_starts_at_a_random_record(source):
    path, images, labels = source
    starts = set()
    for seed in range(12):
        caffe.set_random_seed(seed)
        layer = data_layer(path, batch=3, extra="rand_skip: 6")
        top = empty_blobs(2)
        layer.setup([], top)
        layer.forward([], top)
        first = int(top[1].cpu_data()[0]) - 100
        assert 0 <= first < 6
        np.testing.assert_array_equal(top[1].cpu_data(), labels[(first + np.arange(3)) % N])
        starts.add(first)
        layer.close()
    assert len(starts) > 2


def test_prefetch_queue_depth_and_clean_stop(source):
    path, _, _ = source
    layer = data_layer(path, batch=2, extra="prefetch: 2")
    top = empty_blobs(2)
    layer.setup([], top)
    pre = layer._prefetcher
    assert pre.queue.maxsize == 2 and pre.thread.daemon
    layer.forward([], top)
    layer.close()
    assert not pre.thread.is_alive()
    layer.close()  # idempotent
    with pytest.raises(DataError, match="prefetch thread is not running"):
        layer.forward([], top)
    # A layer that is simply dropped stops its thread too.
    layer = data_layer(path, batch=2)
    layer.setup([], empty_blobs(2))
    thread = layer._prefetcher.thread
    ref = weakref.ref(layer)
    del layer
    gc.collect()
    assert ref() is None
    thread.join(timeout=5)
    assert not thread.is_alive()


def net_text(source_path: str, backend: str = "backend: LMDB") -> caffe_pb2.NetParameter:
    return parse_text(
        f"""name: "t"
        layer {{ name: "mnist" type: "Data" top: "data" top: "label"
                data_param {{ source: "{source_path}" batch_size: 2 {backend} }} }}""",
        caffe_pb2.NetParameter(),
    )


def test_missing_source_is_a_clear_error_at_net_setup(tmp_path):
    missing = tmp_path / "no_such_lmdb"
    with pytest.raises(DataError, match=rf"layer 'mnist' \(Data\): {missing}: database not found"):
        caffe.Net(net_text(str(missing)), caffe.TRAIN)
    pytest.importorskip("plyvel")
    with pytest.raises(DataError, match=r"layer 'mnist' \(Data\): .*no_such_lmdb: database not found"):
        caffe.Net(net_text(str(missing), backend=""), caffe.TRAIN)  # BVLC's default backend: LEVELDB
    with pytest.raises(DataError, match="data_param.source is empty"):
        data_layer("", batch=2).setup([], empty_blobs(1))


def test_corrupt_record_raises_in_forward(tmp_path):
    path = tmp_path / "bad"
    with LMDBWriter(path) as w:
        w.put(b"00000000", caffe_pb2.Datum(channels=1, height=2, width=2, data=b"abcd").SerializeToString())
        w.put(b"00000001", caffe_pb2.Datum(channels=1, height=3, width=2, data=b"abcdef").SerializeToString())
    layer = data_layer(path, batch=2)
    top = empty_blobs(2)
    layer.setup([], top)
    with pytest.raises(DataError, match=r"record b'00000001' has shape \(1, 3, 2\).*\(1, 2, 2\)"):
        layer.forward([], top)
    layer.close()


def test_net_forward_reads_the_database(source):
    path, images, labels = source
    net = caffe.Net(net_text(str(path)), caffe.TEST)
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data, images[:2])
    np.testing.assert_array_equal(net.blobs["label"].data, labels[:2])
    net.forward()
    np.testing.assert_array_equal(net.blobs["label"].data, labels[2:4])
    net.layers[0].close()


@pytest.mark.gpu
def test_device_cache_serves_the_same_batches_and_replays(source, gpu_mode, tmp_path):
    """cache_on_device: batches gathered on the device equal the host reader's (with rand_skip and
    wrap-around), a training iteration including the data layer replays as one CUDA graph, and the
    read position survives a snapshot and restore."""
    path, images, labels = source
    cached = data_layer(path, batch=4, extra="cache_on_device: true", transform="scale: 0.5", dtype=np.float32)
    top = empty_blobs(2, np.float32)
    cached.setup([], top)
    assert cached.traits.graph_safe and cached._cache is not None
    order = np.arange(4 * 5) % N
    for b in range(5):
        cached.forward([], top)
        idx = order[4 * b : 4 * b + 4]
        np.testing.assert_array_equal(top[0].data, images[idx].astype(np.float32) * 0.5)
        np.testing.assert_array_equal(top[1].data, labels[idx])
    assert cached.read_state()[0] == 20 % N
    cached.restore_read_state(3, b"%08d" % 3, "")
    cached.forward([], top)
    np.testing.assert_array_equal(top[1].data, labels[[3, 4, 5, 6]])
    with pytest.raises(DataError, match="does not match"):
        cached.restore_read_state(3, b"nope", "")

    net = tmp_path / "net.prototxt"  # labels are 100 + i: 110 outputs make them valid classes
    net.write_text(f'''
layer {{ name: "d" type: "Data" top: "data" top: "label"
        data_param {{ source: "{path}" batch_size: 4 backend: LMDB cache_on_device: true }}
        transform_param {{ scale: 0.00390625 }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param {{ num_output: 110 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}''')
    sp = caffe_pb2.SolverParameter(base_lr=0.01, lr_policy="fixed", max_iter=100, display=0, random_seed=1,
                                   net=str(net), snapshot_prefix=str(tmp_path / "s"))
    solver = caffe.get_solver(sp, progress=False)
    assert solver._replayed.possible()  # the data layer is inside the replayed iteration
    solver.step(6)
    assert solver.net.executor.replays >= 4
    assert np.isfinite(solver.smoothed_loss)


def test_leveldb_source_matches_lmdb_and_resumes(source, tmp_path):
    """BVLC's default backend (no ``backend:``) reads a LevelDB: same batches as the LMDB, and a
    restored read position continues exactly."""
    pytest.importorskip("plyvel")
    from pycaffe_lite.data import db

    path, images, labels = source
    ldb = tmp_path / "ldb"
    with db.open(path, "lmdb") as cur, db.open(ldb, "leveldb", "new") as w:
        for _ in range(len(cur)):
            w.put(cur.key(), cur.value())
            cur.next()
    layer = make_layer(f'type: "Data" data_param {{ source: "{ldb}" batch_size: 3 }}', np.float64)
    top = empty_blobs(2)
    layer.setup([], top)
    got = []
    for _ in range(4):
        layer.forward([], top)
        got.append((top[0].cpu_data().copy(), top[1].cpu_data().copy()))
    order = np.arange(12) % N
    for b, (data, lab) in enumerate(got):
        idx = order[3 * b: 3 * b + 3]
        np.testing.assert_array_equal(data, images[idx].astype(np.float64))
        np.testing.assert_array_equal(lab, labels[idx])
    layer2 = make_layer(f'type: "Data" data_param {{ source: "{ldb}" batch_size: 3 }}', np.float64)
    top2 = empty_blobs(2)
    layer2.setup([], top2)
    layer2.forward([], top2)
    saved = layer2.read_state()
    assert saved[0] == 3 and saved[1] == b"00000003"
    layer2.restore_read_state(*saved)
    layer2.forward([], top2)
    np.testing.assert_array_equal(top2[0].cpu_data(), got[1][0])
    layer.close()
    layer2.close()


@pytest.mark.slow
def test_lmdb_replaced_under_a_training_data_layer(source, tmp_path):
    """Copying another database over the one a Data layer reads stops the run with a DataError (in
    a child process: a SIGBUS there would not take the test run down)."""
    import subprocess
    import sys
    import textwrap

    path, _, _ = source
    victim = tmp_path / "victim"
    import shutil

    shutil.copytree(path, victim)
    small = tmp_path / "small"
    with LMDBWriter(small) as w:
        w.put(b"00000000", caffe_pb2.Datum(channels=C, height=H, width=W, data=bytes(C * H * W)).SerializeToString())
    code = textwrap.dedent(f"""
        import shutil, numpy as np
        from pycaffe_lite.testing.layer_testing import make_layer, empty_blobs
        from pycaffe_lite.errors import DataError
        layer = make_layer('type: "Data" data_param {{ source: "{victim}" batch_size: 2 backend: LMDB prefetch: 1 }}',
                           np.float32)
        top = empty_blobs(2, np.float32)
        layer.setup([], top)
        layer.forward([], top)
        import time
        while not layer._prefetcher.queue.full():  # the reader idle: no read races the copy (see docs)
            time.sleep(0.01)
        shutil.copyfile("{small}/data.mdb", "{victim}/data.mdb")
        try:
            for _ in range(20):
                layer.forward([], top)
        except DataError as exc:
            print("DataError:", exc)
        """)
    import os

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert "DataError:" in out.stdout and "rewritten" in out.stdout, out.stdout + out.stderr
