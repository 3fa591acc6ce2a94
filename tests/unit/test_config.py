"""The configuration object: read once from the environment, overridable per thread in a block."""

from __future__ import annotations

import threading

import pytest

import pycaffe_lite as caffe
from pycaffe_lite.config import Config
from pycaffe_lite.errors import CaffeError


def test_environment_is_parsed_per_field_type():
    cfg = Config.from_env({"PYCAFFE_LITE_FUSION": "0", "PYCAFFE_LITE_BUCKET_MB": "4.5",
                           "PYCAFFE_LITE_ACTION_INTERVAL": "3", "PYCAFFE_LITE_NCCL": "/opt/nccl",
                           "PYCAFFE_LITE_SHARE_DATA": ""})
    assert (cfg.fusion, cfg.bucket_mb, cfg.action_interval, cfg.nccl) == (False, 4.5, 3, "/opt/nccl")
    assert cfg.share_data and cfg.cuda_graphs and cfg.autotune_cache is None  # empty or unset: default


def test_a_bad_value_names_the_variable():
    with pytest.raises(CaffeError, match=r"\$PYCAFFE_LITE_ACTION_INTERVAL='often': expected int"):
        Config.from_env({"PYCAFFE_LITE_ACTION_INTERVAL": "often"})


def test_using_config_nests_and_is_per_thread():
    before = caffe.config.fusion
    seen = []
    with caffe.using_config(fusion=not before, bucket_mb=1.0):
        with caffe.using_config(share_data=False):
            assert caffe.config.fusion is (not before) and not caffe.config.share_data
            other = threading.Thread(target=lambda: seen.append(caffe.config.fusion))
            other.start()
            other.join()
        assert caffe.config.share_data and caffe.config.bucket_mb == 1.0
    assert caffe.config.fusion is before and seen == [before]


def test_unknown_setting_is_refused():
    with pytest.raises(CaffeError, match=r"unknown settings \['fusoin'\]"), caffe.using_config(fusoin=False):
        pass
