"""Without PyCUDA the package works on the CPU, and GPU mode fails with a clear error.

Also checks the GPU backend's host-side argument validation, which runs before any device call.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import common
from pycaffe_lite.errors import CudaError, GPUUnavailableError
from pycaffe_lite.gpu import backend, blas
from pycaffe_lite.gpu.signatures import parse_signatures


@pytest.fixture
def no_pycuda(monkeypatch):
    """Make ``import pycuda`` fail and forget any initialised device."""
    for name in list(sys.modules):
        if name == "pycuda" or name.startswith("pycuda."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    monkeypatch.setattr(backend, "_state", None)
    yield
    caffe.set_mode_cpu()


def test_set_mode_gpu_without_pycuda_names_pycuda(no_pycuda):
    with pytest.raises(GPUUnavailableError, match="PyCUDA"):
        caffe.set_mode_gpu()
    assert common.mode() is common.Mode.CPU  # a failed switch leaves CPU mode on
    assert not backend.is_initialized()


def test_gpu_unavailable_is_a_caffe_error(no_pycuda):
    with pytest.raises(caffe.CaffeError):
        caffe.set_mode_gpu()


def test_set_device_negative_id_rejected():
    with pytest.raises(GPUUnavailableError, match="-1"):
        caffe.set_device(-1)


def test_cpu_net_runs_without_pycuda(no_pycuda):
    from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

    layer = make_layer("type: 'ReLU'")
    bottom, top = blobs([np.array([[-1.0, 2.0]])]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].cpu_data(), [[0.0, 2.0]])


@pytest.mark.slow
def test_importing_the_package_never_imports_pycuda():
    code = textwrap.dedent(
        """
        import sys
        import pycaffe_lite as caffe
        import pycaffe_lite.layers
        from pycaffe_lite.gpu import backend, blas, math_functions
        caffe.layer_type_list()
        b = caffe.Blob((2, 3))
        b.data[...] = 1
        b.cpu_diff()
        loaded = sorted(m for m in sys.modules if m == "pycuda" or m.startswith("pycuda."))
        assert not loaded, loaded
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# -- host-side checks that need no device ----------------------------------------------------
class _FakeFunction:
    """Stands in for a PyCUDA Function: records prepare and launches."""

    def __init__(self):
        self.format = None
        self.launches = []

    def prepare(self, fmt):
        self.format = fmt

    def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
        self.launches.append((grid, block, args, shared_size))


def _kernel(source: str, name: str = "k", dtype=np.float32, fn=None):
    sig = parse_signatures(source)[name]
    return backend.Kernel(fn or _FakeFunction(), sig, np.dtype(dtype), "demo.cu")


@pytest.mark.parametrize(("dtype", "expected"), [(np.float32, "iPfqI"), (np.float64, "iPdqI")])
def test_kernel_signature_maps_to_struct_codes(dtype, expected):
    fn = _FakeFunction()
    _kernel("__global__ void k(int n, float* p, Dtype a, long long q, unsigned int u) {}", dtype=dtype, fn=fn)
    assert fn.format == expected


@pytest.mark.parametrize(("dtype", "expected"), [(np.float32, "Pff"), (np.float64, "Pdd"), (np.float16, "Pef"),
                                               (np.uint16, "PHf")])
def test_mtype_scalars_are_packed_as_float_for_the_half_types(dtype, expected):
    """``Mtype`` parameters (kind mscalar) arrive as float for half and bfloat16 kernels, as Dtype otherwise."""
    fn = _FakeFunction()
    _kernel("__global__ void k(const Dtype* x, const Dtype a, const Mtype b) {}", dtype=dtype, fn=fn)
    assert fn.format == expected


def test_bfloat16_dtype_scalars_travel_as_rounded_bits(monkeypatch):
    monkeypatch.setattr(backend, "stream", lambda: None)  # no device: the fake function records the call
    fn = _FakeFunction()
    k = _kernel("__global__ void k(const int n, const Dtype a, const Mtype b) {}", dtype=np.uint16, fn=fn)
    k(4, 1.00390625 + 2**-10, 0.999)  # just above the tie 1 + 2^-8: rounds up to 1 + 2^-7
    (_, _, args, _), = fn.launches
    assert args == (4, 0x3F81, 0.999)  # 0x3F81 = 1 + 2^-7 in bfloat16; the Mtype one stays a float


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((4, 0, 1.0), "argument 1 'x' .* null device pointer"),
        ((2**31, 1234, 1.0), "argument 0 'n' .* does not fit"),
        ((-(2**31) - 1, 1234, 1.0), "argument 0 'n' .* does not fit"),
        ((4, 1234), r"takes 3 arguments \(n, x, a\), got 2"),
        ((4, 1234, 1.0, 5), "takes 3 arguments .*got 4"),
    ],
)
def test_kernel_argument_checks_raise_before_launch(args, match):
    fn = _FakeFunction()
    k = _kernel("__global__ void demo_kernel(const int n, const Dtype* x, Dtype a) {}", "demo_kernel", fn=fn)
    with pytest.raises(CudaError, match=match) as info:
        k(*args)
    assert "demo_kernel (demo.cu)" in str(info.value)
    assert fn.launches == []


def test_kernel_uint32_range_checked():
    k = _kernel("__global__ void k(const int n, unsigned int u) {}")
    with pytest.raises(CudaError, match="uint32"):
        k(1, -1)
    with pytest.raises(CudaError, match="uint32"):
        k(1, 2**32)


def test_kernel_rejects_more_work_items_than_int32():
    fn = _FakeFunction()
    k = _kernel("__global__ void k(const int n) {}", fn=fn)
    with pytest.raises(CudaError, match="int32"):
        k(2**31 - 1)
    assert fn.launches == []


def test_kernel_zero_items_launch_nothing():
    fn = _FakeFunction()
    _kernel("__global__ void k(const int n, const float* x) {}", fn=fn)(0, 1234)
    assert fn.launches == []


def test_kernel_without_count_needs_grid():
    k = _kernel("__global__ void k(const float* x) {}")
    with pytest.raises(CudaError, match="needs grid= and block="):
        k(1234)


def test_module_rejects_non_float_dtypes():
    with pytest.raises(CudaError, match="float32 and float64"):
        backend.module("layers/relu.cu", np.int32)


def test_blas_rejects_non_float_dtypes():
    with pytest.raises(CudaError, match="float32, float64, float16 or bfloat16"):
        blas._prefix(np.int64)


def test_prelude_defines_dtype_and_loop():
    text = backend.prelude(np.float64)
    assert text.startswith("typedef double Dtype;\ntypedef double Mtype;")
    assert "#define CUDA_KERNEL_LOOP(i, n)" in text


@pytest.mark.parametrize(("dtype", "ctype"), [(np.float16, "__half"), (np.uint16, "__nv_bfloat16")])
def test_half_prelude_stores_half_and_computes_in_float(dtype, ctype):
    text = backend.prelude(dtype)
    assert text.startswith('extern "C++" {\n#include <cuda_fp16.h>')
    assert f"typedef {ctype} Dtype;\ntypedef float Mtype;" in text
