"""HDF5Data layer: batches, cycling across files, shuffle determinism, shapes, errors, net use."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import DataError, NetError
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer

h5py = pytest.importorskip("h5py")


def write_h5(path, **datasets):
    with h5py.File(path, "w") as f:
        for name, arr in datasets.items():
            f.create_dataset(name, data=arr)


@pytest.fixture
def two_files(tmp_path, monkeypatch):
    """Two files (3 and 4 rows) of data (n, 2, 3) and label (n,); list with relative paths."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(3)
    data = rng.standard_normal((7, 2, 3))
    label = 10.0 + np.arange(7)
    write_h5(tmp_path / "a.h5", data=data[:3], label=label[:3])
    (tmp_path / "sub").mkdir()
    write_h5(tmp_path / "sub" / "b.h5", data=data[3:], label=label[3:].astype(np.int32))
    (tmp_path / "list.txt").write_text("a.h5\nsub/b.h5\n")
    return data, label


def hdf5_layer(source="list.txt", batch=2, shuffle=False, tops=("data", "label"), dtype=np.float64):
    top_text = " ".join(f'top: "{t}"' for t in tops)
    return make_layer(
        f'name: "h5" type: "HDF5Data" {top_text} hdf5_data_param {{ source: "{source}" batch_size: {batch} '
        f"shuffle: {'true' if shuffle else 'false'} }}",
        dtype,
    )


def test_batches_cycle_across_files_in_order(two_files):
    data, label = two_files
    layer = hdf5_layer(batch=3)
    top = empty_blobs(2)
    layer.setup([], top)
    assert top[0].shape == (3, 2, 3) and top[1].shape == (3,)
    for b in range(5):  # 15 rows: wraps around the 7 rows twice
        layer.forward([], top)
        idx = np.arange(3 * b, 3 * b + 3) % 7
        np.testing.assert_array_equal(top[0].cpu_data(), data[idx])
        np.testing.assert_array_equal(top[1].cpu_data(), label[idx])


def test_single_top_and_any_dataset_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    feats = np.arange(20, dtype=np.float32).reshape(5, 4)
    write_h5("f.h5", features=feats, other=np.zeros((2,)))
    (tmp_path / "l.txt").write_text("f.h5")
    layer = hdf5_layer(source="l.txt", batch=2, tops=("features",), dtype=np.float32)
    top = empty_blobs(1, np.float32)
    layer.setup([], top)
    assert top[0].shape == (2, 4) and top[0].cpu_data().dtype == np.float32
    got = []
    for _ in range(5):
        layer.forward([], top)
        got.append(top[0].cpu_data().copy())
    np.testing.assert_array_equal(np.concatenate(got), feats[np.arange(10) % 5])


def test_absolute_paths_and_token_list(tmp_path):
    write_h5(tmp_path / "x.h5", data=np.arange(3.0)[:, None], label=np.arange(3.0))
    src = tmp_path / "list.txt"
    src.write_text(f"  {tmp_path / 'x.h5'}   \n\n")
    layer = hdf5_layer(source=str(src), batch=4)
    top = empty_blobs(2)
    layer.setup([], top)
    layer.forward([], top)
    np.testing.assert_array_equal(top[1].cpu_data(), [0, 1, 2, 0])
    assert top[0].shape == (4, 1)


def served_labels(seed, forwards=7):
    caffe.set_random_seed(seed)
    layer = hdf5_layer(batch=3, shuffle=True)
    top = empty_blobs(2)
    layer.setup([], top)
    out = []
    for _ in range(forwards):
        layer.forward([], top)
        out.append(top[1].cpu_data().copy())
    return np.concatenate(out), layer


def test_shuffle_is_seeded_and_covers_each_epoch(two_files):
    _, label = two_files
    a, _ = served_labels(5)
    b, _ = served_labels(5)
    np.testing.assert_array_equal(a, b)  # same seed, same order
    for epoch in range(3):  # 7 forwards of 3 = 3 epochs of the 7 rows
        got = a[7 * epoch : 7 * epoch + 7]
        np.testing.assert_array_equal(np.sort(got), label)  # every row once per epoch
        # the rows of one file are served together, then those of the other file
        n_first = 3 if got[0] < 13 else 4
        assert set(got[:n_first]) in (set(label[:3]), set(label[3:]))
    orders = {tuple(served_labels(s)[0]) for s in range(6)}
    assert len(orders) > 1, "shuffle never changed the order"


def test_shuffle_keeps_data_label_pairs(two_files):
    data, label = two_files
    caffe.set_random_seed(11)
    layer = hdf5_layer(batch=7, shuffle=True)
    top = empty_blobs(2)
    layer.setup([], top)
    for _ in range(3):
        layer.forward([], top)
        idx = (top[1].cpu_data() - 10).astype(int)
        np.testing.assert_array_equal(top[0].cpu_data(), data[idx])


def test_errors_name_layer_and_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"layer 'h5' \(HDF5Data\): cannot open source file nope.txt"):
        hdf5_layer(source="nope.txt").setup([], empty_blobs(2))
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(DataError, match="empty.txt lists no HDF5 files"):
        hdf5_layer(source="empty.txt").setup([], empty_blobs(2))
    (tmp_path / "missing.txt").write_text("gone.h5\n")
    with pytest.raises(DataError, match=r"HDF5 file gone.h5 \(listed in missing.txt\) not found"):
        hdf5_layer(source="missing.txt").setup([], empty_blobs(2))
    write_h5("nolabel.h5", data=np.zeros((2, 3)))
    (tmp_path / "nl.txt").write_text("nolabel.h5\n")
    with pytest.raises(DataError, match="nolabel.h5 has no dataset 'label'"):
        hdf5_layer(source="nl.txt").setup([], empty_blobs(2))
    write_h5("uneven.h5", data=np.zeros((2, 3)), label=np.zeros(3))
    (tmp_path / "u.txt").write_text("uneven.h5\n")
    with pytest.raises(DataError, match="'label' has 3 rows, 'data' has 2"):
        hdf5_layer(source="u.txt").setup([], empty_blobs(2))
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    (tmp_path / "j.txt").write_text("junk.h5\n")
    with pytest.raises(DataError, match="cannot read HDF5 file junk.h5"):
        hdf5_layer(source="j.txt").setup([], empty_blobs(2))
    write_h5("ok.h5", data=np.zeros((2, 3)), label=np.zeros(2))
    write_h5("wide.h5", data=np.zeros((2, 4)), label=np.zeros(2))
    (tmp_path / "w.txt").write_text("ok.h5 wide.h5\n")
    layer = hdf5_layer(source="w.txt", batch=2)
    layer.setup([], top := empty_blobs(2))
    with pytest.raises(DataError, match=r"wide.h5: dataset 'data' has rows of shape \(4,\), earlier files have"):
        layer.forward([], top)
    with pytest.raises(NetError, match="batch_size must be positive"):
        hdf5_layer(batch=0).setup([], empty_blobs(2))


def test_graph_unsafe():
    from pycaffe_lite.layer import layer_class

    assert layer_class("HDF5Data").traits.graph_safe is False


def test_net_hdf5_data_feeds_inner_product(two_files, mode):
    data, label = two_files
    net = caffe.Net(
        parse_text(
            """name: "h5net"
            layer { name: "h5" type: "HDF5Data" top: "data" top: "label"
                    hdf5_data_param { source: "list.txt" batch_size: 4 } }
            layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
                    inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 }
                                          bias_filler { type: "constant" value: 0.25 } } }""",
            caffe_pb2.NetParameter(),
        ),
        caffe.TEST,
    )
    w, b = net.params["ip"][0].data.copy(), net.params["ip"][1].data.copy()
    for step in range(3):
        net.forward()
        idx = np.arange(4 * step, 4 * step + 4) % 7
        x = data[idx].reshape(4, -1)
        np.testing.assert_allclose(net.blobs["data"].data, data[idx], rtol=1e-6)
        np.testing.assert_array_equal(net.blobs["label"].data, label[idx])
        np.testing.assert_allclose(net.blobs["ip"].data, x @ w.T + b, rtol=1e-4, atol=1e-5)
