"""Building a net costs little more host memory than the net holds: fillers draw straight into
each blob's host array in the blob's dtype (no full-size temporary, no float64 copy).

Measured with tracemalloc (numpy reports its allocations to it). VGG-16 (batch 1, xavier weights)
holds 553 MB of params and 61 MB of blobs (allocated when first used); the build peaks at 554 MB
(0.90x params + blobs; it was 881 MB while fillers drew into a temporary, and near 1.3 GB, 2.4x
params, when they drew float64). The general bound is ``param bytes + blob bytes + the largest
param's bytes``; ``test_float64_draws_exceed_the_bound`` checks on a small net that it catches
float64 draws."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from google.protobuf import text_format

import pycaffe_lite as caffe
from pycaffe_lite import fillers
from pycaffe_lite.schema import caffe_pb2

ZOO = Path(__file__).resolve().parents[2] / "examples" / "model_zoo"


def build_peak(tmp_path: Path, net: caffe_pb2.NetParameter) -> tuple[int, int, int, int]:
    """(peak traced bytes while building, param bytes, blob bytes, largest param's bytes)."""
    path = tmp_path / "net.prototxt"
    path.write_text(text_format.MessageToString(net))
    caffe.set_mode_cpu()
    tracemalloc.start()
    try:
        built = caffe.Net(str(path), caffe.TEST)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    params = [b.count * b.data.itemsize for blobs in built.params.values() for b in blobs]
    blobs = sum(b.count * b.data.itemsize for b in built.blobs.values())
    return peak, sum(params), blobs, max(params)


def with_fillers(net: caffe_pb2.NetParameter, weight: str) -> caffe_pb2.NetParameter:
    for layer in net.layer:
        for field in ("convolution_param", "inner_product_param"):
            if layer.HasField(field):
                getattr(layer, field).weight_filler.type = weight
                getattr(layer, field).weight_filler.std = 0.01
                getattr(layer, field).bias_filler.value = 0.1
    return net


def small_net() -> caffe_pb2.NetParameter:
    net = caffe_pb2.NetParameter()
    text_format.Merge("""
        layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2 dim: 8 dim: 16 dim: 16 } } }
        layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
                convolution_param { num_output: 64 kernel_size: 3 } }
        layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" inner_product_param { num_output: 1000 } }
        layer { name: "ip2" type: "InnerProduct" bottom: "ip" top: "ip2" inner_product_param { num_output: 100 } }
    """, net)
    return net


def assert_within_bound(peak: int, params: int, blobs: int, largest: int) -> None:
    bound = params + blobs + largest
    assert peak <= bound, (f"building peaked at {peak / 1e6:.1f} MB, more than the {params / 1e6:.1f} MB of "
                           f"params + {blobs / 1e6:.1f} MB of blobs + one temporary of the largest param "
                           f"({largest / 1e6:.1f} MB): do fillers draw in float64?")


@pytest.mark.slow  # builds VGG-16 twice (~3 s)
@pytest.mark.parametrize("weight", [None, "xavier"])
def test_vgg16_build_peak(tmp_path, weight):
    """The deploy file as it is (constant fillers) and with xavier weights: about 2 s each."""
    net = caffe_pb2.NetParameter()
    text_format.Merge((ZOO / "vgg16_deploy.prototxt").read_text(), net)
    net.input_dim[0] = 1  # batch 1: the params dominate, as they do in the report
    peak, params, blobs, largest = build_peak(tmp_path, with_fillers(net, weight) if weight else net)
    assert params == 138_357_544 * 4
    assert_within_bound(peak, params, blobs, largest)
    print(f"VGG-16 build peak {peak / 1e6:.0f} MB = {peak / (params + blobs):.3f}x params + blobs")
    assert peak < 1.1 * (params + blobs)  # fillers draw straight into the blobs: no full-size temporary


@pytest.mark.parametrize("weight", ["constant", "uniform", "gaussian", "xavier", "msra", "positive_unitball"])
def test_small_net_build_peak(tmp_path, weight):
    assert_within_bound(*build_peak(tmp_path, with_fillers(small_net(), weight)))


@pytest.mark.parametrize("weight", ["gaussian", "xavier"])
@pytest.mark.slow
def test_float64_draws_exceed_the_bound(tmp_path, monkeypatch, weight):
    """The bound fails a filler that draws float64 and lets the copy into the blob convert."""
    monkeypatch.setattr(fillers, "_uniform", lambda rng, lo, hi, shape, dt, out=None: rng.uniform(lo, hi, shape))
    monkeypatch.setattr(fillers, "_normal", lambda rng, mean, std, shape, dt, out=None: rng.normal(mean, std, shape))
    peak, params, blobs, largest = build_peak(tmp_path, with_fillers(small_net(), weight))
    with pytest.raises(AssertionError, match="do fillers draw in float64"):
        assert_within_bound(peak, params, blobs, largest)
