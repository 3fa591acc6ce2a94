"""GPU backend: device init, memory, copies, memset, kernel cache and launch checks."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import CudaError, GPUUnavailableError
from pycaffe_lite.gpu import backend

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_mode")]

KERNEL_SRC = """
__global__ void fill_index(const int n, const Dtype offset, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = Dtype(i) + offset; }
}
// one block per row, shared-memory sum of `cols` values
__global__ void row_sum(const int cols, const Dtype* x, Dtype* out) {
  extern __shared__ unsigned char raw[];
  Dtype* buf = reinterpret_cast<Dtype*>(raw);
  Dtype acc = 0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) acc += x[blockIdx.x * cols + j];
  buf[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}
"""


@pytest.fixture
def kernel_file(tmp_path):
    path = tmp_path / "backend_test_kernels.cu"
    path.write_text(KERNEL_SRC)
    return path


def to_device(a: np.ndarray):
    mem = backend.alloc(a.nbytes)
    backend.memcpy_htod(int(mem), a)
    return mem


def to_host(ptr, shape, dtype) -> np.ndarray:
    out = np.empty(shape, dtype)
    backend.memcpy_dtoh(out, int(ptr))
    return out


def test_init_is_idempotent():
    st = backend.state()
    backend.init_device(st.device_id)
    assert backend.state() is st
    caffe.set_mode_gpu()
    assert backend.state() is st
    assert backend.is_initialized()
    assert isinstance(backend.device_name(), str) and backend.device_name()


def test_set_device_out_of_range_names_the_count():
    import pycuda.driver as cuda

    count = cuda.Device.count()
    st = backend.state()
    try:
        with pytest.raises(GPUUnavailableError, match=f"device {count} requested but only {count}"):
            caffe.set_device(count)
    finally:
        caffe.set_device(st.device_id)
    assert backend.state() is st  # the failed switch kept the working device


def test_alloc_htod_dtoh_roundtrip():
    for dtype in (np.float32, np.float64, np.int32, np.uint8):
        a = (np.arange(1000) % 97).astype(dtype)
        mem = to_device(a)
        np.testing.assert_array_equal(to_host(mem, a.shape, dtype), a)


def test_htod_accepts_non_contiguous_source():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    mem = backend.alloc(a.size * 4)
    backend.memcpy_htod(int(mem), a)
    np.testing.assert_array_equal(to_host(mem, a.shape, np.float32), a)


def test_dtoh_rejects_non_contiguous_destination():
    mem = to_device(np.zeros(8, np.float32))
    dst = np.zeros((4, 4), np.float32)[:, ::2]
    with pytest.raises(CudaError, match="C-contiguous"):
        backend.memcpy_dtoh(dst, int(mem))


def test_dtod_copy_with_offsets():
    a = np.arange(10, dtype=np.float64)
    src = to_device(a)
    dst = to_device(np.full(10, -1.0))
    backend.memcpy_dtod(int(dst) + 2 * 8, int(src) + 5 * 8, 3 * 8)
    backend.memcpy_dtod(int(dst), int(src), 0)  # no-op
    expected = np.full(10, -1.0)
    expected[2:5] = a[5:8]
    np.testing.assert_array_equal(to_host(dst, 10, np.float64), expected)


@pytest.mark.parametrize("nbytes", [0, 3, 4, 7, 64, 1001])
def test_memset_zero_touches_exactly_nbytes(nbytes):
    a = np.full(1100, 0xAB, np.uint8)
    mem = to_device(a)
    backend.memset_zero(int(mem), nbytes)
    out = to_host(mem, a.shape, np.uint8)
    assert (out[:nbytes] == 0).all()
    assert (out[nbytes:] == 0xAB).all()


def test_memset_zero_at_unaligned_offset():
    mem = to_device(np.full(16, 7, np.uint8))
    backend.memset_zero(int(mem) + 1, 8)  # not 4-byte aligned start
    out = to_host(mem, 16, np.uint8)
    np.testing.assert_array_equal(out, [7] + [0] * 8 + [7] * 7)


def test_synchronize_and_stream():
    assert backend.stream() is backend.state().stream
    backend.synchronize()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_cache_compiles_each_file_once_per_dtype(kernel_file, dtype, monkeypatch):
    import pycuda.compiler

    calls = []
    real = pycuda.compiler.SourceModule

    def counting(source, *args, **kwargs):
        calls.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(pycuda.compiler, "SourceModule", counting)
    m1 = backend.module(kernel_file, dtype)
    m2 = backend.module(kernel_file, dtype)
    k1 = backend.kernel(kernel_file, "fill_index", dtype)
    k2 = backend.kernel(kernel_file, "fill_index", dtype)
    assert m1 is m2 and m1.module is m2.module
    assert k1 is k2 and k1.function is m1.get("fill_index").function
    assert len(calls) == 1
    ctype = "float" if np.dtype(dtype) == np.float32 else "double"
    assert f"typedef {ctype} Dtype;" in calls[0]
    other = np.float64 if np.dtype(dtype) == np.float32 else np.float32
    m3 = backend.module(kernel_file, other)
    assert m3 is not m1 and m3.dtype == np.dtype(other)
    assert len(calls) == 2
    assert backend.module(str(kernel_file), dtype) is m1  # str and Path name the same file


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 255, 256, 257, 100_003])
def test_grid_stride_launch_covers_every_item(kernel_file, dtype, n):
    k = backend.kernel(kernel_file, "fill_index", dtype)
    mem = to_device(np.full(n + 5, -7, dtype))
    k(n, 0.5, int(mem))
    out = to_host(mem, n + 5, dtype)
    np.testing.assert_array_equal(out[:n], np.arange(n, dtype=dtype) + dtype(0.5))
    assert (out[n:] == -7).all()  # nothing written past n


def test_grid_is_capped_but_all_items_done(kernel_file):
    n = backend.MAX_BLOCKS * backend.CUDA_NUM_THREADS + 1000  # needs the grid-stride loop
    k = backend.kernel(kernel_file, "fill_index", np.float32)
    mem = backend.alloc(n * 4)
    k(n, 0.0, int(mem))
    out = to_host(mem, n, np.float32)
    assert out[-1] == np.float32(n - 1) and out[0] == 0 and out[n // 2] == np.float32(n // 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_explicit_grid_block_and_shared_memory(kernel_file, dtype):
    rows, cols, threads = 5, 300, 128
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(dtype)
    xd, out = to_device(x), backend.alloc(rows * np.dtype(dtype).itemsize)
    k = backend.kernel(kernel_file, "row_sum", dtype)
    k(cols, int(xd), int(out), grid=(rows, 1, 1), block=threads,
      shared=threads * np.dtype(dtype).itemsize)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(to_host(out, rows, dtype), x.sum(axis=1), rtol=tol, atol=tol)


def test_kernel_argument_checks_on_a_real_kernel(kernel_file):
    k = backend.kernel(kernel_file, "fill_index", np.float32)
    mem = backend.alloc(64)
    with pytest.raises(CudaError, match="argument 2 .* null device pointer"):
        k(4, 0.0, 0)
    with pytest.raises(CudaError, match="argument 0 'n' .* does not fit"):
        k(2**31, 0.0, int(mem))
    with pytest.raises(CudaError, match=r"fill_index \(.*backend_test_kernels.cu\): takes 3 arguments"):
        k(4, int(mem))
    with pytest.raises(CudaError, match="work items exceed int32"):
        k(2**31 - 1, 0.0, int(mem))
    k(4, 1.0, int(mem))  # still usable after the refusals
    np.testing.assert_array_equal(to_host(mem, 4, np.float32), [1, 2, 3, 4])


def test_missing_kernel_name_names_the_file(kernel_file):
    with pytest.raises(CudaError, match="no_such_kernel.*backend_test_kernels.cu"):
        backend.kernel(kernel_file, "no_such_kernel", np.float32)


def test_compile_error_names_the_file(tmp_path):
    bad = tmp_path / "broken_kernels.cu"
    bad.write_text("__global__ void k(const int n) { undefined_symbol_here; }\n")
    with pytest.raises(CudaError, match="broken_kernels.cu"):
        backend.module(bad, np.float32)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CudaError, match="cannot read kernel file"):
        backend.module(tmp_path / "absent.cu", np.float64)


def test_growing_the_workspace_gives_the_old_buffer_back():
    """Growing a workspace slot frees its old buffer to the driver: the pool holds the new size only
    (a kept reference once left every outgrown size cached in the pool)."""
    backend.release_workspace()
    backend.state().pool.free_held()
    mib = 1 << 20
    base = backend.memory_held()["pool"]
    backend.workspace(64 * mib)
    backend.workspace(96 * mib)
    backend.workspace(128 * mib)
    held = backend.memory_held()["pool"] - base
    assert 128 * mib <= held < 160 * mib, held / mib
    backend.release_workspace()


def test_resident_blocks_follow_shared_memory_and_threads(kernel_file):
    """row_sum uses few registers: what limits its blocks per multiprocessor is the thread count
    or, with large dynamic shared memory, the shared memory (1 KiB per block reserved)."""
    st = backend.state()
    attr = st.cuda.device_attribute
    threads, smem = (st.device.get_attribute(a) for a in (attr.MAX_THREADS_PER_MULTIPROCESSOR,
                                                          attr.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR))
    k = backend.kernel(kernel_file, "row_sum", np.float32)
    assert k.resident_blocks(1024) == threads // 1024 and k.resident_blocks(256) == threads // 256
    k.allow_shared(100 * 1024)
    assert k.resident_blocks(256, 100 * 1024) == max(1, smem // (101 * 1024)) < threads // 256


def test_a_shared_memory_segment_is_page_locked_and_uploads_from_it(gpu_mode):
    """driver.register_host page-locks memory the process did not allocate through CUDA (the data
    workers' shared batches); an asynchronous upload from it gives the values."""
    from multiprocessing import shared_memory

    from pycaffe_lite.gpu import backend, driver

    shm = shared_memory.SharedMemory(create=True, size=3 * 4096 + 100)
    try:
        host = np.frombuffer(shm.buf, np.uint8)[100:100 + 2 * 4096].view(np.float32)
        host[...] = np.arange(host.size, dtype=np.float32)
        unregister = driver.register_host(host)
        dev = backend.alloc(host.nbytes)
        event = backend.memcpy_htod(int(dev), host, pinned=True)
        back = np.empty_like(host)
        backend.memcpy_dtoh(back, int(dev))
        assert event is not None
        np.testing.assert_array_equal(back, host)
        unregister()
        del host
    finally:
        shm.close()
        shm.unlink()


class _Cycle:
    """A reference cycle holding a device block, as a dropped Net or Solver is."""

    def __init__(self, nbytes: int) -> None:
        self.block = backend.alloc(nbytes)
        self.me = self


def test_the_device_check_collects_dropped_cycles_before_refusing(monkeypatch):
    """A net dropped by its user is a reference cycle whose blocks stay in use until Python's cyclic
    collector runs; the device check collects before refusing (it refused ResNet-50 at 15.9 GiB with
    over 100 GiB held by earlier, dropped solvers of the same process)."""
    from pycaffe_lite import memcheck
    from pycaffe_lite.memcheck import OutOfMemoryError

    MiB = 1 << 20
    st = backend.state()
    st.pool.free_held()
    top = st.pool.managed_bytes + 60 * MiB  # the driver has 60 MiB left for this test
    monkeypatch.setattr(memcheck, "driver_free", lambda: max(0, top - st.pool.managed_bytes))
    gc.disable()
    try:
        _Cycle(40 * MiB)  # garbage at once, collected only by gc
        memcheck.check_total("net 'b'", [("b", 40 * MiB)], device=True)
        with pytest.raises(OutOfMemoryError, match=r"net 'c': its blobs would need 61.0 MiB, more than the "
                                                   r"60.0 MiB of GPU memory still free"):
            memcheck.check_total("net 'c'", [("c", 61 * MiB)], device=True)
    finally:
        gc.enable()


def test_alloc_collects_dropped_cycles_when_the_device_is_full(monkeypatch):
    st = backend.state()
    real = st.pool

    class FullWhileTheCycleLives:
        def __getattr__(self, name):
            return getattr(real, name)

        def allocate(self, nbytes):
            if dropped() is not None:
                raise st.cuda.MemoryError("out of memory (test)")
            return real.allocate(nbytes)

    gc.disable()
    try:
        dropped = weakref.ref(_Cycle(1 << 20))
        monkeypatch.setattr(st, "pool", FullWhileTheCycleLives())
        block = backend.alloc(1 << 20)
        assert int(block) and dropped() is None
    finally:
        gc.enable()


def test_a_dropped_net_is_collected_with_its_device_memory(tmp_path):
    """No registry of the package keeps a dropped net alive: the cyclic collector frees it and the
    pool gets its blocks back."""
    path = tmp_path / "net.prototxt"
    path.write_text('input: "data" input_shape { dim: 8 dim: 3 dim: 64 dim: 64 }\n'
                    'layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" '
                    'convolution_param { num_output: 16 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }\n'
                    'layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }\n')
    st = backend.state()
    gc.collect()
    before = st.pool.active_bytes
    gc.disable()
    try:
        net = caffe.Net(str(path), caffe.TEST)
        net.blobs["data"].data[...] = 1.0
        for _ in range(3):  # warm-up, capture, replay
            net.forward()
        backend.synchronize()
        blobs = sum(blob.data.nbytes for blob in net.blobs.values())
        during = st.pool.active_bytes
        assert during - before >= blobs
        alive = weakref.ref(net)
        del net
        backend.reclaim()
        assert alive() is None
        assert during - st.pool.active_bytes >= blobs
    finally:
        gc.enable()


def test_the_peak_counts_blocks_given_back(monkeypatch):
    """``memory_held()['peak']`` keeps what the workspace held before it was given back to the
    driver (the convolution autotune's operands are such blocks), where ``device`` reads now."""
    st = backend.state()
    real = st.cuda

    class OnlyOurPool:  # the driver's count as if no other process used the device (xdist workers do)
        def __getattr__(self, name):
            return getattr(real, name)

        def mem_get_info(self):
            return st.free_at_init - st.pool.managed_bytes, 0

    monkeypatch.setattr(st, "cuda", OnlyOurPool())
    backend.release_workspace()
    st.pool.free_held()
    monkeypatch.setattr(st, "peak_used", 0)
    base = st.pool.managed_bytes
    backend.workspace(256 << 20)
    backend.release_workspace()
    held = backend.memory_held()
    assert held["device"] == base
    assert held["peak"] >= base + (256 << 20)
