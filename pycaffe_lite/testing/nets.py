"""Nets for the runtime's tests: filled with fixed values (weights, BatchNorm statistics away from
the trivial ones), and built twice, with the runtime's fusions and without, with the check that both
leave the same values (how the fusion tests prove a fused pass equals the layers it replaces)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .. import common
from ..config import using_config

N = TypeVar("N")


def fused_and_plain(build: Callable[[], N], seed: int) -> tuple[N, N]:
    """``build()`` (a net) with fusions and without (``config.fusion``), each after
    ``set_random_seed(seed)``, so both have the same filled weights."""
    nets = []
    for fuse in (True, False):
        common.set_random_seed(seed)
        with using_config(fusion=fuse):  # fusions are found when the net is built
            nets.append(build())
    return nets[0], nets[1]


def assert_nets_match(a: Any, b: Any, rtol: float = 0.0, atol: float = 0.0, params_data: bool = False) -> None:
    """Every blob's data and diff and every param's diff (and data, ``params_data``) of net ``a``
    equal net ``b``'s within ``rtol``/``atol`` (0: exactly); the failure names the blob or param."""
    for name in b.blobs:
        np.testing.assert_allclose(a.blobs[name].data, b.blobs[name].data, rtol=rtol, atol=atol,
                                   err_msg=f"data of blob {name}")
        np.testing.assert_allclose(a.blobs[name].diff, b.blobs[name].diff, rtol=rtol, atol=atol,
                                   err_msg=f"diff of blob {name}")
    for name in b.params:
        for j, (p, q) in enumerate(zip(a.params[name], b.params[name])):
            if params_data:
                np.testing.assert_allclose(p.data, q.data, rtol=rtol, atol=atol, err_msg=f"{name}[{j}] data")
            np.testing.assert_allclose(p.diff, q.diff, rtol=rtol, atol=atol, err_msg=f"{name}[{j}] diff")


def fill_weights(net: Any, seed: int = 0) -> None:
    """Every param blob of ``net`` from ``default_rng(seed)``: normal values scaled by 1/sqrt(fan-in)
    (the count over the leading dim), BatchNorm's variance positive (|v| + 0.5) and factor 1."""
    rng = np.random.default_rng(seed)
    for layer in net.layers:
        for i, blob in enumerate(layer.blobs):
            values = rng.standard_normal(blob.shape) / np.sqrt(blob.count // blob.shape[0] if blob.shape else 1)
            if layer.type == "BatchNorm":
                values = np.abs(values) + 0.5 if i == 1 else np.ones(blob.shape) if i == 2 else values
            blob.data[...] = values


def set_bn_statistics(net: Any, layer: str, seed: int = 4) -> None:
    """BatchNorm ``layer``'s running sums from ``default_rng(seed)``: mean ~ 3·N(0, 1), variance in
    [0.1, 4.1), factor 2.5 (so global statistics divide by it)."""
    rng = np.random.default_rng(seed)
    mean, var, factor = net.params[layer]
    mean.data[...] = rng.standard_normal(mean.count) * 3
    var.data[...] = rng.random(var.count) * 4 + 0.1
    factor.data[...] = 2.5


# LeNet for the half-precision tests, fed by a MemoryData layer (``set_input_arrays``); ``%(fields)s``
# takes the net's precision fields, ``%(extra)s`` an optional layer between pool1 and conv2.
_LENET = """
name: "LeNet_%(type)s"
%(fields)s
layer { name: "mnist" type: "MemoryData" top: "data" top: "label"
        memory_data_param { batch_size: %(batch)d channels: 1 height: 28 width: 28 } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 20 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
%(extra)slayer { name: "conv2" type: "Convolution" bottom: "%(conv2_input)s" top: "conv2"
        convolution_param { num_output: 50 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1"
        inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "accuracy" type: "Accuracy" bottom: "ip2" bottom: "label" top: "accuracy" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def half_lenet(type_name: str, batch: int, extra_fields: str = "", lrn: bool = False) -> str:
    """LeNet's net text with storage ``type_name`` (FLOAT, FLOAT16, BFLOAT16: NVCaffe's net defaults,
    math FLOAT), ``extra_fields`` on the net (loss scaling) and, with ``lrn``, an LRN (a layer with
    no half path, so float32 in a half net) between pool1 and conv2."""
    fields = extra_fields if type_name == "FLOAT" else (
        f"default_forward_type: {type_name} default_backward_type: {type_name} "
        f"default_forward_math: FLOAT default_backward_math: FLOAT {extra_fields}")
    extra = 'layer { name: "norm" type: "LRN" bottom: "pool1" top: "norm" lrn_param { local_size: 3 } }\n' if lrn else ""
    return _LENET % {"type": type_name, "fields": fields, "batch": batch, "extra": extra,
                     "conv2_input": "norm" if lrn else "pool1"}
