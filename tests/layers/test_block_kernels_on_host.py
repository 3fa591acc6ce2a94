"""The GPU paths of Normalize (per position), Upsample (max-unpooling) and Axpy without a GPU: their
kernels use blocks, shared memory, barriers, warp shuffles and atomics, so the ``.cu`` files are
compiled as host C++ on ``pycaffe_lite.testing.host_kernels.THREADED_SHIM``, which runs each
block's threads as OS threads (``__syncthreads`` a ``std::barrier``, ``__shfl_xor_sync`` an
exchange through a block buffer between two barriers, ``atomicMax`` a compare-and-swap), blocks
one after another, with the launch shape the layer asks for. Device pointers are the blobs' host arrays; the math_functions / cuBLAS calls the layers
make are numpy. forward_gpu / backward_gpu run as written and must agree with the CPU path (or,
for masks the CPU path rejects, with a reference loop). This checks index math, barriers and
shuffle participation; the real device run is the GPU tests' job. Marked slow (compilations)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pycaffe_lite.layers import pooling
from pycaffe_lite.layers.pooling_nd import pooled_size

from pycaffe_lite import common
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.testing import host_kernels as hk
from pycaffe_lite.testing.host_kernels import host_array as _array
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer, unpool_reference

pytestmark = [pytest.mark.skipif(hk.CXX is None, reason="no host C++ compiler"), pytest.mark.slow]


@pytest.fixture
def host_gpu(monkeypatch):
    """Route the device API to host memory and the kernels to the threaded shim."""
    launches = hk.threaded_device(monkeypatch)

    def sum_rows_into(rows, cols, x, y, dt, beta=1.0):
        out = _array(y, (cols,), dt)
        out[...] = _array(x, (rows, cols), dt).sum(axis=0) + beta * out

    def channel_sum(num, channels, spatial, x, out, dt, beta=1.0):
        o = _array(out, (channels,), dt)
        o[...] = _array(x, (num, channels, spatial), dt).sum(axis=(0, 2)) + beta * o

    def plane_gather(planes, S, T, y, idx, x, dt):
        k = _array(idx, (planes, S), dt).astype(np.int64)
        src = _array(y, (planes, T), dt)
        ok = (k >= 0) & (k < T)
        _array(x, (planes, S), dt)[...] = np.where(ok, src[np.arange(planes)[:, None], np.clip(k, 0, T - 1)], 0)

    monkeypatch.setattr(gm, "copy", lambda n, x, y, dt: _array(y, (n,), dt).__setitem__(..., _array(x, (n,), dt)))
    monkeypatch.setattr(gm, "sum_rows_into", sum_rows_into)
    monkeypatch.setattr(gm, "channel_sum", channel_sum)
    monkeypatch.setattr(gm, "plane_gather", plane_gather)
    yield launches


def _run(text, arrays, propagate, gpu, dtype, params_learn=True, in_place=False):
    common.set_random_seed(5)
    layer = make_layer(text, dtype)
    bottom = blobs(arrays, dtype)
    top = [bottom[-1]] if in_place else empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.param_propagate_down = [params_learn] * len(layer.blobs)
    for _ in range(2):  # twice: state carried between forwards (Upsample's flag) is exercised too
        layer.reshape(bottom, top)
        (layer.forward_gpu if gpu else layer.forward_cpu)(bottom, top)
    rng = np.random.default_rng(5)
    top[0].mutable_cpu_diff()[...] = rng.standard_normal(top[0].shape)
    for p in layer.blobs:
        p.mutable_cpu_diff()[...] = 0.25
    for b, p in zip(bottom, propagate):
        if p and not (in_place and b is top[0]):
            b.mutable_cpu_diff()[...] = 99.0  # must be overwritten
    (layer.backward_gpu if gpu else layer.backward_cpu)(top, propagate, bottom)
    out = [top[0].cpu_data().copy()]
    out += [b.cpu_diff().copy() for b, p in zip(bottom, propagate) if p]
    out += [p.cpu_diff().copy() for p in layer.blobs]
    return out, layer


def _agree(text, arrays, propagate, dtype, **kw):
    cpu, _ = _run(text, arrays, propagate, False, dtype, **kw)
    gpu, layer = _run(text, arrays, propagate, True, dtype, **kw)
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-5)
    assert len(cpu) == len(gpu)
    for i, (a, b) in enumerate(zip(cpu, gpu)):
        np.testing.assert_allclose(b, a, err_msg=f"array {i}", **tol)
    return layer


RNG = np.random.default_rng(23)
DTYPES = [np.float64, np.float32]
NORM = "type: 'Normalize' norm_param {{ across_spatial: false {} scale_filler {{ type: 'gaussian' std: 1 }} }}"


# Shapes: partial last tile (63 positions, tx 32), C < ty, tx 4 (3 positions), tx 1 with C > 256
# (two channel steps, the second partial), C a multiple of ty, C over three 4-step groups of the
# backward's scale pass (ty 8: 32 channels a group), the last partial.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (2, 37, 3, 1), (3, 300, 1, 1), (1, 16, 4, 10), (2, 70, 6, 6)])
@pytest.mark.parametrize("shared", ["channel_shared: false", "channel_shared: true"])
def test_normalize_per_position(host_gpu, dtype, shape, shared):
    x = RNG.standard_normal(shape)
    _agree(NORM.format(shared), [x], [True], dtype)
    names = {name for name, _, _ in host_gpu}
    assert {"normalize_pixels_forward", "normalize_pixels_backward"} <= names


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params_learn,propagate", [(False, True), (True, False)])
def test_normalize_per_position_one_gradient(host_gpu, dtype, params_learn, propagate):
    x = RNG.standard_normal((2, 11, 5, 7))
    _agree(NORM.format("channel_shared: false"), [x], [propagate], dtype, params_learn=params_learn)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shared", ["channel_shared: false", "channel_shared: true"])
def test_normalize_across_spatial(host_gpu, dtype, shared):
    x = RNG.standard_normal((2, 6, 3, 5))
    _agree(f"type: 'Normalize' norm_param {{ {shared} scale_filler {{ type: 'gaussian' std: 1 }} }}", [x], [True],
           dtype)


def _home_mask(shape, ho, wo, sh, sw, rng):
    """A valid mask: each source names a cell of its own sh x sw window (clipped to the plane)."""
    n, c, h, w = shape
    rows = np.minimum(sh * np.arange(h)[:, None] + rng.integers(0, sh, (n, c, h, w)), ho - 1)
    cols = np.minimum(sw * np.arange(w)[None, :] + rng.integers(0, sw, (n, c, h, w)), wo - 1)
    return (rows * wo + cols).astype(float)


UNPOOL = [  # (upsample_param, bottom (H, W), output (Ho, Wo), window (sh, sw))
    ("scale: 2", (4, 6), (8, 12), (2, 2)),
    ("scale: 2 pad_out_h: true pad_out_w: true", (4, 3), (7, 5), (2, 2)),
    ("upsample_h: 9 upsample_w: 7", (5, 4), (9, 7), (2, 2)),
    ("upsample_h: 11 upsample_w: 13", (4, 3), (11, 13), (3, 5)),  # unowned rows and columns
    ("upsample_h: 3 upsample_w: 5", (4, 5), (3, 5), (1, 1)),  # sources whose window is off the plane
    ("scale_h: 3 scale_w: 2", (3, 5), (9, 10), (3, 2)),
]


def _unpool_run(param, x, mask, dtype):
    text = f'type: "Upsample" upsample_param {{ {param} }}'
    gpu, _ = _run(text, [x, mask], [True, False], True, dtype)
    return gpu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(UNPOOL)))
def test_unpool_home_masks(host_gpu, dtype, case):
    param, hw, out, win = UNPOOL[case]
    rng = np.random.default_rng(case)
    x = rng.standard_normal((2, 3) + hw)
    mask = _home_mask(x.shape, *out, *win, rng)
    _agree(f'type: "Upsample" upsample_param {{ {param} }}', [x, mask], [True, False], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(UNPOOL)))
def test_unpool_stray_duplicate_and_invalid_masks(host_gpu, dtype, case):
    """Indices outside their window, several sources on one cell (the owner before and after a
    stray source), negative and too-large indices (skipped), fractional ones (truncated)."""
    param, hw, out, win = UNPOOL[case]
    rng = np.random.default_rng(100 + case)
    x = rng.standard_normal((2, 3) + hw)
    t = out[0] * out[1]
    for trial in range(3):
        mask = _home_mask(x.shape, *out, *win, rng)
        flat = mask.reshape(-1)
        pick = rng.random(flat.size)
        flat[pick < 0.3] = rng.integers(0, t, int((pick < 0.3).sum()))  # anywhere: strays, duplicates
        flat[(pick >= 0.3) & (pick < 0.35)] = -3.0
        flat[(pick >= 0.35) & (pick < 0.4)] = t + 2
        if trial == 1:  # every source of a plane on one cell; the owner of that cell comes in the middle
            mask[0, 1] = (win[0] * min(1, hw[0] - 1)) * out[1]
        if trial == 2:
            mask = mask + 0.5 * (mask >= 0)
        gpu = _unpool_run(param, x, mask, dtype)
        m = mask.astype(np.int64)  # truncation, as the kernels' int conversion
        np.testing.assert_array_equal(gpu[0], unpool_reference(x, m, *out).astype(dtype))
        dy = np.random.default_rng(5).standard_normal((2, 3) + out).reshape(6, -1)
        mm = m.reshape(6, -1)
        ok = (mm >= 0) & (mm < t)
        dx = np.where(ok, dy[np.arange(6)[:, None], np.clip(mm, 0, t - 1)], 0).reshape(x.shape)
        np.testing.assert_allclose(gpu[1], dx.astype(dtype), rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unpool_flag_resets(host_gpu, dtype):
    """After a forward with stray indices, one with home indices still writes zeros where the
    strays wrote (the flag is back at zero and pass 1 rewrites every cell)."""
    x = RNG.standard_normal((1, 2, 3, 4))
    home = _home_mask(x.shape, 6, 8, 2, 2, RNG)
    stray = home.copy()
    stray[0, 0, 0, 0] = 47.0
    text = 'type: "Upsample" upsample_param { scale: 2 }'
    layer = make_layer(text, dtype)
    bottom, top = blobs([x, stray], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    layer.forward_gpu(bottom, top)
    np.testing.assert_array_equal(top[0].cpu_data(), unpool_reference(x, stray, 6, 8).astype(dtype))
    assert layer.stray.cpu_data().view(np.int32).tolist() == [0, 0]  # the flag and the block count
    bottom[1].mutable_cpu_data()[...] = home
    layer.forward_gpu(bottom, top)
    np.testing.assert_array_equal(top[0].cpu_data(), unpool_reference(x, home, 6, 8).astype(dtype))


AXPY = "type: 'Axpy'"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spatial", [(1, 1), (3, 5), (14, 14), (33, 40)])  # a warp per row; 1320: a block
@pytest.mark.parametrize("propagate", [[True, True, True], [True, False, False], [False, True, True],
                                       [False, False, True], [True, True, False]])
def test_axpy(host_gpu, dtype, spatial, propagate):
    n, c = 3, 5
    a, x, y = RNG.standard_normal((n, c, 1, 1)), RNG.standard_normal((n, c) + spatial), RNG.standard_normal(
        (n, c) + spatial)
    _agree(AXPY, [a, x, y], propagate, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy_in_place(host_gpu, dtype):
    a, x, y = RNG.standard_normal((2, 9)), RNG.standard_normal((2, 9, 7, 7)), RNG.standard_normal((2, 9, 7, 7))
    _agree(AXPY, [a, x, y], [True, True, True], dtype, in_place=True)


POOL = [((2, 3, 11, 10), "kernel_size: 3 stride: 2 pad: 1"), ((1, 2, 9, 9), "kernel_size: 3 stride: 2"),
        ((2, 2, 7, 8), "kernel_size: 2 stride: 2 pad: 1"), ((1, 2, 7, 6), "kernel_size: 3 stride: 1 pad: 1"),
        ((1, 2, 8, 7), "kernel_h: 3 kernel_w: 2 stride: 2 pad_h: 1 pad_w: 0"),
        # widths of multiples of 4: AVE's 4-wide kernels (ave_pool_backward_q_*)
        ((2, 3, 11, 12), "kernel_size: 3 stride: 2 pad: 1"), ((1, 2, 9, 8), "kernel_size: 3 stride: 2"),
        ((2, 2, 7, 8), "kernel_size: 2 stride: 2"), ((1, 2, 7, 8), "kernel_size: 3 stride: 1 pad: 1"),
        ((1, 2, 9, 12), "kernel_size: 3 stride: 2 pad: 2"), ((2, 1, 5, 4), "kernel_size: 3 stride: 2 pad: 1"),
        ((1, 2, 6, 8), "kernel_h: 2 kernel_w: 3 stride: 2 pad_h: 1 pad_w: 0")]
QUAD = {2, 5, 6, 7, 8, 9, 10, 11}  # the POOL cases AVE may run through ave_pool_backward_q_* (width % 4 == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", ["AVE", "MAX"])
@pytest.mark.parametrize("case", range(len(POOL)))
def test_pooling_blocked_backward_matches_gather_bit_for_bit(host_gpu, dtype, method, case):
    """pooling.cu's blocked backward kernels (compiled) give the gather kernel's bits and the CPU's values."""
    shape, body = POOL[case]
    x = np.random.default_rng(case).standard_normal(shape)
    text = f'type: "Pooling" pooling_param {{ pool: {method} {body} }}'
    out = []
    for blocked in (True, False):
        common.set_random_seed(5)
        layer = make_layer(text, dtype)
        layer.use_blocked_backward = blocked
        bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
        layer.setup(bottom, top)
        layer.forward_gpu(bottom, top)
        top[0].mutable_cpu_diff()[...] = np.random.default_rng(5).standard_normal(top[0].shape)
        bottom[0].mutable_cpu_diff()[...] = 12345.0
        layer.backward_gpu(top, [True], bottom)
        out.append(bottom[0].cpu_diff().copy())
        if blocked:  # numpy aligns to 16 bytes: float64 takes the 4-wide kernels when 32-byte aligned
            quad = method == "AVE" and case in QUAD and bottom[0].gpu_diff() % (4 * np.dtype(dtype).itemsize) == 0
    np.testing.assert_array_equal(out[0], out[1])
    cpu, _ = _run(text, [x], [True], False, dtype)
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(out[0], cpu[1], **tol)
    prefix = "ave_pool_backward_q_" if quad else f"{method.lower()}_pool_backward_s"
    assert any(name.startswith(prefix) for name, _, _ in host_gpu)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quad", pooling.QUAD_BACKWARD)
@pytest.mark.parametrize("hw,k,pad", [((11, 12), (3, 3), (1, 1)), ((9, 8), (3, 3), (0, 0)), ((7, 16), (2, 2), (0, 1)),
                                      ((8, 8), (2, 3), (1, 0)), ((5, 4), (3, 3), (2, 2)), ((2, 4), (1, 1), (0, 0))])
def test_pooling_quad_kernels_equal_the_gather(dtype, quad, hw, k, pad):
    """Each ave_pool_backward_q_* kernel called directly on aligned buffers gives
    ave_pool_backward's bits wherever its S, WD and NW cover the geometry."""
    S, WD, NW, R = quad
    (h, w), (kh, kw) = hw, k
    if -(-kh // S) > WD or -(-kw // S) > WD or NW < -(-(kw + 3) // S) or max(pad) >= max(k):
        pytest.skip("geometry outside the kernel's S / WD / NW")
    pooled = tuple(pooled_size(n, kk, p, S, True, any(pad)) for n, kk, p in zip(hw, k, pad))
    planes = 3
    lib, sigs = hk.threaded_library(pooling.KERNELS, dtype, ("-I", str(Path(backend.__file__).parent)))
    rng = np.random.default_rng(S * 100 + kh * 10 + kw)
    dy = hk.aligned_copy(rng.standard_normal((planes, *pooled)).astype(dtype))
    geometry = (h, w, *pooled, kh, kw, S, S, *pad)
    inv = float(dtype(1) / dtype(kh * kw))
    got, want = (hk.aligned_copy(np.full((planes, h, w), np.nan, dtype)) for _ in range(2))
    count = -(-planes // 4) * h * w
    hk.launch(lib, sigs["ave_pool_backward"], (count, planes, dy.ctypes.data, *geometry, want.ctypes.data),
              dtype, -(-count // 32), (32, 1, 1))
    blocks_h = -(-(h + pad[0]) // S)
    strips = -(-blocks_h // R)
    count = planes * strips * (w // 4)
    hk.launch(lib, sigs["ave_pool_backward_q_s{}_w{}_n{}_r{}".format(*quad)],
              (count, dy.ctypes.data, *geometry, strips, inv, got.ctypes.data), dtype, 2, (32, 1, 1))
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [10, 12])  # 12: the 4-wide kernel
def test_pooling_ave_blocked_quotients_at_any_magnitude(host_gpu, dtype, width):
    """AVE's blocked backward divides by the full window area with a reciprocal and a residual
    correction: still the gather's bits for diffs from subnormal to huge, infinities and NaN."""
    x = np.random.default_rng(3).standard_normal((2, 3, 11, width))
    text = 'type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }'
    rng = np.random.default_rng(4)
    info = np.finfo(dtype)
    exps = rng.uniform(np.log10(info.smallest_subnormal) + 1, np.log10(info.max) - 1, (2, 3, 6, width // 2 + 1))
    with np.errstate(over="ignore"):
        dy = (rng.standard_normal(exps.shape) * 10.0 ** exps).astype(dtype)
    dy.flat[:3] = [np.inf, -np.inf, np.nan]
    out = []
    for blocked in (True, False):
        layer = make_layer(text, dtype)
        layer.use_blocked_backward = blocked
        bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
        layer.setup(bottom, top)
        layer.forward_gpu(bottom, top)
        top[0].mutable_cpu_diff()[...] = dy
        layer.backward_gpu(top, [True], bottom)
        out.append(bottom[0].cpu_diff().copy())
    np.testing.assert_array_equal(out[0], out[1])
