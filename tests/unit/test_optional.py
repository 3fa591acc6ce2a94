"""pycaffe_lite.optional.require: one clear error for every missing optional package."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from pycaffe_lite import io as caffe_io
from pycaffe_lite.errors import CaffeError, MissingDependencyError
from pycaffe_lite.optional import require
from pycaffe_lite.testing.layer_testing import make_layer


def test_require_returns_the_module():
    assert require("numpy", feature="arrays") is np


@pytest.mark.parametrize("module,pip,extra", [("h5py", "h5py", "data"), ("PIL.Image", "Pillow", "data"),
                                              ("lmdb", "lmdb", "data"), ("pydot", "pydot", "draw")])
def test_missing_package_names_feature_package_and_extra(monkeypatch, module, pip, extra):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingDependencyError) as info:
        require(module, feature="the thing")
    msg = str(info.value)
    assert msg.startswith("the thing needs the '" + pip + "' package")
    assert f"pip install {pip}" in msg and f"pycaffe-lite[{extra}]" in msg
    assert isinstance(info.value, ImportError) and isinstance(info.value, CaffeError)


def test_unknown_package_and_extra_override(monkeypatch):
    monkeypatch.setitem(sys.modules, "nosuchpkg", None)
    with pytest.raises(MissingDependencyError, match=r"pip install nosuchpkg$"):
        require("nosuchpkg", feature="x")
    with pytest.raises(MissingDependencyError, match=r"pycaffe-lite\[extra1\]"):
        require("nosuchpkg", feature="x", extra="extra1")


def test_callers_use_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(MissingDependencyError, match="image loading needs the 'Pillow' package"):
        caffe_io.load_image(str(tmp_path / "x.png"))
    monkeypatch.setitem(sys.modules, "h5py", None)
    layer = make_layer(f'name: "out" type: "HDF5Output" hdf5_output_param {{ file_name: "{tmp_path}/o.h5" }}')
    with pytest.raises(MissingDependencyError, match=r"layer 'out' \(HDF5Output\) needs the 'h5py'"):
        layer.layer_setup([], [])
