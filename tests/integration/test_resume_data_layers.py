"""Exact resume for every data layer that reads on: a run interrupted by a snapshot and resumed
from it ends with the same weights, bit for bit on the CPU, as one that ran through (ImageData with
shuffle, mirror and crop; HDF5Data over two files with shuffle; MemoryData; DummyData). The Data
layer's case is in test_faults.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import DataError
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.solvers.sgd_solvers import get_solver

BODY = """
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "drop" type: "Dropout" bottom: "conv" top: "conv" dropout_param { dropout_ratio: 0.3 } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: %(out)d weight_filler { type: "xavier" } } }
layer { name: "loss" type: "%(loss)s" bottom: "ip" bottom: "label" top: "loss" }
"""
SOFTMAX = {"out": 5, "loss": "SoftmaxWithLoss"}


def image_feed(tmp: Path) -> tuple[str, dict]:
    """13 PNGs of 10x10 (colour), listed with labels 0-4; ImageData shuffles, mirrors, crops 8."""
    from PIL import Image

    rng = np.random.default_rng(1)
    lines = []
    for i in range(13):
        Image.fromarray(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)).save(tmp / f"im{i}.png")
        lines.append(f"im{i}.png {i % 5}\n")
    (tmp / "list.txt").write_text("".join(lines))
    net = ""
    for phase, batch, extra in (("TRAIN", 4, "shuffle: true"), ("TEST", 3, "")):
        net += (f'layer {{ name: "d" type: "ImageData" top: "data" top: "label" include {{ phase: {phase} }}\n'
                f'  image_data_param {{ source: "{tmp}/list.txt" root_folder: "{tmp}/" batch_size: {batch} '
                f'{extra} }}\n  transform_param {{ scale: 0.004 mirror: true crop_size: 8 }} }}\n')
    return net + BODY % SOFTMAX, {"test": True}


def hdf5_feed(tmp: Path) -> tuple[str, dict]:
    """Two HDF5 files of 5 and 8 rows (data 3x6x6, label 0-4) read with shuffle, batches of 3."""
    import h5py

    rng = np.random.default_rng(2)
    names = []
    for i, rows in enumerate((5, 8)):
        names.append(str(tmp / f"f{i}.h5"))
        with h5py.File(names[-1], "w") as f:
            f["data"] = rng.standard_normal((rows, 3, 6, 6)).astype(np.float32)
            f["label"] = rng.integers(0, 5, rows).astype(np.float32)
    (tmp / "list.txt").write_text("\n".join(names) + "\n")
    net = (f'layer {{ name: "d" type: "HDF5Data" top: "data" top: "label"\n'
           f'  hdf5_data_param {{ source: "{tmp}/list.txt" batch_size: 3 shuffle: true }} }}\n')
    return net + BODY % SOFTMAX, {}


def memory_feed(tmp: Path) -> tuple[str, dict]:
    """16 items of 3x6x6 served 4 at a time by MemoryData (arrays given before solving)."""
    net = ('layer { name: "d" type: "MemoryData" top: "data" top: "label"\n'
           '  memory_data_param { batch_size: 4 channels: 3 height: 6 width: 6 } }\n')
    rng = np.random.default_rng(3)
    arrays = (rng.standard_normal((16, 3, 6, 6)).astype(np.float32), rng.integers(0, 5, 16).astype(np.float32))
    return net + BODY % SOFTMAX, {"arrays": arrays}


def dummy_feed(tmp: Path) -> tuple[str, dict]:
    """DummyData draws new gaussian data and targets every forward (from the process generator)."""
    net = ('layer { name: "d" type: "DummyData" top: "data" top: "label"\n'
           '  dummy_data_param { shape { dim: 4 dim: 3 dim: 6 dim: 6 } shape { dim: 4 dim: 5 }\n'
           '    data_filler { type: "gaussian" std: 0.1 } } }\n')
    return net + BODY % {"out": 5, "loss": "EuclideanLoss"}, {}


FEEDS = {"ImageData": image_feed, "HDF5Data": hdf5_feed, "MemoryData": memory_feed, "DummyData": dummy_feed}


def make_solver(tmp: Path, net: str, opts: dict, max_iter: int, snap: int = 0):
    (tmp / "net.prototxt").write_text(net)
    sp = caffe_pb2.SolverParameter()
    sp.net = str(tmp / "net.prototxt")
    sp.base_lr, sp.momentum, sp.weight_decay, sp.lr_policy = 0.05, 0.9, 0.001, "fixed"
    sp.max_iter, sp.snapshot, sp.snapshot_prefix = max_iter, snap, str(tmp / "snap" / "t")
    sp.random_seed, sp.display = 7, 0
    if opts.get("test"):
        sp.test_iter.append(2)
        sp.test_interval = 4
    caffe.set_mode_cpu()
    solver = get_solver(sp, progress=False)
    if "arrays" in opts:
        solver.net.set_input_arrays(*opts["arrays"])
    return solver


def weights(solver) -> dict[str, list[np.ndarray]]:
    return {k: [b.data.copy() for b in v] for k, v in solver.net.params.items()}


def interrupted(tmp: Path, feed: str, strip=None) -> tuple[dict, dict]:
    """(weights after 13 uninterrupted iterations, weights after 6 + a resume to 13)."""
    net, opts = FEEDS[feed](tmp)
    s = make_solver(tmp, net, opts, 13)
    s.solve()
    want = weights(s)
    make_solver(tmp, net, opts, 6, snap=6).solve()
    state = tmp / "snap" / "t_iter_6.solverstate"
    if strip is not None:
        proto = caffe_pb2.SolverState.FromString(state.read_bytes())
        strip(proto)
        state.write_bytes(proto.SerializeToString())
    resumed = make_solver(tmp, net, opts, 13)
    resumed.solve(str(state))
    return want, weights(resumed)


@pytest.mark.parametrize("feed", sorted(FEEDS))
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, feed):
    want, got = interrupted(tmp_path, feed)
    for name, blobs in want.items():
        for w, g in zip(blobs, got[name]):
            np.testing.assert_array_equal(g, w)  # bit for bit


@pytest.mark.parametrize("feed", ["ImageData", "HDF5Data", "MemoryData"])
def test_without_the_recorded_position_the_resume_differs(tmp_path, feed):
    """The position (and shuffle / transform state) in the snapshot is what makes the resume exact."""
    want, got = interrupted(tmp_path, feed, strip=lambda state: state.ClearField("data_state"))
    assert any(not np.array_equal(w, g) for name in want for w, g in zip(want[name], got[name]))


@pytest.mark.parametrize("field", ["order", "transform"])
@pytest.mark.slow
def test_image_data_resume_needs_shuffle_and_transform_state(tmp_path, field):
    import json

    def forget(state):
        rng = json.loads(state.data_state[0].rng_state)
        rng[field] = json.loads(state.rng_state)["generator"] if field == "transform" else None
        state.data_state[0].rng_state = json.dumps(rng)

    want, got = interrupted(tmp_path, "ImageData", strip=forget)
    assert any(not np.array_equal(w, g) for name in want for w, g in zip(want[name], got[name]))


def test_snapshot_records_positions_past_a_reshuffle(tmp_path):
    import json

    for feed in ("ImageData", "HDF5Data"):
        tmp = tmp_path / feed
        tmp.mkdir()
        net, opts = FEEDS[feed](tmp)
        make_solver(tmp, net, opts, 6, snap=6).solve()
        state = caffe_pb2.SolverState.FromString((tmp / "snap" / "t_iter_6.solverstate").read_bytes())
        entry = state.data_state[0]
        rng = json.loads(entry.rng_state)
        if feed == "ImageData":  # 6 batches of 4 over 13 lines: line 11 of the second epoch's order
            assert (entry.net, entry.layer, entry.position) == ("train", "d", 11)
            assert rng["order"] is not None and entry.key.endswith(b".png")
            assert [e.net for e in state.data_state] == ["train", "test0"]
        else:  # 18 rows of 5 + 8: the file after a wrap of the file order, its row 5 or 0
            assert entry.key.decode() in (str(tmp / "f0.h5"), str(tmp / "f1.h5"))
            assert rng["files"] is not None and rng["rows"] is not None


def test_changed_image_list_is_refused_on_resume(tmp_path):
    net, opts = image_feed(tmp_path)
    make_solver(tmp_path, net, opts, 6, snap=6).solve()
    listing = tmp_path / "list.txt"
    listing.write_text("".join(reversed(listing.read_text().splitlines(keepends=True))))
    with pytest.raises(DataError, match=r"t_iter_6.solverstate: layer 'd'.*list.txt changed\?"):
        make_solver(tmp_path, net, opts, 13).solve(str(tmp_path / "snap" / "t_iter_6.solverstate"))


def test_changed_hdf5_list_is_refused_on_resume(tmp_path):
    net, opts = hdf5_feed(tmp_path)
    make_solver(tmp_path, net, opts, 6, snap=6).solve()
    (tmp_path / "list.txt").write_text(f"{tmp_path}/f0.h5\n")
    with pytest.raises(DataError, match=r"t_iter_6.solverstate: layer 'd'.*cannot restore the read position"):
        make_solver(tmp_path, net, opts, 13).solve(str(tmp_path / "snap" / "t_iter_6.solverstate"))
