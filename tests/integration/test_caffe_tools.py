"""BVLC's tools as commands: convert_imageset (pixels, gray, resize, encoded, shuffle, check_size,
LevelDB), compute_image_mean, convert_cifar_data, convert_mnist_data, convert_mnist_siamese_data,
extract_features and the three upgrade tools, through ``caffe <tool>`` and the tools' own entry points."""

import gzip
import struct
import sys

import numpy as np
import pytest

from pycaffe_lite import glog
from pycaffe_lite.commands import caffe_cli
from pycaffe_lite.schema import caffe_pb2

cv2 = pytest.importorskip("cv2")
lmdb = pytest.importorskip("lmdb")


@pytest.fixture(autouse=True)
def _restore_logging():
    yield
    glog.close_log_files()
    glog.init_log()


def lmdb_records(path):
    env = lmdb.open(str(path), readonly=True, lock=False)
    with env.begin() as txn:
        out = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    env.close()
    return out


def datums(records):
    out = []
    for k, v in records:
        d = caffe_pb2.Datum()
        d.ParseFromString(v)
        out.append((k.decode(), d))
    return out


def raw_chw(d):
    return np.frombuffer(d.data, np.uint8).reshape(d.channels, d.height, d.width)


@pytest.fixture
def images(tmp_path):
    """Five 6x8 BGR PNGs with labels 0..4 and a list file (one path holds a space)."""
    rng = np.random.default_rng(3)
    root = tmp_path / "imgs"
    root.mkdir()
    arrays, lines = {}, []
    for i in range(5):
        name = f"im {i}.png" if i == 2 else f"im{i}.png"
        arr = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
        assert cv2.imwrite(str(root / name), arr)
        arrays[name] = arr
        lines.append(f"{name} {i}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    return root, tmp_path / "list.txt", arrays


def _bilinear(img, h, w):
    """Half-pixel-centre bilinear with clamped borders (OpenCV's INTER_LINEAR), in float."""
    H, W = img.shape[:2]
    out = np.zeros((h, w) + img.shape[2:])
    for i in range(h):
        y = min(max((i + 0.5) * H / h - 0.5, 0), H - 1)
        y0 = int(y)
        y1 = min(y0 + 1, H - 1)
        for j in range(w):
            x = min(max((j + 0.5) * W / w - 0.5, 0), W - 1)
            x0 = int(x)
            x1 = min(x0 + 1, W - 1)
            fy, fx = y - y0, x - x0
            out[i, j] = (img[y0, x0] * (1 - fy) * (1 - fx) + img[y0, x1] * (1 - fy) * fx
                         + img[y1, x0] * fy * (1 - fx) + img[y1, x1] * fy * fx)
    return out


def test_convert_imageset_pixels_keys_and_labels(images, tmp_path):
    root, listfile, arrays = images
    db = tmp_path / "train_lmdb"
    assert caffe_cli.run(["convert_imageset", f"{root}/", str(listfile), str(db)]) == 0
    recs = datums(lmdb_records(db))
    names = list(arrays)
    assert [k for k, _ in recs] == [f"{i:08d}_{n}" for i, n in enumerate(names)]
    for i, (_, d) in enumerate(recs):
        assert d.label == i and not d.encoded and (d.channels, d.height, d.width) == (3, 6, 8)
        np.testing.assert_array_equal(raw_chw(d), arrays[names[i]].transpose(2, 0, 1))  # BGR, channel-major


def test_convert_imageset_gray_and_resize(images, tmp_path):
    root, listfile, arrays = images
    db = tmp_path / "g"
    assert caffe_cli.run(["convert_imageset", "-gray", f"{root}/", str(listfile), str(db)]) == 0
    for (_, d), arr in zip(datums(lmdb_records(db)), arrays.values()):
        assert (d.channels, d.height, d.width) == (1, 6, 8)
        b, g, r = (arr[..., c].astype(float) for c in range(3))
        gray = 0.299 * r + 0.587 * g + 0.114 * b  # BT.601, as OpenCV's BGR2GRAY (in fixed point)
        assert np.abs(raw_chw(d)[0] - gray).max() <= 1.0
    dbr = tmp_path / "gr"
    assert caffe_cli.run(["convert_imageset", "-gray", "-resize_height=4", "-resize_width", "5", f"{root}/",
                          str(listfile), str(dbr)]) == 0
    for (_, d), (_, g) in zip(datums(lmdb_records(dbr)), datums(lmdb_records(db))):
        assert (d.channels, d.height, d.width) == (1, 4, 5)
        assert np.abs(raw_chw(d)[0] - _bilinear(raw_chw(g)[0].astype(float), 4, 5)).max() <= 1.0
    db2 = tmp_path / "c"
    assert caffe_cli.run(["convert_imageset", "--resize_height=9", "--resize_width=12", f"{root}/", str(listfile),
                          str(db2)]) == 0
    for (_, d), arr in zip(datums(lmdb_records(db2)), arrays.values()):
        assert (d.channels, d.height, d.width) == (3, 9, 12)
        assert np.abs(raw_chw(d).transpose(1, 2, 0) - _bilinear(arr.astype(float), 9, 12)).max() <= 1.01


def test_convert_imageset_encoded_shuffle_and_skips(images, tmp_path, capsys):
    root, listfile, arrays = images
    listfile.write_text(listfile.read_text() + "missing.png 7\n")
    db = tmp_path / "enc"
    assert caffe_cli.run(["convert_imageset", "-encoded", "-shuffle", f"{root}/", str(listfile), str(db)]) == 0
    recs = datums(lmdb_records(db))
    assert len(recs) == 5 and "Could not open or find file" in capsys.readouterr().err
    names = list(arrays)
    seen = {}
    for key, d in recs:
        line_id, _, name = key.partition("_")
        assert d.encoded and name in arrays and d.label == names.index(name)
        assert d.data == (root / name).read_bytes()  # the PNG itself: nothing to change
        seen[name] = int(line_id)
    assert sorted(seen) == sorted(names)
    db2 = tmp_path / "jpg"
    assert caffe_cli.run(["convert_imageset", "-encode_type", "jpg", f"{root}/", str(listfile), str(db2)]) == 0
    for (_, d), arr in zip(datums(lmdb_records(db2)), arrays.values()):
        assert d.encoded and d.data[:2] == b"\xff\xd8"  # a JPEG
        back = cv2.imdecode(np.frombuffer(d.data, np.uint8), cv2.IMREAD_COLOR)
        assert back.shape == arr.shape


def test_convert_imageset_check_size_and_errors(images, tmp_path, capsys):
    root, listfile, arrays = images
    assert cv2.imwrite(str(root / "big.png"), np.zeros((7, 8, 3), np.uint8))
    listfile.write_text(listfile.read_text() + "big.png 1\n")
    assert caffe_cli.run(["convert_imageset", "-check_size", f"{root}/", str(listfile), str(tmp_path / "x")]) == 1
    assert "Incorrect data field size 168" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # nothing half-written under the final name
    assert caffe_cli.run(["convert_imageset", f"{root}/", str(listfile)]) == 1
    assert "Usage: convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME" in capsys.readouterr().err
    assert caffe_cli.run(["convert_imageset", "-backend", "rocksdb", f"{root}/", str(listfile), "y"]) == 1
    assert "unknown database backend" in capsys.readouterr().err
    (tmp_path / "bad.txt").write_text("no_label_here\n")
    assert caffe_cli.run(["convert_imageset", f"{root}/", str(tmp_path / "bad.txt"), str(tmp_path / "z")]) == 1
    assert "bad.txt:1: expected 'path label'" in capsys.readouterr().err


def test_convert_imageset_leveldb(images, tmp_path, monkeypatch):
    plyvel = pytest.importorskip("plyvel")
    root, listfile, arrays = images
    db = tmp_path / "ldb"
    monkeypatch.setattr(sys, "argv", ["convert_imageset", "-backend", "leveldb", f"{root}/", str(listfile), str(db)])
    assert caffe_cli.convert_imageset() == 0  # the console script's entry point
    handle = plyvel.DB(str(db))
    recs = datums(list(handle.iterator()))
    handle.close()
    assert [d.label for _, d in recs] == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(raw_chw(recs[1][1]), arrays["im1.png"].transpose(2, 0, 1))
    # compute_image_mean reads it back
    out = tmp_path / "mean.binaryproto"
    assert caffe_cli.run(["compute_image_mean", "-backend=leveldb", str(db), str(out)]) == 0
    blob = caffe_pb2.BlobProto()
    blob.ParseFromString(out.read_bytes())
    mean = np.mean([a.transpose(2, 0, 1).astype(np.float64) for a in arrays.values()], axis=0)
    np.testing.assert_allclose(np.asarray(blob.data).reshape(3, 6, 8), mean, rtol=1e-6)


def test_compute_image_mean(images, tmp_path, capsys):
    root, listfile, arrays = images
    db = tmp_path / "db"
    assert caffe_cli.run(["convert_imageset", "-encoded", f"{root}/", str(listfile), str(db)]) == 0
    out = tmp_path / "mean.binaryproto"
    capsys.readouterr()
    monkey_argv = [str(db), str(out)]
    assert caffe_cli.run(monkey_argv, program="compute_image_mean") == 0
    blob = caffe_pb2.BlobProto()
    blob.ParseFromString(out.read_bytes())
    assert (blob.num, blob.channels, blob.height, blob.width) == (1, 3, 6, 8)
    mean = np.mean([a.transpose(2, 0, 1).astype(np.float64) for a in arrays.values()], axis=0)
    np.testing.assert_allclose(np.asarray(blob.data).reshape(3, 6, 8), mean, rtol=1e-6)
    err = capsys.readouterr().err
    assert "Number of channels: 3" in err
    for c in range(3):
        assert f"mean_value channel [{c}]: {mean[c].mean():g}" in err
    # usable as a Data layer's mean_file
    from pycaffe_lite import io as cio
    np.testing.assert_allclose(cio.blobproto_to_array(blob)[0], mean, rtol=1e-6)


def _cifar_batch(rng, n, label_offset=0):
    labels = (np.arange(n) + label_offset) % 10
    pixels = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    raw = b"".join(bytes([int(lab)]) + px.tobytes() for lab, px in zip(labels, pixels))
    return raw, labels, pixels


def test_convert_cifar_data(tmp_path):
    rng = np.random.default_rng(5)
    src = tmp_path / "cifar-10-batches-bin"
    src.mkdir()
    batches = []
    for b in range(5):
        raw, labels, pixels = _cifar_batch(rng, 3, b)
        (src / f"data_batch_{b + 1}.bin").write_bytes(raw)
        batches.append((labels, pixels))
    raw, test_labels, test_pixels = _cifar_batch(rng, 4)
    (src / "test_batch.bin").write_bytes(raw)
    out = tmp_path / "out"
    out.mkdir()
    assert caffe_cli.run(["convert_cifar_data", str(src), str(out), "lmdb"]) == 0
    train = datums(lmdb_records(out / "cifar10_train_lmdb"))
    assert [k for k, _ in train] == [f"{b * 10000 + i:05d}" for b in range(5) for i in range(3)]
    for idx, (_, d) in enumerate(train):
        labels, pixels = batches[idx // 3]
        assert (d.channels, d.height, d.width, d.label) == (3, 32, 32, labels[idx % 3])
        assert d.data == pixels[idx % 3].tobytes()
    test = datums(lmdb_records(out / "cifar10_test_lmdb"))
    assert [k for k, _ in test] == ["00000", "00001", "00002", "00003"]
    assert [d.label for _, d in test] == list(test_labels)
    (src / "data_batch_5.bin").unlink()
    assert caffe_cli.run(["convert_cifar_data", str(src), str(tmp_path / "o2"), "lmdb"]) == 1
    (src / "data_batch_5.bin").write_bytes(b"\x00" * 100)
    assert caffe_cli.run(["convert_cifar_data", str(src), str(tmp_path / "o3"), "lmdb"]) == 1


def _idx(tmp_path, n=6, gz=False):
    rng = np.random.default_rng(9)
    imgs = np.stack([np.full((4, 5), 10 * i, np.uint8) for i in range(n)])  # each image identifiable
    imgs[:, 0, 0] = rng.integers(0, 256, size=n)
    labels = np.array([i % 3 for i in range(n)], np.uint8)
    opener = gzip.open if gz else open
    ip, lp = tmp_path / ("i.idx" + (".gz" if gz else "")), tmp_path / ("l.idx" + (".gz" if gz else ""))
    with opener(ip, "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, 4, 5) + imgs.tobytes())
    with opener(lp, "wb") as f:
        f.write(struct.pack(">II", 2049, n) + labels.tobytes())
    return ip, lp, imgs, labels


def test_convert_mnist_data(tmp_path):
    ip, lp, imgs, labels = _idx(tmp_path, gz=True)
    db = tmp_path / "mnist_lmdb"
    assert caffe_cli.run(["convert_mnist_data", str(ip), str(lp), str(db), "--backend=lmdb"]) == 0
    recs = datums(lmdb_records(db))
    assert [k for k, _ in recs] == [f"{i:08d}" for i in range(6)]
    for i, (_, d) in enumerate(recs):
        assert (d.channels, d.height, d.width, d.label) == (1, 4, 5, labels[i])
        np.testing.assert_array_equal(raw_chw(d)[0], imgs[i])


def test_convert_mnist_siamese_data(tmp_path):
    pytest.importorskip("plyvel")
    import plyvel

    ip, lp, imgs, labels = _idx(tmp_path, n=20)
    db = tmp_path / "siamese_leveldb"
    assert caffe_cli.run(["convert_mnist_siamese_data", str(ip), str(lp), str(db)]) == 0
    handle = plyvel.DB(str(db))
    recs = datums(list(handle.iterator()))
    handle.close()
    assert [k for k, _ in recs] == [f"{i:08d}" for i in range(20)]
    for _, d in recs:
        pair = raw_chw(d)
        assert pair.shape == (2, 4, 5)
        i, j = (int(p[1, 1]) // 10 for p in pair)  # which images (their fill value)
        np.testing.assert_array_equal(pair[0], imgs[i])
        np.testing.assert_array_equal(pair[1], imgs[j])
        assert d.label == int(labels[i] == labels[j])


def test_extract_features(images, tmp_path):
    root, listfile, arrays = images
    db = tmp_path / "db"
    assert caffe_cli.run(["convert_imageset", f"{root}/", str(listfile), str(db)]) == 0
    net = tmp_path / "feat.prototxt"
    net.write_text(f"""
layer {{ name: "data" type: "Data" top: "data" top: "label"
        data_param {{ source: "{db}" backend: LMDB batch_size: 2 }} transform_param {{ scale: 0.01 }} }}
layer {{ name: "fc" type: "InnerProduct" bottom: "data" top: "fc"
        inner_product_param {{ num_output: 3 weight_filler {{ type: "gaussian" std: 0.1 }}
                               bias_filler {{ type: "constant" value: 0.5 }} }} }}
""")
    import pycaffe_lite as pc

    model = pc.Net(str(net), pc.TEST)
    weights = tmp_path / "w.caffemodel"
    model.save(str(weights))
    w, b = (p.data.copy() for p in model.params["fc"])
    out_fc, out_data = tmp_path / "fc_feats", tmp_path / "data_feats"
    assert caffe_cli.run(["extract_features", str(weights), str(net), "fc,data", f"{out_fc},{out_data}", "3",
                          "lmdb", "CPU"]) == 0
    fc = datums(lmdb_records(out_fc))
    assert [k for k, _ in fc] == [f"{i:010d}" for i in range(6)]  # 3 batches of 2 (the db wraps around)
    names = list(arrays)
    for i, (_, d) in enumerate(fc):
        x = arrays[names[i % 5]].transpose(2, 0, 1).astype(np.float64).ravel() * 0.01
        assert (d.channels, d.height, d.width) == (3, 1, 1)
        np.testing.assert_allclose(d.float_data, w @ x + b, rtol=1e-4, atol=1e-5)
    data = datums(lmdb_records(out_data))
    assert (data[0][1].channels, data[0][1].height, data[0][1].width) == (3, 6, 8)
    assert caffe_cli.run(["extract_features", str(weights), str(net), "nope", str(tmp_path / "n"), "1", "lmdb"]) == 1


V1_NET = """
name: "old"
input: "data"
input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 3
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv" blobs_lr: 1 blobs_lr: 2
         convolution_param { num_output: 4 kernel_size: 2 } }
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
"""


def test_upgrade_tools(tmp_path, capsys):
    src, dst = tmp_path / "old.prototxt", tmp_path / "new.prototxt"
    src.write_text(V1_NET)
    assert caffe_cli.run(["upgrade_net_proto_text", str(src), str(dst)]) == 0
    from google.protobuf import text_format

    new = text_format.Parse(dst.read_text(), caffe_pb2.NetParameter())
    assert not new.layers and [lay.type for lay in new.layer] == ["Input", "Convolution", "ReLU"]
    assert [p.lr_mult for p in new.layer[1].param] == [1, 2]
    assert list(new.layer[0].input_param.shape[0].dim) == [1, 2, 3, 3]
    # already current: written unchanged with BVLC's message
    assert caffe_cli.run(["upgrade_net_proto_text", str(dst), str(tmp_path / "again.prototxt")]) == 0
    assert "File already in latest proto format" in capsys.readouterr().err
    # binary
    bsrc, bdst = tmp_path / "old.caffemodel", tmp_path / "new.caffemodel"
    bsrc.write_bytes(text_format.Parse(V1_NET, caffe_pb2.NetParameter()).SerializeToString())
    assert caffe_cli.run(["upgrade_net_proto_binary", str(bsrc), str(bdst)]) == 0
    binary = caffe_pb2.NetParameter()
    binary.ParseFromString(bdst.read_bytes())
    assert binary == new
    # unparsable input: status 2
    (tmp_path / "junk.prototxt").write_text("layer { nope")
    assert caffe_cli.run(["upgrade_net_proto_text", str(tmp_path / "junk.prototxt"), str(tmp_path / "j")]) == 2
    # solver
    (tmp_path / "s.prototxt").write_text('net: "n.prototxt"\nbase_lr: 0.01\nsolver_type: ADAM\n')
    assert caffe_cli.run(["upgrade_solver_proto_text", str(tmp_path / "s.prototxt"), str(tmp_path / "s2.prototxt")]) \
        == 0
    solver = text_format.Parse((tmp_path / "s2.prototxt").read_text(), caffe_pb2.SolverParameter())
    assert solver.type == "Adam" and not solver.HasField("solver_type")


def test_tools_are_pycaffe_lite_subcommands_too(images, tmp_path):
    from pycaffe_lite.commands import cli

    root, listfile, arrays = images
    db = tmp_path / "via_cli"
    assert cli.main(["convert_imageset", "--gray", "-resize_height", "3", "--resize_width=4", f"{root}/",
                     str(listfile), str(db)]) == 0
    recs = datums(lmdb_records(db))
    assert len(recs) == 5 and (recs[0][1].channels, recs[0][1].height, recs[0][1].width) == (1, 3, 4)
    out = tmp_path / "m.binaryproto"
    assert cli.main(["compute_image_mean", str(db), str(out)]) == 0 and out.is_file()


V0_NET = """
name: "v0"
layers { layer { name: "data" type: "data" source: "some_db" batchsize: 2 } top: "data" top: "label" }
layers { layer { name: "ip" type: "innerproduct" num_output: 3 } bottom: "data" top: "ip" }
layers { layer { name: "out" type: "hdf5_output" hdf5_output_param { file_name: "out.h5" } }
         bottom: "ip" bottom: "label" }
"""


def test_upgrade_v0_net_with_hdf5_output(tmp_path):
    # was a raw KeyError: the V0 hdf5_output_param message is carried over whole
    src, dst = tmp_path / "v0.prototxt", tmp_path / "v2.prototxt"
    src.write_text(V0_NET)
    assert caffe_cli.run(["upgrade_net_proto_text", str(src), str(dst)]) == 0
    from google.protobuf import text_format

    new = text_format.Parse(dst.read_text(), caffe_pb2.NetParameter())
    assert [lay.type for lay in new.layer] == ["Data", "InnerProduct", "HDF5Output"]
    assert new.layer[2].hdf5_output_param.file_name == "out.h5"
    assert new.layer[0].data_param.source == "some_db" and new.layer[0].data_param.batch_size == 2
    assert new.layer[1].inner_product_param.num_output == 3


def test_tool_log_files_are_named_after_the_tool(images, tmp_path):
    root, listfile, _ = images
    db = tmp_path / "db"
    assert caffe_cli.run(["-log_dir", str(tmp_path / "logs"), f"{root}/", str(listfile), str(db)],
                         program="convert_imageset") == 0
    info = (tmp_path / "logs" / "convert_imageset.INFO").read_text()
    assert "] A total of 5 images." in info and "] Processed 5 files." in info
    assert (tmp_path / "logs" / "convert_imageset.INFO").resolve().name.startswith("convert_imageset.")


def test_tools_refuse_an_existing_database(tmp_path, capsys):
    """Databases are created new (BVLC's db NEW), for both backends, with a message to remove the old
    one (BVLC's tools have no -overwrite); the existing database is left as it was."""
    ip, lp, _, _ = _idx(tmp_path)
    for backend in ("lmdb", "leveldb"):
        if backend == "leveldb":
            pytest.importorskip("plyvel")
        out = tmp_path / f"out_{backend}"
        out.mkdir()
        (out / "keep").write_text("x")
        assert caffe_cli.run(["convert_mnist_data", str(ip), str(lp), str(out), f"--backend={backend}"]) != 0
        assert "already exists (remove it first)" in capsys.readouterr().err
        assert [p.name for p in out.iterdir()] == ["keep"]
