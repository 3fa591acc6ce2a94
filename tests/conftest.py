"""Shared fixtures: without a usable GPU, tests marked ``gpu`` are deselected (skipped when ``-m``
names ``gpu``); ``mode`` runs a test on the CPU and (marked ``gpu``) on the GPU; MNIST and Caffe
fixture locations."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import numpy as np
import pytest

# xdist workers share the cores: each worker's BLAS gets its share of threads (the package's default,
# every core, would oversubscribe them with busy-waiting threads). Set before pycaffe_lite is imported.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and not os.environ.get("PYCAFFE_LITE_THREADS"):
    os.environ["PYCAFFE_LITE_THREADS"] = str(max(1, len(os.sched_getaffinity(0))
                                                 // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@functools.cache
def gpu_unavailable_reason() -> str | None:
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        return f"PyCUDA not installed ({exc})"
    try:
        cuda.init()
        if cuda.Device.count() < 1:
            return "no CUDA device"
    except Exception as exc:  # no driver
        return f"CUDA driver unavailable ({exc})"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    gpu = [item for item in items if "gpu" in item.keywords]
    if "gpu" not in (config.getoption("markexpr") or ""):
        # Not asked for: left out of the run (reported as deselected, with the reason below), which
        # spares the default run two thousand skips' bookkeeping.
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if "gpu" not in item.keywords]
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in gpu:
        item.add_marker(skip)


def pytest_report_header(config):
    reason = gpu_unavailable_reason()
    return f"GPU tests: {'run' if reason is None else 'left out or skipped: ' + reason}"


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    """``-q`` hides the header: the line saying why GPU tests are left out is written anyway (by the
    controller only, under pytest-xdist)."""
    config = session.config
    if config.get_verbosity() >= 0 or hasattr(config, "workerinput"):
        return
    reason = gpu_unavailable_reason()
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reason is not None and reporter is not None:
        reporter.write_line(f"GPU tests: left out or skipped: {reason}")


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def mode(request):
    """Run the test once per device; restores CPU mode afterwards."""
    import pycaffe_lite as caffe

    if request.param == "gpu":
        caffe.set_mode_gpu()
    else:
        caffe.set_mode_cpu()
    yield request.param
    caffe.set_mode_cpu()


@pytest.fixture
def gpu_mode():
    """For tests marked ``gpu``: GPU mode during the test, CPU afterwards."""
    import pycaffe_lite as caffe

    caffe.set_mode_gpu()
    yield
    caffe.set_mode_cpu()


def _first_dir(*candidates) -> Path | None:
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    return None


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    d = _first_dir(os.environ.get("MNIST_DIR"), REPO / "examples" / "mnist" / "data", SHARED / "mnist")
    if d is None:
        pytest.skip("full MNIST not found in $MNIST_DIR or examples/mnist/data")
    return d


@pytest.fixture(scope="session")
def mnist_digits() -> tuple[np.ndarray, np.ndarray]:
    """The first 1,024 training digits of examples/mnist/data: images (N, 1, 28, 28) scaled to [0, 1]
    and labels, both float32 (what the half-precision training tests feed a MemoryData layer)."""
    from pycaffe_lite.data import mnist

    folder = REPO / "examples" / "mnist" / "data"
    images = mnist.read_images(folder / "train-images-idx3-ubyte.gz")[:1024]
    labels = mnist.read_labels(folder / "train-labels-idx1-ubyte.gz")[:1024]
    x = np.ascontiguousarray(images.reshape(-1, 1, 28, 28), np.float32) / 255
    return x, np.ascontiguousarray(labels, np.float32)


@pytest.fixture(scope="session")
def caffe_fixtures() -> Path:
    d = _first_dir(os.environ.get("CAFFE_FIXTURES"), SHARED / "caffe-fixtures", REPO / ".device" / "caffe-fixtures")
    if d is None:
        pytest.skip("BVLC Caffe fixtures not found in $CAFFE_FIXTURES or ../shared/caffe-fixtures")
    return d


# Interp backward_tiling's knobs forced to extremes: one-row bands, column tiles a few top columns
# wide, one-column chunks of T
INTERP_TILINGS = {"default": {}, "thin_bands": {"MIN_TILES": 1 << 30}, "narrow": {"TILE_BYTES": 256},
                  "chunks": {"TILE_BYTES": 64, "TILE_ROWS": 1}}


@pytest.fixture(params=list(INTERP_TILINGS))
def interp_tiling(request, monkeypatch):
    """layers/interp.py with one of INTERP_TILINGS set (the module is returned)."""
    from pycaffe_lite.testing.layer_testing import make_layer

    module = sys.modules[type(make_layer('type: "Interp" interp_param { zoom_factor: 2 }')).__module__]
    for name, value in INTERP_TILINGS[request.param].items():
        monkeypatch.setattr(module, name, value)
    return module


class _FakeHopper:
    """A stand-in for ``backend.state()``: device 0, compute capability 9.0 (tests of host code)."""

    device_id = 0

    class device:  # noqa: N801 (the attribute pycuda's state has)
        @staticmethod
        def compute_capability():
            return (9, 0)

        @staticmethod
        def name():
            return "fake"


@pytest.fixture
def fake_hopper(monkeypatch):
    """``backend.state()`` answers a fake compute capability 9.0 device (no GPU needed)."""
    from pycaffe_lite.gpu import backend

    monkeypatch.setattr(backend, "state", lambda: _FakeHopper)
    return _FakeHopper
