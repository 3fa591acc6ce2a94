"""HDF5Output layer: datasets written with legacy 4-D shapes, accumulation over forwards, errors, net."""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import DataError, NetError
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.layer_testing import blobs, make_layer

h5py = pytest.importorskip("h5py")


def output_layer(file_name, dtype=np.float64):
    return make_layer(
        f'name: "out" type: "HDF5Output" bottom: "data" bottom: "label" '
        f'hdf5_output_param {{ file_name: "{file_name}" }}',
        dtype,
    )


def read(path):
    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in f}


def test_setup_creates_empty_file_and_forward_writes(tmp_path):
    path = tmp_path / "out.h5"
    path.write_bytes(b"old contents")
    layer = output_layer(path)
    rng = np.random.default_rng(0)
    data = rng.standard_normal((3, 2, 4, 5))
    label = np.array([1.0, 0.0, 2.0])
    bottom = blobs([data, label])
    layer.setup(bottom, [])
    assert read(path) == {}  # truncated at set-up
    layer.forward(bottom, [])
    got = read(path)
    assert set(got) == {"data", "label"}
    np.testing.assert_array_equal(got["data"], data)
    assert got["data"].dtype == np.float64
    np.testing.assert_array_equal(got["label"], label.reshape(3, 1, 1, 1))  # legacy 4-D shape


def test_forwards_accumulate_rows_float32_2d(tmp_path):
    path = tmp_path / "acc.h5"
    layer = output_layer(path, np.float32)
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((2, 6)), rng.integers(0, 5, 2).astype(float)) for _ in range(3)]
    bottom = blobs(batches[0], np.float32)
    layer.setup(bottom, [])
    for d, lab in batches:
        bottom[0].data[...] = d
        bottom[1].data[...] = lab
        layer.forward(bottom, [])
    got = read(path)
    assert got["data"].dtype == np.float32 and got["data"].shape == (6, 6, 1, 1)
    expected = np.concatenate([d for d, _ in batches]).astype(np.float32)
    np.testing.assert_array_equal(got["data"][:, :, 0, 0], expected)
    np.testing.assert_array_equal(got["label"].ravel(), np.concatenate([lab for _, lab in batches]))
    assert [p.name for p in tmp_path.iterdir()] == ["acc.h5"]  # no temporary file left behind


def test_errors(tmp_path):
    with pytest.raises(DataError, match=r"layer 'out' \(HDF5Output\): hdf5_output_param.file_name is empty"):
        output_layer("").setup(blobs([np.zeros((2, 1)), np.zeros(2)]), [])
    with pytest.raises(DataError, match=r"layer 'out' \(HDF5Output\): cannot create HDF5 file .*nodir/o.h5"):
        output_layer(tmp_path / "nodir" / "o.h5").setup(blobs([np.zeros((2, 1)), np.zeros(2)]), [])
    layer = output_layer(tmp_path / "o.h5")
    bad = blobs([np.zeros((2, 1)), np.zeros(3)])
    layer.setup(bad, [])
    with pytest.raises(NetError, match="need the same num"):
        layer.forward(bad, [])
    five = blobs([np.zeros((2, 1, 1, 1, 1)), np.zeros(2)])
    with pytest.raises(NetError, match="at most 4 axes"):
        layer.forward(five, [])
    layer.forward(blobs([np.zeros((2, 3)), np.zeros(2)]), [])
    with pytest.raises(NetError, match=r"earlier forwards wrote rows of shape \(3, 1, 1\)"):
        layer.forward(blobs([np.zeros((2, 4)), np.zeros(2)]), [])
    with pytest.raises(NetError, match="takes exactly 2 bottom"):
        output_layer(tmp_path / "x.h5").setup(blobs([np.zeros(2)]), [])


def test_net_inner_product_output_written(tmp_path, monkeypatch, mode):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(2)
    data = rng.standard_normal((6, 4))
    label = np.arange(6.0)
    with h5py.File("in.h5", "w") as f:
        f["data"] = data
        f["label"] = label
    (tmp_path / "list.txt").write_text("in.h5\n")
    net = caffe.Net(
        parse_text(
            """name: "out_net"
            layer { name: "h5" type: "HDF5Data" top: "data" top: "label"
                    hdf5_data_param { source: "list.txt" batch_size: 3 } }
            layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
                    inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 }
                                          bias_filler { type: "constant" value: -0.5 } } }
            layer { name: "save" type: "HDF5Output" bottom: "ip" bottom: "label"
                    hdf5_output_param { file_name: "preds.h5" } }""",
            caffe_pb2.NetParameter(),
        ),
        caffe.TEST,
    )
    w, b = net.params["ip"][0].data.copy(), net.params["ip"][1].data.copy()
    net.forward()
    net.forward()
    got = read(tmp_path / "preds.h5")
    np.testing.assert_allclose(got["data"][:, :, 0, 0], data @ w.T + b, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got["label"].ravel(), label)
