"""HDF5 weights: names with '/' round-trip as nested groups (GoogLeNet's inception_3a/1x1), missing
and unexpected layers as for .caffemodel, duplicate names, atomic writes under SIGKILL."""

from __future__ import annotations

import logging
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
from pycaffe_lite.errors import WeightsError

h5py = pytest.importorskip("h5py")

REPO = Path(__file__).resolve().parents[2]

SLASH_NET = """name: "slash"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "inception_3a/1x1" type: "InnerProduct" bottom: "data" top: "a"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } } }
layer { name: "inception_3a/relu_1x1" type: "ReLU" bottom: "a" top: "a" }
layer { name: "inception_3a/3x3" type: "InnerProduct" bottom: "a" top: "b"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } } }
layer { name: "out" type: "InnerProduct" bottom: "b" top: "c"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
"""


def net_of(tmp_path, text=SLASH_NET, name="net.prototxt", seed=1):
    p = tmp_path / name
    p.write_text(text)
    caffe.set_random_seed(seed)
    return caffe.Net(str(p), caffe.TEST)


def test_slash_names_round_trip(tmp_path):
    net = net_of(tmp_path)
    path = tmp_path / "w.caffemodel.h5"
    net.save_hdf5(path)
    with h5py.File(path, "r") as f:  # nested groups, as an HDF5 path names them
        np.testing.assert_array_equal(f["data/inception_3a/1x1/0"][()], net.params["inception_3a/1x1"][0].data)
        assert set(f["data/inception_3a"]) == {"1x1", "relu_1x1", "3x3"}
    other = net_of(tmp_path, seed=2)
    assert other.copy_from(path, allow_missing=False) == []
    for name in ("inception_3a/1x1", "inception_3a/3x3", "out"):
        for a, b in zip(other.params[name], net.params[name]):
            np.testing.assert_array_equal(a.data, b.data)


def test_missing_and_unexpected_layers_as_for_caffemodel(tmp_path, caplog):
    net = net_of(tmp_path)
    path = tmp_path / "w.h5"
    net.save_hdf5(path)
    with h5py.File(path, "a") as f:
        del f["data/inception_3a/3x3"]
        f.create_group("data/not_in_net").create_dataset("0", data=np.zeros(3, np.float32))
    other = net_of(tmp_path, seed=3)
    before = other.params["inception_3a/3x3"][0].data.copy()
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        missing = other.copy_from(path)
    assert missing == ["inception_3a/3x3"]
    np.testing.assert_array_equal(other.params["inception_3a/3x3"][0].data, before)
    text = caplog.text
    assert "no weights for layer inception_3a/3x3" in text and "ignoring source layer not_in_net" in text
    with pytest.raises(WeightsError, match=r"w.h5: holds no weights for layer inception_3a/3x3 .*--allow-missing"):
        other.copy_from(path, allow_missing=False)
    with h5py.File(path, "a") as f:
        del f["data/out/0"]
    with pytest.raises(WeightsError, match=r"layer 'out' lacks param 0"):
        other.copy_from(path)


def test_duplicate_names_with_params_cannot_share_one_group(tmp_path):
    text = SLASH_NET.replace('name: "out"', 'name: "inception_3a/1x1"').replace(
        'name: "inception_3a/3x3"', 'name: "mid"')
    net = net_of(tmp_path, text)
    with pytest.raises(WeightsError, match="layers 1 and 4 are both named 'inception_3a/1x1'"):
        net.save_hdf5(tmp_path / "dup.h5")
    assert not list(tmp_path.glob("*.h5")) and not list(tmp_path.glob(".*"))


def test_weights_path_kinds_are_named(tmp_path):
    net = net_of(tmp_path)
    with pytest.raises(WeightsError, match="is a folder, not a weights file"):
        net.copy_from(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(WeightsError, match=r"is a FIFO \(named pipe\), not a weights file"):
        net.copy_from(fifo)
    if os.path.exists("/dev/zero"):
        with pytest.raises(WeightsError, match="/dev/zero: is a character device, not a weights file"):
            net.copy_from("/dev/zero")
    with pytest.raises(WeightsError, match="nothing.h5: weights file not found"):
        net.copy_from(tmp_path / "nothing.h5")


@pytest.mark.slow
def test_save_is_atomic_under_sigkill(tmp_path):
    """A SIGKILL while a new file is written leaves the good file of the same name whole."""
    net_file = tmp_path / "big.prototxt"
    net_file.write_text("""name: "big"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 600 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "y"
        inner_product_param { num_output: 1500 weight_filler { type: "gaussian" } } }
""")
    target = tmp_path / "w.h5"
    caffe.set_random_seed(4)
    good = caffe.Net(str(net_file), caffe.TEST)
    good.save_hdf5(target)
    want = good.params["ip"][0].data.copy()
    code = textwrap.dedent(f"""
        import sys
        import pycaffe_lite as caffe
        net = caffe.Net({str(net_file)!r}, caffe.TEST)
        net.params["ip"][0].data[...] = 7
        print("ready", flush=True)
        while True:
            net.save_hdf5({str(target)!r})
        """)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for delay in (0.02, 0.05, 0.11, 0.17):
        good.save_hdf5(target)
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with h5py.File(target, "r") as f:  # always a complete file: the old one or a new one
            got = f["data/ip/0"][()]
        assert np.array_equal(got, want) or np.all(got == 7)


def test_cli_train_and_resume_with_hdf5_snapshots(tmp_path, monkeypatch):
    """``pycaffe-lite train`` with snapshot_format: HDF5, then --snapshot X.solverstate.h5: the
    resumed weights equal a straight run's."""
    from pycaffe_lite.commands import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(
        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }\n'
        'layer { name: "a/ip" type: "InnerProduct" bottom: "data" top: "h" inner_product_param { num_output: 4 '
        'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 } } }\n'
        'layer { name: "b/ip" type: "InnerProduct" bottom: "h" top: "y" loss_weight: 1 '
        'inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }\n')

    def solver(name, prefix, max_iter):
        (tmp_path / name).write_text(f'net: "net.prototxt" base_lr: 0.01 lr_policy: "fixed" momentum: 0.9 '
                                     f'max_iter: {max_iter} random_seed: 3 snapshot_format: HDF5 '
                                     f'snapshot_prefix: "{prefix}"\n')
        return name

    assert cli.main(["train", "--solver", solver("s.prototxt", "full/t", 4), "--no-progress"]) == 0
    assert cli.main(["train", "--solver", solver("h.prototxt", "half/t", 2), "--no-progress"]) == 0
    assert (tmp_path / "half/t_iter_2.solverstate.h5").exists()
    assert cli.main(["train", "--solver", solver("r.prototxt", "half/t", 4), "--snapshot",
                     "half/t_iter_2.solverstate.h5", "--no-progress"]) == 0
    with h5py.File(tmp_path / "full/t_iter_4.caffemodel.h5", "r") as a, \
            h5py.File(tmp_path / "half/t_iter_4.caffemodel.h5", "r") as b:
        for key in ("data/a/ip/0", "data/a/ip/1", "data/b/ip/0", "data/b/ip/1"):
            np.testing.assert_array_equal(a[key][()], b[key][()])


def test_missing_binary_state_names_the_h5_beside_it(tmp_path):
    """BVLC's cifar10 train_full.sh names X.solverstate while its solvers write X.solverstate.h5:
    the error says which file to give instead (and still fails, as BVLC does)."""
    from pycaffe_lite.solvers.solver import check_state_file

    state = tmp_path / "full_iter_4.solverstate"
    with pytest.raises(WeightsError, match="not found$"):
        check_state_file(state, WeightsError)  # nothing beside it: the plain message
    (tmp_path / "full_iter_4.solverstate.h5").write_bytes(b"")
    with pytest.raises(WeightsError, match=r"--snapshot=.*full_iter_4\.solverstate\.h5"):
        check_state_file(state, WeightsError)
    check_state_file(tmp_path / "full_iter_4.solverstate.h5", WeightsError)  # an existing file passes
