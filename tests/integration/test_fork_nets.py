"""The forks' layers inside one net: `pycaffe-lite time` times and rates each of them, and the whole
net agrees between CPU and GPU (forward, backward, parameter gradients)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite import common, using_config
from pycaffe_lite.commands import cli
from pycaffe_lite.net import Net

NET = """name: "forks"
force_backward: true
layer { name: "data" type: "Input" top: "data" top: "rois" top: "t"
  input_param { shape { dim: 2 dim: 8 dim: 16 dim: 16 } shape { dim: 3 dim: 5 } shape { dim: 3 dim: 8 dim: 2 dim: 2 } } }
layer { name: "r6" type: "ReLU6" bottom: "data" top: "r6" }
layer { name: "bn" type: "BN" bottom: "r6" top: "bn" bn_param { slope_filler { value: 1 } momentum: 0.9 } }
layer { name: "sh" type: "ShuffleChannel" bottom: "bn" top: "sh" shuffle_channel_param { group: 2 } }
layer { name: "pool" type: "Pooling" bottom: "sh" top: "pool" top: "mask"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "up" type: "Upsample" bottom: "pool" bottom: "mask" top: "up" upsample_param { scale: 2 } }
layer { name: "gap" type: "Pooling" bottom: "up" top: "gap" pooling_param { pool: AVE global_pooling: true } }
layer { name: "axpy" type: "Axpy" bottom: "gap" bottom: "up" bottom: "sh" top: "axpy" }
layer { name: "interp" type: "Interp" bottom: "axpy" top: "interp" interp_param { zoom_factor: 2 } }
layer { name: "nn" type: "Upsample" bottom: "interp" top: "nn" upsample_param { scale: 2 } }
layer { name: "roi" type: "ROIPooling" bottom: "nn" bottom: "rois" top: "roi"
  roi_pooling_param { pooled_h: 2 pooled_w: 2 spatial_scale: 0.25 } }
layer { name: "loss" type: "SmoothL1Loss" bottom: "roi" bottom: "t" top: "loss" }
layer { name: "pool2" type: "Pooling" bottom: "nn" top: "pool2" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "unpool" type: "Unpooling" bottom: "pool2" bottom: "nn" top: "unpool"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "unpool_ave" type: "UnPooling" bottom: "pool2" top: "unpool_ave"
  unpooling_param { unpool: AVE kernel_size: 3 stride: 2 unpool_size: 62 } }
layer { name: "both" type: "Eltwise" bottom: "unpool" bottom: "unpool_ave" top: "both" }
layer { name: "loss2" type: "Reduction" bottom: "both" top: "loss2" loss_weight: 0.5
  reduction_param { operation: SUMSQ } }
"""
FORK_LAYERS = ("r6", "bn", "sh", "up", "axpy", "interp", "nn", "roi", "loss", "unpool", "unpool_ave")


def test_time_covers_the_fork_layers(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("forks.prototxt").write_text(NET)
    assert cli.main(["time", "--model", "forks.prototxt", "--iterations", "1"]) == 0
    out = capsys.readouterr().out
    for name in FORK_LAYERS:
        for direction in ("forward", "backward"):
            assert re.search(rf"^\s*{name}\t{direction}: [0-9.e+-]+ ms\. \([0-9.e+-]+ GB/s\)$", out, re.M), \
                (name, direction, out)


def _run(tmp_path, gpu: bool):
    common.set_mode_gpu() if gpu else common.set_mode_cpu()
    try:
        common.set_random_seed(3)
        path = tmp_path / "forks.prototxt"
        path.write_text(NET)
        net = Net(str(path), common.TRAIN)
        rng = np.random.default_rng(0)
        # Inside (0, 6): no ties from clipping, which rounding could break differently on the devices.
        net.blobs["data"].data[...] = rng.uniform(0.5, 5.5, net.blobs["data"].shape)
        net.blobs["rois"].data[...] = [[0, 0, 0, 63, 63], [1, 8, 4, 40, 50], [0, 30, 30, 20, 20]]
        net.blobs["t"].data[...] = rng.standard_normal(net.blobs["t"].shape)
        net.forward()
        net.backward()
        return ([net.blobs[n].data.copy() for n in net.blobs] + [net.blobs["data"].diff.copy()]
                + [p.diff.copy() for layer in net.layers for p in layer.blobs])
    finally:
        common.set_mode_cpu()


def test_net_runs_on_cpu(tmp_path):
    out = _run(tmp_path, False)
    assert all(np.isfinite(a).all() for a in out)
    assert np.abs(out[-5]).sum() > 0  # the input gets a gradient


@pytest.mark.gpu
def test_net_cpu_gpu_agree(tmp_path):
    for a, b in zip(_run(tmp_path, False), _run(tmp_path, True)):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5)


def test_shared_gradient_buffers_leave_unwritten_diffs_alone(tmp_path):
    """Unpooling leaves its switch source's diff (``nn``'s third split) as it was, and ROIPooling its
    ROIs'; the Split before them sums it. Shared gradient buffers must not hand such a diff another
    blob's gradient: every diff equals the run with sharing off."""
    with_plan = _run(tmp_path, False)
    with using_config(share_diffs=False):
        without = _run(tmp_path, False)
    for a, b in zip(with_plan, without):
        np.testing.assert_array_equal(a, b)
