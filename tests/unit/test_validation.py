"""Bad values end in project errors naming the file, layer or blob, before anything large is
allocated (issue 14): memory limits of host and device, empty blobs, fillers in the blob's dtype."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import Blob, common, fillers, memcheck
from pycaffe_lite.errors import CaffeError, NetError
from pycaffe_lite.memcheck import OutOfMemoryError
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.solvers.lr_policy import SolverConfigError
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

MiB = 1 << 20


@pytest.fixture
def small_host(monkeypatch):
    monkeypatch.setattr(memcheck, "host_limit", lambda: 64 * MiB)


def test_blob_refuses_more_than_host_memory_and_stays_usable(small_host):
    b = Blob((2, 3))
    with pytest.raises(OutOfMemoryError, match=r"blob of shape \(20, 1000, 1000\) \(float32\) would need 76.3 MiB "
                                               r"\(20,000,000 values\), more than the 64.0 MiB"):
        b.reshape((20, 1000, 1000))
    assert b.shape == (2, 3) and b.data.shape == (2, 3)  # refused before anything changed
    b.reshape((16, 1000, 1000))  # 61 MiB: fits


def test_blob_checks_device_memory_in_gpu_mode_only(monkeypatch):
    monkeypatch.setattr(memcheck, "device_limit", lambda: 8 * MiB)
    Blob((4, MiB))  # 16 MiB on the host: no device check in CPU mode
    monkeypatch.setattr(common, "mode", lambda: common.Mode.GPU)
    with pytest.raises(OutOfMemoryError, match=r"would need 16.0 MiB .* more than the 8.0 MiB of memory the GPU has"):
        Blob((4, MiB))
    Blob((MiB,))  # 4 MiB fits


def test_device_memory_query_reads_the_device(monkeypatch):
    from pycaffe_lite.gpu import backend

    device = type("Device", (), {"total_memory": lambda self: 80 << 30})()
    monkeypatch.setattr(backend, "state", lambda: type("State", (), {"device": device})())
    assert memcheck.device_limit() == 80 << 30


def _write(tmp_path, text: str, name: str = "net.prototxt"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


INPUT = 'layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dims} }} }} }}\n'


@pytest.mark.parametrize("layer,match", [
    ('type: "Convolution" convolution_param { num_output: 4 kernel_size: 3 pad: 100000 }',
     r"layer 'l' \(Convolution\): a blob of shape \(2, 4, 200006, 200006\) \(float32\) would need 1.2 TiB"),
    ('type: "Deconvolution" convolution_param { num_output: 4 kernel_size: 3 stride: 1000000 }',
     r"layer 'l' \(Deconvolution\): a blob of shape \(2, 4, 7000003, 7000003\)"),
    ('type: "Pooling" pooling_param { kernel_size: 2 stride: 2147483647 }',
     r"layer 'l' \(Pooling\): kernel 2x2, stride 2147483647x2147483647 on a 8x8 input: the padded input and the stack of its kernel windows would need"),
    ('type: "InnerProduct" inner_product_param { num_output: 2000000000 }',
     r"layer 'l' \(InnerProduct\): the 2000000000x192 weights would need"),
    ('type: "Tile" tile_param { tiles: 2000000000 }', r"layer 'l' \(Tile\): a blob of shape \(2, 6000000000, 8, 8\)"),
])
def test_huge_sizes_are_refused_naming_file_and_layer(tmp_path, small_host, layer, match):
    text = INPUT.format(dims="dim: 2 dim: 3 dim: 8 dim: 8") + f'layer {{ name: "l" {layer} bottom: "data" top: "l" }}'
    path = _write(tmp_path, text)
    with pytest.raises(OutOfMemoryError, match=match) as info:
        caffe.Net(path, caffe.TEST)
    assert str(info.value).startswith(path + ": ")
    assert "more than the 64.0 MiB of memory this machine has" in str(info.value)


def test_a_larger_input_at_forward_is_refused_naming_the_layer(small_host):
    layer, bottom, top = make_layer('name: "fc" type: "InnerProduct" inner_product_param { num_output: 2000 }'), \
        blobs([np.zeros((2, 10))]), empty_blobs(1)
    layer.setup(bottom, top)
    bottom[0].reshape((10000, 10))  # (the bottom itself fits: 0.4 MiB) top: 10000 x 2000 floats = 76 MiB
    with pytest.raises(OutOfMemoryError, match=r"layer 'fc' \(InnerProduct\): a blob of shape \(10000, 2000\)"):
        layer.forward(bottom, top)


@pytest.mark.parametrize("dims", ["dim: 0 dim: 3 dim: 8 dim: 8", "dim: 2 dim: 0 dim: 8 dim: 8"])
def test_empty_blobs_are_refused_at_setup_and_reshape(tmp_path, dims):
    conv = 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 ' \
           'kernel_size: 3 weight_filler { type: "xavier" } } }'
    path = _write(tmp_path, INPUT.format(dims=dims) + conv)
    with pytest.raises(NetError, match=rf"{path}: layer 'data' \(Input\): top blob 'data' has shape .*: a dimension is 0"):
        caffe.Net(path, caffe.TEST)
    net = caffe.Net(_write(tmp_path, INPUT.format(dims="dim: 2 dim: 3 dim: 8 dim: 8") + conv, "ok.prototxt"), caffe.TEST)
    net.blobs["data"].reshape((0, 3, 8, 8))
    with pytest.raises(NetError, match=r"layer 'data' \(Input\): top blob 'data' has shape \(0, 3, 8, 8\)"):
        net.reshape()


def test_unknown_filler_type_names_the_file_and_layer(tmp_path):
    text = INPUT.format(dims="dim: 2 dim: 3") + (
        'layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" '
        'inner_product_param { num_output: 2 weight_filler { type: "xavir" } } }')
    path = _write(tmp_path, text)
    with pytest.raises(NetError, match=rf"^{path}: layer 'fc' \(InnerProduct\): unknown filler type 'xavir' \(known: "):
        caffe.Net(path, caffe.TEST)


def test_fan_in_of_an_empty_blob_is_an_error():
    with pytest.raises(NetError, match=r"cannot compute fan-in of a blob of shape \(4, 0, 3, 3\)"):
        fillers.fill(Blob((4, 0, 3, 3)), caffe_pb2.FillerParameter(type="xavier"))


FILLERS = [dict(type="constant", value=2), dict(type="uniform", min=-1, max=1), dict(type="gaussian", std=2),
           dict(type="positive_unitball"), dict(type="xavier"), dict(type="msra"), dict(type="bilinear")]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("param", FILLERS, ids=[f["type"] for f in FILLERS])
def test_fillers_draw_in_the_blobs_dtype(param, dtype):
    """No float64 (or other) copy of the blob's size is made: the peak is one array of the blob's size."""
    b = Blob((64, 16, 64, 64), dtype)  # 4 Mi values
    b.mutable_cpu_data()
    tracemalloc.start()
    try:
        fillers.fill(b, caffe_pb2.FillerParameter(**param))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    nbytes = b.count * np.dtype(dtype).itemsize
    assert peak < 1.3 * nbytes, f"{param['type']} peaked at {peak / nbytes:.2f}x the blob's {nbytes} bytes"
    assert b.data.dtype == dtype and np.isfinite(b.data).all() and b.data.any()


def test_parse_errors_name_the_file(tmp_path):
    path = _write(tmp_path, INPUT.format(dims="dim: 2") + 'layer { name: "fc" type: "InnerProduct" bottom: "data" '
                  'top: "fc" inner_product_param { num_output: 4294967296 } }')
    with pytest.raises(caffe.PrototxtError, match=rf"^{path}:2:\d+: .*Value out of range: 4294967296"):
        caffe.Net(path, caffe.TEST)


def _solver(tmp_path, extra: str) -> str:
    net = _write(tmp_path, INPUT.format(dims="dim: 2 dim: 3") + (
        'layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 2 } }'
        'layer { name: "loss" type: "Reduction" bottom: "fc" top: "loss" loss_weight: 1 }'))
    return _write(tmp_path, f'net: "{net}" base_lr: 0.1 {extra}', "solver.prototxt")


@pytest.mark.parametrize("extra,match", [
    ('lr_policy: "fixed" momentum: 1', "momentum: must be in \\[0, 1\\), got 1"),
    ('lr_policy: "fixed" type: "SGDD"', "unknown solver type 'SGDD'"),
    ('lr_policy: "fixed" iter_size: 0', "iter_size must be >= 1"),
    ('lr_policy: "step" gamma: 0.1', "stepsize: lr_policy 'step' needs stepsize > 0, got 0"),
])
def test_solver_errors_name_the_solver_file(tmp_path, extra, match):
    path = _solver(tmp_path, extra)
    with pytest.raises(SolverConfigError, match=match) as info:
        caffe.get_solver(path, progress=False)
    assert str(info.value).startswith(path + ": ")


def test_solver_net_errors_name_the_net_file_and_a_missing_policy_the_solver(tmp_path):
    path = _solver(tmp_path, "")
    solver = caffe.get_solver(path, progress=False)
    with pytest.raises(SolverConfigError, match=rf"^{path}: solver has no lr_policy"):
        solver.step(1)
    net = _write(tmp_path, INPUT.format(dims="dim: 2 dim: 3") + 'layer { name: "r" type: "ReLU" bottom: "dat" top: "r" }',
                 "bad.prototxt")
    bad = _write(tmp_path, f'net: "{net}" base_lr: 0.1 lr_policy: "fixed"', "solver2.prototxt")
    with pytest.raises(CaffeError, match=rf"^{net}: layer 'r': unknown bottom blob 'dat'"):
        caffe.get_solver(bad, progress=False)


@pytest.mark.parametrize("layer,match", [
    ('type: "Convolution" convolution_param { num_output: 1 kernel_size: 9 pad: 4 }',
     r"layer 'l' \(Convolution\): the CPU convolution buffers of one chunk of images \(padded input, columns; "
     r"kernel 9x9, 28x28 inputs, 28x28 outputs\) would need 64.7 MiB \(8,475,840 values\)"),
    ('type: "Deconvolution" convolution_param { num_output: 64 kernel_size: 9 pad: 4 }',
     r"layer 'l' \(Deconvolution\): the CPU convolution buffers of one chunk of images \(padded input, columns; "
     r"kernel 9x9, 28x28 inputs, 28x28 outputs\) would need 72.1 MiB"),
    ('type: "Pooling" pooling_param { kernel_size: 14 stride: 1 }',
     r"layer 'l' \(Pooling\): kernel 14x14, stride 1x1 on a 28x28 input: the padded input and the stack of its "
     r"kernel windows would need 43.8 MiB"),
])
def test_cpu_scratch_beyond_memory_is_refused(monkeypatch, layer, match):
    """cpu_conv's columns and MAX pooling's window stack, far larger than the blobs, are checked too."""
    monkeypatch.setattr(memcheck, "host_limit", lambda: 16 * MiB)
    lay, bottom, top = make_layer(f'name: "l" {layer}'), blobs([np.zeros((2, 64, 28, 28), np.float32)]), empty_blobs(1)
    with pytest.raises(OutOfMemoryError, match=match):
        lay.setup(bottom, top)
