"""The N-D convolution and pooling CUDA kernels (``conv/im2col_nd.cu``, ``layers/pooling_nd.cu``) run on the
host: each .cu is compiled as plain C++ (``__global__`` -> ``extern "C"``, the grid-stride loop a plain
loop, Dtype double) and called through ctypes with numpy memory as "device" memory. The kernels'
index arithmetic, argument order and the GPU orchestration of ``conv/nd.py`` (cuBLAS and the
math helpers replaced by numpy on the same pointers) are compared with the CPU code. Without a C++
compiler the module is skipped; the GPU suite runs the real thing."""

from __future__ import annotations

import ctypes
import itertools
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite.conv import cpu_nd as cpu_conv_nd
from pycaffe_lite.conv import im2col_nd as gpu_cols
from pycaffe_lite.conv import nd as conv_nd
from pycaffe_lite.gpu import backend, blas
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.gpu.signatures import parse_signatures
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

pytestmark = pytest.mark.slow  # compiles two files with g++ (about a second each)

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"im2col_nd": ROOT / "pycaffe_lite/conv/im2col_nd.cu", "pooling_nd": ROOT / "layers/pooling_nd.cu"}
PRELUDE = """#include <algorithm>
#include <cmath>
using std::min; using std::max;
#define __global__ extern "C"
#define __device__
#define __host__
#define __forceinline__ inline
#define CUDA_KERNEL_LOOP(i, n) for (int i = 0; i < (n); ++i)
typedef double Dtype;
typedef double Mtype;
static inline Mtype to_m(const Dtype x) { return x; }
static inline Dtype from_m(const Mtype x) { return x; }
"""
CTYPES = {"ptr": ctypes.c_void_p, "int": ctypes.c_int, "uint": ctypes.c_uint, "scalar": ctypes.c_double,
          "mscalar": ctypes.c_double,
          "float": ctypes.c_float, "double": ctypes.c_double}


class HostKernel:
    def __init__(self, fn, sig):
        fn.argtypes = [CTYPES[p.kind] for p in sig.params]
        fn.restype = None
        self.fn, self.sig = fn, sig

    def __call__(self, *args, grid=None, block=None, shared=0):
        assert len(args) == len(self.sig.params), (self.sig.name, len(args), len(self.sig.params))
        self.fn(*args)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++ to compile the kernels for the host")
    out = tmp_path_factory.mktemp("host_kernels")
    kernels = {}
    for key, path in SOURCES.items():
        src = out / f"{key}.cpp"
        src.write_text(PRELUDE + path.read_text())
        lib = out / f"{key}.so"
        subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
        so = ctypes.CDLL(str(lib))
        for name, sig in parse_signatures(path.read_text()).items():
            kernels[(path.name, name)] = HostKernel(getattr(so, name), sig)
    return kernels


def ptr(a: np.ndarray) -> int:
    assert a.flags.c_contiguous and a.dtype == np.float64 or a.dtype == np.int32
    return a.ctypes.data


def view(address: int, count: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_double * count).from_address(address))


@pytest.fixture
def fake_device(host, monkeypatch):
    """backend.kernel / workspace / elementwise, blas and math helpers on host memory."""
    keep: list[np.ndarray] = []

    def kernel(path, name, dtype):
        assert np.dtype(dtype) == np.float64
        return host[(Path(path).name, name)]

    def workspace(*sizes, slot="main"):
        bufs = [np.zeros(max(int(s), 8) // 8 + 1) for s in sizes]
        keep.extend(bufs)
        return [b.ctypes.data for b in bufs]

    def matrix(address, rows, cols, ld):
        flat = view(address, (rows - 1) * ld + cols)
        return np.lib.stride_tricks.as_strided(flat, (rows, cols), (8 * ld, 8))

    def gemm_strided_batched(ta, tb, m, n, k, alpha, a, sa, b, sb, beta, c, sc, batch, dtype, lda=None, ldb=None,
                             ldc=None):
        for i in range(batch):
            ar, ac = (k, m) if ta else (m, k)
            br, bc = (n, k) if tb else (k, n)
            am = matrix(a + 8 * i * sa, ar, ac, lda or ac)
            bm = matrix(b + 8 * i * sb, br, bc, ldb or bc)
            cm = matrix(c + 8 * i * sc, m, n, ldc or n)
            cm[...] = alpha * (am.T if ta else am) @ (bm.T if tb else bm) + (beta * cm if beta else 0)

    def add_channel_bias(num, c, spatial, bias, y, dt):
        view(y, num * c * spatial).reshape(num, c, spatial)[...] += view(bias, c)[None, :, None]

    def channel_sum(num, c, spatial, x, out, dt, beta=1.0):
        o = view(out, c)
        o[...] = beta * o + view(x, num * c * spatial).reshape(num, c, spatial).sum(axis=(0, 2))

    def elementwise(name, params, body, dtype, preamble=""):
        assert name == "conv_nd_relu"

        def relu(n, y):
            v = view(y, n)
            np.maximum(v, 0, out=v)
        return relu

    monkeypatch.setattr(backend, "kernel", kernel)
    monkeypatch.setattr(backend, "workspace", workspace)
    monkeypatch.setattr(backend, "elementwise", elementwise)
    monkeypatch.setattr(blas, "gemm_strided_batched", gemm_strided_batched)
    monkeypatch.setattr(gm, "add_channel_bias", add_channel_bias)
    monkeypatch.setattr(gm, "channel_sum", channel_sum)
    return host


GEOMETRIES = [  # (image shape (N, C, *S), kernel, pad, stride, dilation)
    ((2, 3, 9), (3,), (1,), (2,), (1,)),
    ((2, 2, 7, 6), (3, 2), (1, 0), (2, 1), (1, 2)),
    ((1, 4, 6, 5, 7), (3, 2, 3), (1, 0, 2), (2, 1, 3), (1, 2, 1)),
    ((2, 2, 4, 4, 4), (2, 2, 2), (0, 0, 0), (1, 1, 1), (1, 1, 1)),
    ((2, 2, 1, 3, 2), (2, 2, 3), (0, 0, 0), (2, 2, 2), (1, 1, 1)),  # BVLC's truncation: windows overhang
]


@pytest.mark.parametrize("shape,kernel,pad,stride,dilation", GEOMETRIES)
def test_im2col_col2im_kernels(fake_device, shape, kernel, pad, stride, dilation):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    want = cpu_conv_nd.columns(x, kernel, pad, stride, dilation)
    cols = np.full(want.shape, np.nan)
    gpu_cols.im2col(ptr(x), shape[0], shape[1], shape[2:], kernel, pad, stride, dilation, ptr(cols), np.float64)
    np.testing.assert_array_equal(cols, want)
    # a slab of the outermost output axis (after padding to 3 axes) holds those output positions' columns
    out = gpu_cols.padded_out(shape[2:], kernel, pad, stride, dilation)
    if out[0] > 1:
        slab = np.full((shape[0], want.shape[1], 1 * out[1] * out[2]), np.nan)
        gpu_cols.im2col(ptr(x), shape[0], shape[1], shape[2:], kernel, pad, stride, dilation, ptr(slab), np.float64,
                        rows=(1, 1))
        np.testing.assert_array_equal(slab, want[:, :, out[1] * out[2]:2 * out[1] * out[2]])
    dcol = rng.standard_normal(want.shape)
    dx = np.full(shape, np.nan)
    gpu_cols.col2im(ptr(dcol), shape[0], shape[1], shape[2:], kernel, pad, stride, dilation, ptr(dx), np.float64)
    np.testing.assert_allclose(dx, cpu_conv_nd.col2im(dcol, shape, kernel, pad, stride, dilation), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("slab_bytes", [None, 1])
@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("shape,kernel,pad,stride,dilation", GEOMETRIES)
def test_conv_nd_passes(fake_device, monkeypatch, shape, kernel, pad, stride, dilation, group, slab_bytes):
    """Whole-image columns, and (slab_bytes 1) one output row of the outermost axis per slab."""
    if slab_bytes is not None:
        monkeypatch.setattr(conv_nd, "COL_BUFFER_BYTES", slab_bytes)
    rng = np.random.default_rng(1)
    n, c, *size = shape
    if c % group:
        pytest.skip("channels not divisible by the group")
    m = 2 * group
    prob = conv_nd.NDProblem(n, c, tuple(size), m, group, kernel, pad, stride, dilation, "<f8")
    assert len(prob.slabs()) == (1 if slab_bytes is None else prob.slab_total())
    x = rng.standard_normal(shape)
    w = rng.standard_normal((m, c // group) + kernel)
    bias = rng.standard_normal(m)
    want = np.empty((n, m) + prob.out_shape)
    cpu_conv_nd.forward(x, w, bias, kernel, pad, stride, dilation, group, want)
    y = np.full(want.shape, np.nan)
    conv_nd.forward(prob, ptr(x), ptr(w), ptr(bias), ptr(y), relu=True)
    np.testing.assert_allclose(y, np.maximum(want, 0), rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(want.shape)
    dw_want, db_want, dx_want = np.full(w.shape, 0.5), np.full(m, 0.5), np.empty(shape)
    cpu_conv_nd.backward(x, w, dy, kernel, pad, stride, dilation, group, dweight=dw_want, dbias=db_want, dx=dx_want)
    dw, db, dx = np.full(w.shape, 0.5), np.full(m, 0.5), np.full(shape, np.nan)
    conv_nd.backward_weight(prob, ptr(x), ptr(dy), ptr(dw), ptr(db))
    conv_nd.backward_data(prob, ptr(w), ptr(dy), ptr(dx))
    for got, ref in ((dw, dw_want), (db, db_want), (dx, dx_want)):
        np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-11)


POOL_CASES = [
    ((2, 2, 9), "kernel_size: 3 stride: 2 pad: 1"),
    ((2, 3, 7, 6), "kernel_size_nd: 3 stride: 2"),  # 2-D through the general path
    ((1, 2, 6, 5, 7), "kernel_size_nd: 3 kernel_size_nd: 2 kernel_size_nd: 3 stride_nd: 2 stride_nd: 1 stride_nd: 3 "
     "pad_nd: 1 pad_nd: 0 pad_nd: 1"),
    ((1, 2, 7, 6, 5), "kernel_size: 3 stride: 2 pad: 1 ceil_mode: false"),
]


def _pool(body, x, phase="TRAIN"):
    layer = make_layer(f'name: "p" type: "Pooling" phase: {phase} pooling_param {{ {body} }}')
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("shape,body", POOL_CASES)
def test_pooling_kernels(host, shape, body):
    rng = np.random.default_rng(2)
    x = rng.permutation(np.prod(shape)).reshape(shape) / 3.0 - 5.0
    kern = {name: k for (f, name), k in host.items() if f == "pooling_nd.cu"}
    for method in ("MAX", "AVE"):
        layer, bottom, top = _pool(f"pool: {method} {body}", x)
        nd = layer.nd
        geo = nd._geometry()
        count = top[0].count
        y = np.full(top[0].shape, np.nan)
        dy = rng.standard_normal(top[0].shape)
        top[0].diff[...] = dy
        layer.backward(top, [True], bottom)
        dx = np.full(shape, np.nan)
        if method == "MAX":
            idx = np.full(top[0].shape, 7, np.int32)
            kern["nd_max_pool_forward"](count, ptr(x), *geo, ptr(y), ptr(idx))
            np.testing.assert_array_equal(idx, nd.cpu_index)
            mask = np.full(top[0].shape, np.nan)
            kern["nd_pool_index_to_dtype"](count, ptr(idx), ptr(mask))
            np.testing.assert_array_equal(mask, nd.cpu_index)
            kern["nd_routed_pool_backward"](x.size, ptr(dy), ptr(idx), *geo, ptr(dx))
        else:
            kern["nd_ave_pool_forward"](count, ptr(x), *geo, ptr(y))
            kern["nd_ave_pool_backward"](x.size, ptr(dy), *geo, ptr(dx))
        np.testing.assert_allclose(y, top[0].data, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dx, bottom[0].diff, rtol=1e-12, atol=1e-12)


def test_stochastic_kernels(host):
    kern = {name: k for (f, name), k in host.items() if f == "pooling_nd.cu"}
    rng = np.random.default_rng(3)
    shape = (2, 3, 7, 6)
    x = rng.uniform(0.1, 1.0, shape)
    layer, _, top = _pool("pool: STOCHASTIC kernel_size: 3 stride: 2", x, "TEST")
    geo = layer.nd._geometry()
    y = np.full(top[0].shape, np.nan)
    kern["nd_sto_pool_forward_test"](top[0].count, ptr(x), *geo, ptr(y))
    np.testing.assert_allclose(y, top[0].data, rtol=1e-12)
    # TRAIN: every pick is a member of its window and carries its value; the counter advances
    counter = np.zeros(1, np.uint32)
    idx = np.full(top[0].shape, -5, np.int32)
    kern["nd_sto_pool_forward_train"](top[0].count, ptr(x), *geo, counter.ctypes.data, 1234, 0, ptr(y), ptr(idx))
    kern["nd_sto_pool_advance"](counter.ctypes.data, grid=1, block=1)
    assert counter[0] == 1
    planes = x.reshape(6, -1)
    for p, (qy, qx) in itertools.product(range(6), itertools.product(range(3), range(3))):
        i = idx.reshape(6, 3, 3)[p, qy, qx]
        h, w = divmod(int(i), 6)
        assert qy * 2 <= h < min(qy * 2 + 3, 7) and qx * 2 <= w < min(qx * 2 + 3, 6)
        assert y.reshape(6, 3, 3)[p, qy, qx] == planes[p, i]
    # frequencies over many windows of (0, 1, 3, 4)
    values = np.array([0.0, 1.0, 3.0, 4.0])
    xs = np.broadcast_to(values.reshape(1, 1, 2, 2), (50, 100, 2, 2)).copy()
    lay, _, t = _pool("pool: STOCHASTIC kernel_size: 2 stride: 2", xs)
    ys = np.empty(t[0].shape)
    ids = np.empty(t[0].shape, np.int32)
    kern["nd_sto_pool_forward_train"](t[0].count, ptr(xs), *lay.nd._geometry(), counter.ctypes.data, 99, 3, ptr(ys),
                                      ptr(ids))
    freq = np.bincount(ids.ravel(), minlength=4) / ids.size
    assert freq[0] == 0
    np.testing.assert_allclose(freq, values / 8, atol=0.03)
    np.testing.assert_array_equal(ys.ravel(), values[ids.ravel()])
