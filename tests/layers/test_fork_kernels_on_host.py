"""The GPU paths of issue 36's fork semantics run on the host (pycaffe_lite.testing.host_kernels):
UnPooling's ``unpool_switches`` with a mask of more channels than the values (layers/unpooling.cu,
threaded build), and BReLU's elementwise bodies (NeuronLayer.launch's source, serial build). Each is
compared with the layer's CPU path; the GPU suite runs the same on a device."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from pycaffe_lite.gpu import backend
from pycaffe_lite.testing import host_kernels
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer

pytestmark = pytest.mark.skipif(host_kernels.CXX is None, reason="no host C++ compiler")


def cpu_and_host_gpu(text, arrays, monkeypatch, run_gpu):
    """(CPU tops and bottom diffs, the same from the layer's GPU methods on host kernels)."""
    results = []
    for gpu in (False, True):
        layer = make_layer(text)
        bottom, top = blobs(arrays), empty_blobs(1)
        layer.setup(bottom, top)
        top_diff = np.random.default_rng(7).standard_normal(top[0].shape)
        if gpu:
            with monkeypatch.context() as m:
                run_gpu(m)
                layer.forward_gpu(bottom, top)
                top[0].mutable_cpu_diff()[...] = top_diff
                layer.backward_gpu(top, [True] + [False] * (len(bottom) - 1), bottom)
        else:
            layer.forward_cpu(bottom, top)
            top[0].mutable_cpu_diff()[...] = top_diff
            layer.backward_cpu(top, [True] + [False] * (len(bottom) - 1), bottom)
        results.append((top[0].cpu_data().copy(), bottom[0].cpu_diff().copy()))
    return results


def test_unpooling_switch_kernel_reads_the_first_planes_of_a_wider_mask(monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 2, 3))
    mask = rng.permutation(np.arange(2 * 5 * 6) % 16).reshape(2, 5, 2, 3).astype(np.float64)
    text = 'type: "UnPooling" unpooling_param { unpool: MAX kernel_size: 2 stride: 2 unpool_h: 4 unpool_w: 4 }'
    (cpu_y, cpu_dx), (gpu_y, gpu_dx) = cpu_and_host_gpu(text, [x, mask], monkeypatch, host_kernels.threaded_device)
    np.testing.assert_array_equal(gpu_y, cpu_y)
    np.testing.assert_array_equal(gpu_dx, cpu_dx)
    assert np.count_nonzero(cpu_y) > 0


def host_elementwise(m):
    """backend.elementwise compiled on the host from the body the layer passes."""
    host_kernels.route_blobs_to_host(m)

    def elementwise(name, params, body, dtype, preamble=""):
        source = f"{preamble}\n__global__ void {name}(const int n, {params}) {{ CUDA_KERNEL_LOOP(i, n) {{ {body}; }} }}\n"
        lib = host_kernels.library(source, dtype, host_kernels.SERIAL_SHIM, name)
        scalar = host_kernels.C_TYPES[np.dtype(dtype)][0]
        kinds = [p.strip() for p in params.split(",")]

        def call(n, *args):
            values = [ctypes.c_int(n)] + [ctypes.c_void_p(a) if "*" in k else
                                         (ctypes.c_int(a) if k.startswith("const int") else scalar(a))
                                         for k, a in zip(kinds, args)]
            getattr(lib, name)(*values)
        return call

    m.setattr(backend, "elementwise", elementwise)


@pytest.mark.parametrize("bounds", ["minval: -0.5 maxval: 0.75", "", "minval: 1 maxval: -1"])
def test_brelu_elementwise_bodies_match_the_cpu(monkeypatch, bounds):
    x = np.concatenate([np.random.default_rng(1).uniform(-2, 2, 40), [-0.5, 0.75, 0.0, 1.0, -1.0, np.nan]])
    (cpu_y, cpu_dx), (gpu_y, gpu_dx) = cpu_and_host_gpu(f'type: "BReLU" brelu_param {{ {bounds} }}',
                                                        [x.reshape(2, 23)], monkeypatch, host_elementwise)
    np.testing.assert_array_equal(gpu_y, cpu_y)
    np.testing.assert_array_equal(gpu_dx, cpu_dx)
