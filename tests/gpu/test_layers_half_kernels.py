"""Convolution and InnerProduct built half-native (``Traits.half_kernels``: a half layer created in GPU
mode computes on its fp16 / bf16 blobs, ``dtype`` = the storage type): forward and backward against
the float64 CPU layer on the same half-rounded inputs, weights and top gradient.

Bounds per element (``u``: 2**-11 fp16, 2**-8 bf16; ``A``: the float64 layer run on the absolute
values; ``K``: the longest contraction of the layer's passes): ``f*u*A + 2*K*2**-24*A``, where ``f``
counts the roundings to the storage type a result may go through: 2 on the fp16/bf16 tensor-core
engine (the output; the bias added in the epilogue or the weight pass's bias column: one more at
most), 3 on the gemm engine and InnerProduct (cuBLAS's output, then the bias or the column sums), 48
when the autotune may pick winograd (see tests/gpu/test_conv_half.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import precision
from pycaffe_lite.blob import Blob
from pycaffe_lite.layer import create_layer
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.layer_testing import layer_param, make_layer

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_mode")]

FORMATS = {"fp16": (np.float16, caffe_pb2.FLOAT16, 2.0**-11), "bf16": (np.uint16, caffe_pb2.BFLOAT16, 2.0**-8)}


def _half_layer(text: str, fmt: str):
    """The layer as a half net built in GPU mode creates it (net defaults FLOAT16 / BFLOAT16)."""
    _, t, _ = FORMATS[fmt]
    net = caffe_pb2.NetParameter()
    net.default_forward_type = net.default_backward_type = t
    lp = layer_param(text)
    return create_layer(lp, np.float32, precision.layer_precision(net, lp))


def _rounded(a: np.ndarray, fmt: str) -> np.ndarray:
    _, t, _ = FORMATS[fmt]
    return precision.to_float32(precision.from_float32(np.asarray(a, np.float32), t), t).astype(np.float64)


def _run_half(text: str, fmt: str, x: np.ndarray, params: list[np.ndarray], dy_fn):
    """(top, bottom diff, param diffs) of the half-native layer, as float64."""
    dtype = FORMATS[fmt][0]
    layer = _half_layer(text, fmt)
    assert layer.half_native and np.dtype(layer.dtype) == np.dtype(dtype), layer.dtype
    bottom, top = Blob(x.shape, dtype), Blob((), layer.top_dtype)
    bottom.set_math_data(x.astype(np.float32))
    layer.setup([bottom], [top])
    for b, p in zip(layer.blobs, params):
        assert b.data_type == FORMATS[fmt][1]
        b.set_math_data(p.astype(np.float32))
        b.set_math_diff(np.zeros(p.shape, np.float32))
    layer.forward([bottom], [top])
    y = top.math_data().astype(np.float64)
    top.set_math_diff(dy_fn(y.shape).astype(np.float32))
    layer.backward([top], [True], [bottom])
    return y, bottom.math_diff().astype(np.float64), [b.math_diff().astype(np.float64) for b in layer.blobs]


def _run_float64(text: str, x: np.ndarray, params: list[np.ndarray], dy: np.ndarray):
    caffe.set_mode_cpu()
    try:
        layer = make_layer(text, np.float64)
        bottom, top = Blob(x.shape, np.float64), Blob((), np.float64)
        bottom.mutable_cpu_data()[...] = x
        layer.setup([bottom], [top])
        for b, p in zip(layer.blobs, params):
            b.mutable_cpu_data()[...] = p
            b.mutable_cpu_diff()[...] = 0
        layer.forward([bottom], [top])
        top.mutable_cpu_diff()[...] = dy
        layer.backward([top], [True], [bottom])
        return top.cpu_data().copy(), bottom.cpu_diff().copy(), [b.cpu_diff().copy() for b in layer.blobs]
    finally:
        caffe.set_mode_gpu()


def _compare(text: str, fmt: str, x_shape, param_shapes, factor: float, k: int, seed: int = 0) -> None:
    u = FORMATS[fmt][2]
    rng = np.random.default_rng(seed)
    x = _rounded(rng.standard_normal(x_shape), fmt)
    params = [_rounded(rng.standard_normal(s), fmt) for s in param_shapes]
    dys: list[np.ndarray] = []

    def dy_fn(shape):
        dys.append(_rounded(rng.standard_normal(shape), fmt))
        return dys[0]

    got = _run_half(text, fmt, x, params, dy_fn)
    exact = _run_float64(text, x, params, dys[0])
    bound = _run_float64(text, np.abs(x), [np.abs(p) for p in params], np.abs(dys[0]))
    for what, g, e, a in zip(("top", "bottom diff"), got[:2], exact[:2], bound[:2]):
        _assert_within(g, e, a, factor, u, k, f"{fmt} {what}")
    for i, (g, e, a) in enumerate(zip(got[2], exact[2], bound[2])):
        _assert_within(g, e, a, factor, u, k, f"{fmt} param {i} diff")


def _assert_within(got, exact, bound, factor, u, k, what):
    tol = factor * u * bound + 2 * k * 2.0**-24 * bound + 1e-6
    err = np.abs(got - exact)
    assert np.all(err <= tol), f"{what}: worst {np.max(err / (bound + 1e-30)):.3g} of A, bound {factor} u"


CONV = ('name: "conv" type: "Convolution" convolution_param {{ num_output: 24 kernel_size: 3 pad: 1 stride: {s} '
        'engine: {engine} }}')


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("engine", "factor"), [("TENSOR_CORE_16", 2), ("GEMM", 3), ("DEFAULT", 48)])
@pytest.mark.parametrize("stride", [1, 2])
def test_convolution_half_native(fmt, engine, factor, stride):
    text = CONV.format(s=stride, engine=engine)
    n, c, h, w = 3, 20, 13, 11
    ho, wo = (h + 2 - 3) // stride + 1, (w + 2 - 3) // stride + 1
    _compare(text, fmt, (n, c, h, w), [(24, c, 3, 3), (24,)], factor, k=max(c * 9, 24 * 9, n * ho * wo))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("transpose", [False, True])
def test_inner_product_half_native(fmt, transpose):
    text = (f'name: "ip" type: "InnerProduct" inner_product_param {{ num_output: 37 '
            f'transpose: {str(transpose).lower()} }}')
    m, k = 9, 300
    w_shape = (k, 37) if transpose else (37, k)
    _compare(text, fmt, (m, 3, 10, 10), [w_shape, (37,)], factor=3, k=k)
