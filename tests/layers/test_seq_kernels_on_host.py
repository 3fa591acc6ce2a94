"""The GPU paths of LSTMUnit, Lstm, Reverse, Transpose, Filter and BatchReindex without a GPU: their
``.cu`` kernels are compiled as host C++ (a shim turns ``__global__`` into plain functions and
``CUDA_KERNEL_LOOP`` into a serial loop), device pointers are the addresses of the blobs' host
arrays, and cuBLAS / math_functions / permute-plan / workspace calls are replaced by numpy on those addresses.
forward_gpu / backward_gpu then run as written (argument order, pointer offsets, transposes)
and must agree with the CPU path. The real device run is the GPU suite's job. Marked slow (the
compilations take seconds); run with ``python -m pytest -q tests/layers/test_seq_kernels_on_host.py``."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite import common
from pycaffe_lite.gpu import backend, blas, permute
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.testing import host_kernels as hk
from pycaffe_lite.testing.host_kernels import host_array as _array
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

# slow: compiling the six .cu files twice takes seconds
pytestmark = [pytest.mark.skipif(hk.CXX is None, reason="no host C++ compiler"), pytest.mark.slow]


@pytest.fixture
def host_gpu(monkeypatch):
    """Route the device API to host memory; returns nothing, patches for the test's duration."""
    hk.route_blobs_to_host(monkeypatch)
    held: list[np.ndarray] = []

    def kernel(path, name, dtype):
        lib, sigs = hk.serial_library(path, dtype)
        fn = getattr(lib, name)
        return lambda *args: fn(*hk.kernel_args(sigs[name], args, dtype))

    def gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, dtype, lda=None, ldb=None, ldc=None):
        assert lda is ldb is ldc is None
        A = _array(a, (k, m) if trans_a else (m, k), dtype)
        B = _array(b, (n, k) if trans_b else (k, n), dtype)
        C = _array(c, (m, n), dtype)
        prod = (A.T if trans_a else A).astype(np.float64) @ (B.T if trans_b else B).astype(np.float64)
        C[...] = alpha * prod + (beta * C if beta else 0)

    monkeypatch.setattr(backend, "kernel", kernel)
    monkeypatch.setattr(backend, "workspace", hk.host_workspace(held))
    monkeypatch.setattr(backend, "memset_zero", lambda ptr, nbytes: _array(ptr, (nbytes,), np.uint8).fill(0))
    monkeypatch.setattr(blas, "gemm", gemm)
    monkeypatch.setattr(gm, "copy", lambda n, x, y, dt: _array(y, (n,), dt).__setitem__(..., _array(x, (n,), dt)))
    monkeypatch.setattr(gm, "set", lambda n, v, y, dt: _array(y, (n,), dt).fill(v))
    monkeypatch.setattr(gm, "add_bias", lambda rows, cols, bias, y, dt: _array(y, (rows, cols), dt).__iadd__(
        _array(bias, (cols,), dt)))

    def sum_rows_into(rows, cols, x, y, dt, beta=1.0):
        out = _array(y, (cols,), dt)
        out[...] = _array(x, (rows, cols), dt).sum(axis=0) + beta * out
    monkeypatch.setattr(gm, "sum_rows_into", sum_rows_into)

    def run_plan(plan, src, dst, dt):  # pycaffe_lite.gpu.permute's kernels (their own host test), in numpy
        _array(dst, plan.top_shape, dt)[...] = _array(src, plan.shape, dt).transpose(plan.order)
    monkeypatch.setattr(permute.Plan, "__call__", run_plan)
    yield


def _run(text, arrays, ntop, propagate, gpu, dtype):
    common.set_random_seed(5)
    layer = make_layer(text, dtype)
    bottom, top = blobs(arrays, dtype), empty_blobs(ntop, dtype)
    layer.setup(bottom, top)
    rng = np.random.default_rng(5)
    for _ in range(2):  # twice: state carried between forwards is exercised too
        layer.reshape(bottom, top)
        (layer.forward_gpu if gpu else layer.forward_cpu)(bottom, top)
    for t in top:
        t.mutable_cpu_diff()[...] = rng.standard_normal(t.shape)
    for p in layer.blobs:
        p.mutable_cpu_diff()[...] = 0.25
    for b, p in zip(bottom, propagate):
        if p:
            b.mutable_cpu_diff()[...] = 99.0  # must be overwritten
    (layer.backward_gpu if gpu else layer.backward_cpu)(top, propagate, bottom)
    out = [t.cpu_data().copy() for t in top]
    out += [b.cpu_diff().copy() for b, p in zip(bottom, propagate) if p]
    out += [p.cpu_diff().copy() for p in layer.blobs]
    return out


RNG = np.random.default_rng(17)
X3 = RNG.standard_normal((4, 3, 5))
CLIP = np.array([[0.0, 0.0, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
CASES = {
    "lstm_unit": ('type: "LSTMUnit"', [RNG.standard_normal((1, 3, 4)), RNG.standard_normal((1, 3, 16)),
                                       np.array([[1.0, 0.0, 1.0]])], 2, [True, True, False]),
    "lstm_unit_x_only": ('type: "LSTMUnit"', [RNG.standard_normal((1, 3, 4)), RNG.standard_normal((1, 3, 16)),
                                              np.array([[1.0, 0.0, 1.0]])], 2, [False, True, False]),
    "ctpn_lstm": ('type: "Lstm" lstm_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 } '
                  'bias_filler { type: "gaussian" std: 0.5 } }', [X3], 1, [True]),
    "ctpn_lstm_clip": ('type: "Lstm" lstm_param { num_output: 4 clipping_threshold: 0.05 weight_filler '
                       '{ type: "gaussian" std: 0.5 } }', [X3 * 2, CLIP], 1, [True, False]),
    "reverse": ('type: "Reverse" reverse_param { axis: 1 }', [X3], 1, [True]),
    "transpose": ('type: "Transpose" transpose_param { dim: 2 dim: 0 dim: 1 }', [X3], 1, [True]),
    "filter": ('type: "Filter"', [X3.transpose(1, 0, 2).copy(), RNG.standard_normal((3, 2)),
                                  np.array([1.0, 0.0, 1.0])], 2, [True, True, False]),
    "batch_reindex": ('type: "BatchReindex"', [X3, np.array([3.0, 0.0, 3.0, 1.0, 3.0])], 1, [True, False]),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu_path_on_host_matches_cpu(host_gpu, case, dtype):
    text, arrays, ntop, propagate = CASES[case]
    cpu = _run(text, arrays, ntop, propagate, gpu=False, dtype=dtype)
    gpu = _run(text, arrays, ntop, propagate, gpu=True, dtype=dtype)
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-5)
    assert len(cpu) == len(gpu)
    for i, (a, b) in enumerate(zip(cpu, gpu)):
        np.testing.assert_allclose(b, a, err_msg=f"{case}: array {i}", **tol)
