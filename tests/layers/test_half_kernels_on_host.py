"""The half-kernel layers' GPU code on half storage without a GPU: the ``.cu`` files and the string
kernels are built as host C++ (``testing.host_kernels``: ``THREADED_SHIM``, blocks of OS threads;
``Dtype`` the compiler's ``_Float16`` for fp16, a 16-bit struct rounding as cuda_bf16.h does for
bf16; ``Mtype`` float), the device API runs on host memory, and each layer of
``test_half_kernels.CASES``, created as a half net built in GPU mode creates it (``dtype`` = the
storage type), runs its ``forward_gpu`` / ``backward_gpu`` through ``testing.half_check`` against
float64 on the CPU with the same bounds as on the GPU. This runs the kernels' half paths (loads,
stores, Mtype scalars and partial sums, BatchNorm's float statistics); the host's float math and
conversions stand in for the device's. Marked slow (compilations)."""

from __future__ import annotations

import numpy as np
import pytest
from test_half_kernels import CASES, IN_PLACE_CASES

from pycaffe_lite import common, memcheck
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.testing import host_kernels as hk
from pycaffe_lite.testing.half_check import check_half_gpu

pytestmark = [pytest.mark.skipif(hk.CXX is None, reason="no host C++ compiler (g++ or c++) on PATH"),
              pytest.mark.slow]


@pytest.fixture
def host_gpu(monkeypatch):
    """GPU mode on the host: kernels built by the host compiler, blobs' device pointers their host
    arrays (``host_kernels.threaded_device``); GPU mode switched on without a device."""
    hk.threaded_device(monkeypatch)
    monkeypatch.setattr(common, "set_mode_gpu", lambda: setattr(common.context(), "mode", common.Mode.GPU))
    monkeypatch.setattr(backend, "device_memory_bytes", memcheck.host_limit)

    def sum_rows_into(rows, cols, x, y, dt, beta=1.0):  # (cuBLAS's GEMV: not on the host)
        raise AssertionError("no GEMV expected: the cases have spatial sizes > 1")

    monkeypatch.setattr(gm, "sum_rows_into", sum_rows_into)
    yield
    common.context().mode = common.Mode.CPU


@pytest.mark.parametrize("dtype", [pytest.param(np.float16, id="fp16"), pytest.param(np.uint16, id="bf16")])
@pytest.mark.parametrize(("text", "bottoms", "k", "ntop", "propagate", "params"),
                         [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_half_kernels_on_the_host_match_float64(host_gpu, text, bottoms, k, ntop, propagate, params, dtype):
    ratios = check_half_gpu(text, bottoms, dtype, k, ntop=ntop, propagate=propagate, params=params)
    assert ratios and max(ratios.values()) <= 1.0


@pytest.mark.parametrize("dtype", [pytest.param(np.float16, id="fp16"), pytest.param(np.uint16, id="bf16")])
@pytest.mark.parametrize(("text", "bottoms", "k", "params"), [pytest.param(*c[1:], id=c[0]) for c in IN_PLACE_CASES])
def test_half_kernels_in_place_on_the_host_match_float64(host_gpu, text, bottoms, k, params, dtype):
    ratios = check_half_gpu(text, bottoms, dtype, k, params=params, in_place=True)
    assert ratios and max(ratios.values()) <= 1.0


def _half_layer(text: str, dtype):
    """The layer as a half net built in GPU mode creates it (dtype = the storage type)."""
    from pycaffe_lite.layer import create_layer
    from pycaffe_lite.precision import layer_precision, type_of_dtype
    from pycaffe_lite.schema import caffe_pb2
    from pycaffe_lite.testing.layer_testing import make_layer

    net = caffe_pb2.NetParameter()
    net.default_forward_type = net.default_backward_type = type_of_dtype(dtype)
    param = make_layer(text, np.float32).layer_param
    common.set_mode_gpu()
    layer = create_layer(param, np.float32, layer_precision(net, param))
    assert layer.half_native
    return layer


def _half_blob(values, dtype):
    from pycaffe_lite.blob import Blob

    b = Blob(values.shape, dtype)
    b.set_math_data(values.astype(np.float32))
    return b


@pytest.mark.parametrize("dtype", [pytest.param(np.float16, id="fp16"), pytest.param(np.uint16, id="bf16")])
def test_fused_sum_relu_equals_the_layers_in_half(host_gpu, dtype):
    """Eltwise SUM -> in-place ReLU as one pass each way (runtime/fusion.py's SumReLU) on half blobs:
    the same bits as the two layers' own passes."""
    from pycaffe_lite.blob import Blob

    rng = np.random.default_rng(8)
    a, b, g = (rng.uniform(-1, 1, (2, 3, 4, 8)) for _ in range(3))
    text = "type: 'Eltwise' eltwise_param { coeff: 1 coeff: -0.5 }"
    runs = []
    for fused in (False, True):
        elt, relu = _half_layer(text, dtype), _half_layer("type: 'ReLU'", dtype)
        bottom, top = [_half_blob(a, dtype), _half_blob(b, dtype)], [Blob((), dtype)]
        elt.setup(bottom, top)
        relu.setup(top, top)
        if fused:
            elt.chain_forward_relu_gpu(bottom, top)
        else:
            elt.forward_gpu(bottom, top)
            relu.forward_gpu(top, top)
        top[0].set_math_diff(g.astype(np.float32))
        if fused:
            elt.chain_backward_relu_gpu(top, top, [True, True], bottom)
        else:
            relu.backward_gpu(top, [True], top)
            elt.backward_gpu(top, [True, True], bottom)
        runs.append([top[0].cpu_data().copy(), top[0].cpu_diff().copy(), *(x.cpu_diff().copy() for x in bottom)])
    assert (runs[0][0] == 0).any() and runs[0][2].any()
    for i, (plain, fused) in enumerate(zip(*runs)):
        np.testing.assert_array_equal(fused, plain, err_msg=f"array {i}")


@pytest.mark.parametrize("dtype", [pytest.param(np.float16, id="fp16"), pytest.param(np.uint16, id="bf16")])
def test_fused_relu_max_pool_backward_equals_the_layers_in_half(host_gpu, dtype):
    """In-place ReLU -> MAX pooling's backward as one (ReLUMaxPool: the top gradient masked by the
    pooled values, then the pooling's backward) on half blobs: the layers' bits but for the sign of
    zero gradients (compared as values)."""
    from pycaffe_lite.blob import Blob

    rng = np.random.default_rng(9)
    x, g = rng.uniform(-1, 1, (2, 3, 8, 8)), rng.uniform(-1, 1, (2, 3, 4, 4))
    runs = []
    for fused in (False, True):
        relu = _half_layer("type: 'ReLU'", dtype)
        pool = _half_layer("type: 'Pooling' pooling_param { pool: MAX kernel_size: 3 stride: 2 }", dtype)
        blob, top = _half_blob(x, dtype), Blob((), dtype)
        relu.setup([blob], [blob])
        pool.setup([blob], [top])
        relu.forward_gpu([blob], [blob])
        pool.forward_gpu([blob], [top])
        top.set_math_diff(g.astype(np.float32))
        if fused:
            pool.backward_relu_gpu([top], [blob])
        else:
            pool.backward_gpu([top], [True], [blob])
            relu.backward_gpu([blob], [True], [blob])
        runs.append((top.math_data(), blob.math_diff()))
    assert runs[0][1].any() and (runs[0][0] == 0).any()
    np.testing.assert_array_equal(runs[1][0], runs[0][0])
    np.testing.assert_array_equal(runs[1][1], runs[0][1])


@pytest.mark.parametrize("dtype", [pytest.param(np.float16, id="fp16"), pytest.param(np.uint16, id="bf16")])
def test_fused_norm_chain_agrees_with_the_layers_in_half(host_gpu, dtype):
    """BatchNorm -> Scale -> ReLU in place on one blob as one pass each way (NormChain) on half blobs,
    batch statistics: within 8 eps of the layers' own passes (the chain's backward reads the saved
    normalized values where BatchNorm's reads x - mean, as in float), running statistics equal."""
    from pycaffe_lite.testing.gradient_check import UNIT_ROUNDOFF

    rng = np.random.default_rng(10)
    x, g = rng.uniform(-1, 3, (2, 3, 4, 8)), rng.uniform(-1, 1, (2, 3, 4, 8))
    gamma, beta = rng.uniform(0.5, 1.5, 3), rng.uniform(-0.5, 0.5, 3)
    runs = []
    for fused in (False, True):
        bn = _half_layer("type: 'BatchNorm' batch_norm_param { use_global_stats: false }", dtype)
        sc = _half_layer("type: 'Scale' scale_param { bias_term: true }", dtype)
        relu = _half_layer("type: 'ReLU'", dtype)
        blob = _half_blob(x, dtype)
        for layer in (bn, sc, relu):
            layer.setup([blob], [blob])
        sc.blobs[0].set_math_data(gamma.astype(np.float32))
        sc.blobs[1].set_math_data(beta.astype(np.float32))
        for p in sc.blobs:
            p.set_math_diff(np.zeros(p.shape, np.float32))
        if fused:
            bn.chain_forward_gpu(blob, bn.saved_normalized(), blob, sc, True)
        else:
            for layer in (bn, sc, relu):
                layer.forward_gpu([blob], [blob])
        blob.set_math_diff(g.astype(np.float32))
        if fused:
            bn.chain_backward_gpu(blob, bn.saved_normalized(), blob, sc, True)
        else:
            for layer in (relu, sc, bn):
                layer.backward_gpu([blob], [True], [blob])
        runs.append([blob.math_data(), blob.math_diff(), sc.blobs[0].math_diff(), sc.blobs[1].math_diff(),
                     *(p.math_data() for p in bn.blobs)])
    eps = UNIT_ROUNDOFF[np.dtype(dtype)]
    assert (runs[0][0] == 0).any() and runs[0][1].any()
    for i, (plain, fused) in enumerate(zip(*runs)):
        bound = 8 * eps * float(np.abs(plain).max())
        assert float(np.abs(fused.astype(np.float64) - plain).max()) <= bound, f"array {i}"
