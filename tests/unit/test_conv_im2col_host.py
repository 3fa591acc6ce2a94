"""The 2-D im2col / col2im CUDA kernels (``conv/im2col.cu``, the GEMM engine's) and its plane copies, built
for the host (pycaffe_lite.testing.host_kernels: the threaded build, blocks of OS threads on 1-3-D grids)
and called through ``conv/im2col.py``: columns and image gradients equal the CPU code's, including
BVLC's truncating output size, where the last window overhangs the padded input and reads zeros; the
copies (swap_leading_axes, copy_planes, subsample_planes, upsample_planes) equal numpy's in every
storage type, on each of their vector paths and on the element-by-element fallbacks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite.conv import cpu_nd
from pycaffe_lite.conv import im2col as gpu_im2col
from pycaffe_lite.gpu import backend
from pycaffe_lite.testing import host_kernels

pytestmark = pytest.mark.skipif(host_kernels.CXX is None, reason="no host C++ compiler")

CU = Path(gpu_im2col.__file__).with_name("im2col.cu")
DTYPES = [np.float64, np.float32, np.float16, np.uint16]  # (uint16: bfloat16 bit patterns)
GEOMETRIES = [  # (N, C, H, W), kernel, pad, stride, dilation
    ((2, 3, 6, 5), (3, 3), (1, 1), (1, 1), (1, 1)),
    ((2, 2, 7, 6), (3, 2), (1, 0), (2, 3), (2, 1)),
    ((3, 2, 1, 1), (2, 2), (0, 0), (2, 2), (1, 1)),   # (1 - 2) / 2 + 1 = 1: overhang
    ((2, 3, 2, 5), (3, 3), (0, 1), (2, 3), (1, 1)),   # rows (2 - 3) / 2 + 1 = 1: overhang
    ((2, 3, 11, 10), (7, 7), (3, 3), (2, 2), (1, 1)),  # an RGB stem: four phases of 16, 12, 12 and 9 taps
    ((1, 2, 9, 8), (5, 3), (2, 0), (3, 2), (1, 1)),   # mixed strides, ragged phase planes
]


@pytest.fixture
def host_device(monkeypatch):
    """im2col.cu's kernels run on the host (``host_kernels.threaded_device``); returns the list of
    launches, each (kernel name, arguments, grid, block)."""
    host_kernels.threaded_device(monkeypatch)
    threaded = backend.kernel
    log: list = []

    def kernel(path, name, dtype):
        assert Path(path) == CU
        run = threaded(path, name, dtype)

        def call(*args, grid=None, block=backend.CUDA_NUM_THREADS):
            log.append((name, args, grid, block))
            run(*args, grid=grid, block=block)
        return call

    monkeypatch.setattr(backend, "kernel", kernel)
    return log


def ptr(a: np.ndarray) -> int:
    assert a.flags.c_contiguous and a.dtype == np.float64
    return a.ctypes.data


@pytest.mark.parametrize("shape,kernel,pad,stride,dilation", GEOMETRIES)
def test_im2col_and_col2im_kernels_match_the_cpu(host_device, shape, kernel, pad, stride, dilation):
    rng = np.random.default_rng(0)
    n, c, h, w = shape
    x = rng.standard_normal(shape)
    want = cpu_nd.columns(x, kernel, pad, stride, dilation)  # (N, C*kh*kw, P)
    cols = np.full((want.shape[1], n, want.shape[2]), np.nan)
    gpu_im2col.im2col(ptr(x), n, c, (h, w), kernel, pad, stride, dilation, ptr(cols), np.float64)
    np.testing.assert_array_equal(cols, want.transpose(1, 0, 2))
    dcol = rng.standard_normal(cols.shape)
    dx = np.full(shape, np.nan)
    gpu_im2col.col2im(ptr(dcol), n, c, (h, w), kernel, pad, stride, dilation, ptr(dx), np.float64)
    ref = cpu_nd.col2im(np.ascontiguousarray(dcol.transpose(1, 0, 2)), shape, kernel, pad, stride, dilation)
    np.testing.assert_allclose(dx, ref, rtol=1e-12, atol=1e-12)
    assert host_device[-1][0] == ("col2im_batch_phased" if dilation == (1, 1) else "col2im_batch")


def _random(shape, dtype, seed: int) -> np.ndarray:
    """Random values to copy: normals in the float types, any 16-bit pattern in bfloat16's uint16."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.uint16:
        return rng.integers(0, 1 << 16, shape, dtype=np.uint16)
    return rng.standard_normal(shape).astype(dtype)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


def _vector_names(log, family: str) -> list[str]:
    return [name for name, *_ in log if name.startswith(family + "_")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("planes", "hw", "stride"), [(3, (9, 8), (2, 2)), (3, (7, 7), (2, 2)), (2, (7, 10), (3, 2)),
                                                      (5, (5, 3), (2, 3)), (1, (1, 1), (2, 2))])
def test_upsample_planes_vector_stores_match_numpy(host_device, dtype, planes, hw, stride):
    """upsample_planes's vector kernels (V elements a store, the pixel position kept by counters across
    rows and planes) put y at every stride-th pixel and zeros elsewhere, as the scalar kernel does."""
    h, w = hw
    x = _random((planes, h, w), dtype, 1)
    sub = np.ascontiguousarray(x[:, ::stride[0], ::stride[1]])
    itemsize = np.dtype(dtype).itemsize
    for shift in (0, 1):  # a vector kernel, then (x misaligned for it) the scalar one
        host_device.clear()
        view = host_kernels.aligned_copy(np.full(x.shape, 0x7F, dtype), shift)
        gpu_im2col.upsample_planes(sub.ctypes.data, planes, hw, stride, view.ctypes.data, dtype)
        want = np.zeros_like(x)
        want[:, ::stride[0], ::stride[1]] = sub
        np.testing.assert_array_equal(_bits(view), _bits(want))
        widths = [wd for wd in gpu_im2col.WIDTHS if wd > itemsize and (x.size * itemsize) % wd == 0]
        expect = f"upsample_planes_{widths[0]}b" if widths and not shift else "upsample_planes"
        assert [name for name, *_ in host_device] == [expect]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("planes", "hw", "stride"), [(3, (9, 8), (2, 2)), (3, (7, 7), (2, 2)), (2, (7, 10), (3, 2)),
                                                      (5, (5, 3), (2, 3)), (1, (1, 1), (2, 2)), (2, (14, 14), (2, 2)),
                                                      (6, (7, 14), (2, 2)), (4, (28, 28), (2, 2))])
def test_subsample_planes_vector_stores_match_numpy(host_device, dtype, planes, hw, stride):
    """subsample_planes's vector kernels (V values of y a store, the source pixel followed by counters
    across rows and planes) give x[:, ::sh, ::sw], as the scalar kernel does (a y misaligned for any
    vector, or a count no vector tiles)."""
    x = _random((planes,) + hw, dtype, 2)
    want = np.ascontiguousarray(x[:, ::stride[0], ::stride[1]])
    itemsize = np.dtype(dtype).itemsize
    for shift in (0, 1):
        host_device.clear()
        y = host_kernels.aligned_copy(np.full(want.shape, 0x7F, dtype), shift)
        gpu_im2col.subsample_planes(x.ctypes.data, planes, hw, stride, y.ctypes.data, dtype)
        np.testing.assert_array_equal(_bits(y), _bits(want))
        widths = [wd for wd in gpu_im2col.WIDTHS if wd > itemsize and (want.size * itemsize) % wd == 0]
        expect = f"subsample_planes_{widths[0]}b" if widths and not shift else "subsample_planes"
        assert [name for name, *_ in host_device] == [expect]


def test_subsample_planes_covers_every_store_width(host_device):
    """The geometries above reach each vector width and the scalar kernel in half precision."""
    seen = set()
    for planes, hw in [(2, (14, 14)), (2, (7, 7)), (1, (3, 3)), (1, (5, 1))]:
        x = _random((planes,) + hw, np.float16, 3)
        want = np.ascontiguousarray(x[:, ::2, ::2])
        y = host_kernels.aligned_copy(np.zeros(want.shape, np.float16))
        gpu_im2col.subsample_planes(x.ctypes.data, planes, hw, (2, 2), y.ctypes.data, np.float16)
        np.testing.assert_array_equal(_bits(y), _bits(want))
        seen.add(host_device[-1][0])
    assert seen == {"subsample_planes_16b", "subsample_planes_8b", "subsample_planes_4b", "subsample_planes"}


# (planes, plane, src_stride, dst_stride, src shift, dst shift) in elements; shifts misalign a pointer
COPIES = [
    (5, 49, 49, 56, 0, 0),    # packed 7x7 planes to planes padded to 16 bytes (half): vector stores only
    (5, 49, 56, 49, 0, 0),    # and back: vector loads only
    (3, 16, 24, 40, 0, 0),    # every side aligned at 16 bytes (half and float; double: 16 too)
    (3, 12, 14, 18, 0, 0),    # 8 bytes (half), 16 (float: 48/56/72 bytes, 8 only)
    (4, 6, 6, 10, 0, 0),      # 4 bytes (half)
    (3, 7, 9, 11, 0, 0),      # odd plane and strides: element by element
    (3, 16, 24, 40, 1, 0),    # aligned strides, src misaligned
    (3, 16, 24, 40, 0, 3),    # dst misaligned
    (4, 12, 12, 12, 0, 0),    # one contiguous run
    (4, 12, 12, 12, 1, 1),    # one run, both misaligned
    (2, 196, 196, 200, 0, 0), # 14x14 (half: 8 bytes both sides)
    (2, 1, 1, 3, 0, 0),       # one value a plane
    (2, 2100, 2104, 2100, 0, 0),  # more units a plane than a block row has threads
]


def _copy_case(case, dtype, seed):
    planes, plane, ss, ds, shift_s, shift_d = case
    src = host_kernels.aligned_copy(_random((planes, ss), dtype, seed).reshape(-1), shift_s)
    dst = host_kernels.aligned_copy(_random((planes, ds), dtype, seed + 1).reshape(-1), shift_d)
    want = dst.copy().reshape(planes, ds)
    want[:, :plane] = src.reshape(planes, ss)[:, :plane]
    return src, dst, want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", COPIES, ids=str)
@pytest.mark.parametrize("grid_limit", [None, 1])
def test_copy_planes_matches_numpy(host_device, monkeypatch, dtype, case, grid_limit):
    """copy_planes writes dst[:, :plane] = src[:, :plane] bit for bit and leaves dst's other values;
    the width chosen is the one at which most sides are aligned (the widest among equals), each side
    a vector where its pointer and stride allow it. With the grid's y dimension limited to 1 block
    (and x to 1) the kernels' grid-stride loops cover every plane."""
    if grid_limit:
        monkeypatch.setattr(backend, "MAX_GRID_YZ", grid_limit)
        monkeypatch.setattr(backend, "MAX_BLOCKS", grid_limit)
    planes, plane, ss, ds, shift_s, shift_d = case
    isz = np.dtype(dtype).itemsize
    src, dst, want = _copy_case(case, dtype, 4)
    gpu_im2col.copy_planes(src.ctypes.data, planes, plane, ss, dst.ctypes.data, ds, dtype)
    np.testing.assert_array_equal(_bits(dst), _bits(want.reshape(-1)))
    (name, args, grid, block), = host_device
    width = int(name.removeprefix("copy_planes_").removesuffix("b"))
    if ss == plane == ds:
        ss = ds = planes * plane
    fits = lambda ptr, stride, w: ptr % w == 0 and stride * isz % w == 0  # noqa: E731
    score = {w: fits(src.ctypes.data, ss, w) + fits(dst.ctypes.data, ds, w) for w in gpu_im2col.WIDTHS if w >= isz}
    assert (score[width], width) == max((v, w) for w, v in score.items())
    assert args[-2:] == (int(fits(src.ctypes.data, ss, width)), int(fits(dst.ctypes.data, ds, width)))
    if grid_limit:
        assert grid[:2] == (1, 1)


def test_copy_planes_reaches_every_path(host_device):
    """In half precision the cases above run each width with vectors on both sides, on the store side
    only, on the load side only, and on neither."""
    seen = set()
    for case in COPIES:
        src, dst, want = _copy_case(case, np.float16, 5)
        gpu_im2col.copy_planes(src.ctypes.data, case[0], case[1], case[2], dst.ctypes.data, case[3], np.float16)
        np.testing.assert_array_equal(_bits(dst), _bits(want.reshape(-1)))
        name, args, _, _ = host_device[-1]
        seen.add((name, args[-2], args[-1]))
    assert {("copy_planes_16b", 1, 1), ("copy_planes_8b", 1, 1), ("copy_planes_4b", 1, 1), ("copy_planes_16b", 0, 1),
            ("copy_planes_16b", 1, 0), ("copy_planes_16b", 0, 0)} <= seen


# (a_dim, b_dim, inner, shift of both pointers)
SWAPS = [(3, 5, 7, 0), (3, 5, 8, 0), (4, 2, 4, 0), (2, 3, 2, 0), (3, 5, 8, 1), (1, 6, 16, 0), (6, 1, 3, 0),
         (5, 3, 1, 0), (2, 40, 33, 0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SWAPS, ids=str)
@pytest.mark.parametrize("grid_limit", [None, 1])
def test_swap_leading_axes_matches_numpy(host_device, monkeypatch, dtype, case, grid_limit):
    """swap_leading_axes gives src.transpose(1, 0, 2) bit for bit: vectors of the widest width that
    both pointers and inner's bytes allow, else element by element; with the grid's y, z (and x)
    limited to 1 block the grid-stride loops cover every row."""
    if grid_limit:
        monkeypatch.setattr(backend, "MAX_GRID_YZ", grid_limit)
        monkeypatch.setattr(backend, "MAX_BLOCKS", grid_limit)
    a, b, inner, shift = case
    isz = np.dtype(dtype).itemsize
    src = host_kernels.aligned_copy(_random((a, b, inner), dtype, 6), shift)
    dst = host_kernels.aligned_copy(np.full((b, a, inner), 0x7F, dtype), shift)
    gpu_im2col.swap_leading_axes(src.ctypes.data, a, b, inner, dst.ctypes.data, dtype)
    np.testing.assert_array_equal(_bits(dst), _bits(np.ascontiguousarray(src.transpose(1, 0, 2))))
    (name, args, grid, block), = host_device
    vec = [w for w in gpu_im2col.WIDTHS
           if w >= isz and src.ctypes.data % w == dst.ctypes.data % w == 0 and inner * isz % w == 0]
    assert (name, args[4]) == ((f"swap_leading_axes_{vec[0]}b", 1) if vec else ("swap_leading_axes_16b", 0))
    if grid_limit:
        assert grid == (1, 1, 1)
    else:
        assert grid[2] == b and np.prod(block) == backend.CUDA_NUM_THREADS


def test_plane_copies_refuse_int32_overflow(host_device):
    with pytest.raises(gpu_im2col.CudaError, match="int32"):
        gpu_im2col.copy_planes(64, 1 << 16, 1 << 16, 1 << 16, 64, 1 << 16, np.float16)
    with pytest.raises(gpu_im2col.CudaError, match="int32"):
        gpu_im2col.swap_leading_axes(64, 1 << 11, 1 << 11, 1 << 11, 64, np.float16)
    with pytest.raises(gpu_im2col.CudaError, match="int32"):
        gpu_im2col.subsample_planes(64, 1 << 16, (1 << 9, 1 << 9), (1, 1), 64, np.float16)
    assert host_device == []
