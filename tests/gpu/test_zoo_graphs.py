"""Every model-zoo network replays as CUDA graphs with no fallback: deploy forwards (TEST) and
whole training iterations (TRAIN, through the executor's iteration path)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import ours  # noqa: E402  (zoo_param, randomize_params: the same nets the zoo benchmark runs)

NETS = ["resnet50", "vgg16", "bvlc_googlenet", "bvlc_alexnet", "bvlc_reference_caffenet", "squeezenet_v1_1",
        "mobilenet_v1", "mobilenet_v2"]


@pytest.mark.parametrize("name", NETS)
def test_zoo_net_replays_without_fallback(name, gpu_mode):
    deploy = ROOT / "examples" / "model_zoo" / f"{name}_deploy.prototxt"
    test = caffe.Net(ours.zoo_param(deploy, 2, train=False), caffe.TEST)
    ours.randomize_params(test)
    test.blobs["data"].data[...] = np.random.default_rng(0).standard_normal(test.blobs["data"].shape)
    outs = [test.forward_prefilled() for _ in range(8)]  # warm-up (autotune), settle, capture, replays
    assert test.executor.replays >= 1 and test.executor.fallbacks == [], test.executor.fallbacks
    assert np.isfinite(test.blobs[test.outputs[0]].data).all() and np.isfinite(outs).all()

    train = caffe.Net(ours.zoo_param(deploy, 2, train=True), caffe.TRAIN)
    ours.randomize_params(train)
    train.blobs["data"].data[...] = np.random.default_rng(1).standard_normal(train.blobs["data"].shape)
    train.blobs["label"].data[...] = np.arange(2)
    executor = train.executor
    assert executor.can_replay_iteration()
    for _ in range(8):
        executor.train_iteration(lambda: None, "test")
    assert executor.loss_log is not None
    losses = executor.loss_log.read()
    assert len(losses) == 8 and np.isfinite(losses).all()
    assert executor.replays >= 1 and executor.fallbacks == [], executor.fallbacks
