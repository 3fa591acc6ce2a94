"""Interp: output sizes (zoom, shrink, both, height/width, cropping), aligned-corner bilinear values
against a naive reference, the adjoint backward, gradients, the GPU sampling tables, CPU/GPU
agreement (tables, the backward's tiles: default, one-row bands, narrow column tiles and chunks;
capture in a CUDA graph), errors. The GPU kernels' index math is also run on the host:
test_interp_kernels_on_host.py."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer

X = np.random.default_rng(7).standard_normal((2, 3, 5, 4))


def naive(x, ho, wo, pad_beg=0, pad_end=0):
    """Pixel by pixel: the fork's single-precision ratio, then the bilinear blend in float64."""
    o = -pad_beg
    hi, wi = x.shape[2] + pad_beg + pad_end, x.shape[3] + pad_beg + pad_end
    xc = x[:, :, o:o + hi, o:o + wi]
    y = np.zeros(x.shape[:2] + (ho, wo))
    rh = np.float32(hi - 1) / np.float32(ho - 1) if ho > 1 else np.float32(0)
    rw = np.float32(wi - 1) / np.float32(wo - 1) if wo > 1 else np.float32(0)
    for h in range(ho):
        for w in range(wo):
            sh, sw = float(np.float32(rh * np.float32(h))), float(np.float32(rw * np.float32(w)))
            a, b = int(sh), int(sw)
            a2, b2 = min(a + 1, hi - 1), min(b + 1, wi - 1)
            fh, fw = sh - a, sw - b
            y[:, :, h, w] = ((1 - fh) * ((1 - fw) * xc[:, :, a, b] + fw * xc[:, :, a, b2])
                             + fh * ((1 - fw) * xc[:, :, a2, b] + fw * xc[:, :, a2, b2]))
    return y


@pytest.mark.parametrize("param,size,pads", [
    ("zoom_factor: 2", (9, 7), (0, 0)),
    ("zoom_factor: 3", (13, 10), (0, 0)),
    ("shrink_factor: 2", (3, 2), (0, 0)),
    ("shrink_factor: 2 zoom_factor: 3", (7, 4), (0, 0)),
    ("height: 8 width: 11", (8, 11), (0, 0)),
    ("height: 1 width: 1", (1, 1), (0, 0)),
    ("height: 5 width: 4", (5, 4), (0, 0)),  # same size: a copy
    ("zoom_factor: 2 pad_beg: -1 pad_end: -1", (5, 3), (-1, -1)),
])
def test_forward_backward(mode, param, size, pads):
    layer, bottom, top = run_layer(f'type: "Interp" interp_param {{ {param} }}', [X])
    assert top[0].shape == (2, 3) + size
    np.testing.assert_allclose(top[0].cpu_data(), naive(X, *size, *pads), rtol=1e-12, atol=1e-14)
    # Backward is the adjoint: <dy, A x> = <A^T dy, x> for the linear map A.
    dy = top[0].cpu_diff()
    assert np.isclose(np.vdot(dy, top[0].cpu_data()), np.vdot(bottom[0].cpu_diff(), X), rtol=1e-12)
    if pads != (0, 0):
        assert not bottom[0].cpu_diff()[:, :, 0].any() and not bottom[0].cpu_diff()[:, :, -1].any()


def test_exact_values():
    x = np.array([[[[0.0, 2.0], [4.0, 6.0]]]])
    _, _, top = run_layer('type: "Interp" interp_param { zoom_factor: 2 }', [x])
    np.testing.assert_allclose(top[0].cpu_data()[0, 0], [[0, 1, 2], [2, 3, 4], [4, 5, 6]])


def test_errors():
    with pytest.raises(caffe.NetError, match="needs zoom_factor"):
        run_layer('type: "Interp" interp_param { height: 3 }', [X])
    with pytest.raises(caffe.NetError, match="<= 0"):
        run_layer('type: "Interp" interp_param { zoom_factor: 2 pad_beg: 1 }', [X])
    with pytest.raises(caffe.NetError, match=r"\(N, C, H, W\)"):
        run_layer('type: "Interp" interp_param { zoom_factor: 2 }', [X[0]])
    with pytest.raises(caffe.NetError, match="shrink_factor must be >= 1"):
        run_layer('type: "Interp" interp_param { shrink_factor: 0 }', [X])


@pytest.mark.parametrize("param", ["zoom_factor: 2", "height: 3 width: 6", "shrink_factor: 2", "height: 7 width: 2",
                                   "zoom_factor: 2 pad_beg: -1 pad_end: -1", "height: 5 width: 4"])
def test_gradient(mode, param):
    """Float64 on both devices (``mode``): numeric against analytic gradients."""
    layer = make_layer(f'type: "Interp" interp_param {{ {param} }}')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([X[:1, :2]]), empty_blobs(1))


def test_gradient_from_one_pixel(mode):
    layer = make_layer('type: "Interp" interp_param { height: 3 width: 4 }')
    GradientChecker(1e-3, 1e-6).check(layer, blobs([X[:1, :2, :1, :1]]), empty_blobs(1))


@pytest.mark.parametrize("n_in", [1, 2, 3, 5, 6, 13, 65])
@pytest.mark.parametrize("n_out", [1, 2, 3, 4, 7, 33, 60, 513])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_axis_tables(n_in, n_out, dtype):
    """The GPU tables describe the CPU path's interpolation matrix: pairs are (lo, lo + step), the
    outputs with lo = a are starts[a]:starts[a + 1], and wp / wq are the matrix entries at lo and lo + 1."""
    from pycaffe_lite.layers.interp import axis_tables, interp_weights

    lo, step, lam = interp_weights(n_in, n_out, dtype)
    pairs, starts, lam_t, wp, wq = axis_tables(n_in, n_out, dtype)
    assert pairs.dtype == starts.dtype == np.int32 and wp.dtype == wq.dtype == lam_t.dtype == dtype
    np.testing.assert_array_equal(pairs, np.stack([lo, lo + step], 1))
    np.testing.assert_array_equal(lam_t, lam)
    assert starts.shape == (n_in + 1,) and starts[-1] == n_out and np.all(np.diff(starts) >= 0)
    for a in range(n_in):
        np.testing.assert_array_equal(np.flatnonzero(lo == a), np.arange(starts[a], starts[a + 1]))
    layer = make_layer('type: "Interp" interp_param { zoom_factor: 2 }', dtype)
    m = layer._matrix(n_in, n_out)
    rows = np.arange(n_out)
    np.testing.assert_array_equal(m[rows, lo], wp)
    np.testing.assert_array_equal(np.where(step == 1, m[rows, np.minimum(lo + 1, n_in - 1)], 0), wq)
    assert (np.count_nonzero(m, axis=1) <= 2).all()


GPU_CASES = ["zoom_factor: 8", "zoom_factor: 3", "height: 17 width: 5", "height: 60 width: 60",
             "height: 5 width: 300", "shrink_factor: 2", "shrink_factor: 3", "shrink_factor: 2 zoom_factor: 2",
             "height: 3 width: 2", "height: 2 width: 13", "height: 1 width: 1", "height: 1 width: 7",
             "zoom_factor: 2 pad_beg: -1 pad_end: -2", "shrink_factor: 2 pad_beg: -2 pad_end: -1",
             "height: 7 width: 9", "height: 4 width: 6 pad_beg: -1 pad_end: -1",
             "height: 11 width: 3 pad_beg: 0 pad_end: -3"]
XG = np.random.default_rng(11).standard_normal((2, 3, 7, 9))


@pytest.mark.gpu
@pytest.mark.parametrize("param", GPU_CASES)
def test_cpu_gpu_agree(param):
    assert_cpu_gpu_agree(f'type: "Interp" interp_param {{ {param} }}', [XG], rtol=1e-10, atol=1e-12)
    assert_cpu_gpu_agree(f'type: "Interp" interp_param {{ {param} }}', [XG], dtype=np.float32, rtol=1e-5,
                         atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("param", ["height: 4 width: 5", "zoom_factor: 3", "height: 1 width: 1"])
def test_cpu_gpu_agree_one_pixel(param):
    assert_cpu_gpu_agree(f'type: "Interp" interp_param {{ {param} }}', [XG[:, :, :1, :1]], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("itemsize", [4, 8])
@pytest.mark.parametrize("hi,wi,wo,planes", [(65, 65, 513, 210), (60, 60, 473, 1200), (6, 6, 60, 4096),
                                             (7, 9, 6500, 6), (1, 1, 9000, 2), (9, 7, 3, 6), (5, 4, 4, 1), (4, 5, 9, 0),
                                             (40, 3000, 1500, 1)])
def test_backward_tiling(interp_tiling, hi, wi, wo, planes, itemsize):
    """Tiles cover the window in balanced bands, a tile's part of T fits TILE_BYTES, blocks are whole
    warps and cover a chunk, and below MIN_TILES the default thins its bands."""
    module = interp_tiling
    copy = (hi, wi) == (hi, wo)
    starts = module.axis_tables(wi, wo, np.float64)[1]
    rows, bcols, cw, tiles, threads = module.backward_tiling(hi, wi, starts, planes, itemsize, copy)
    bands = -(-hi // rows)
    assert 1 <= rows <= hi and (bands - 1) * rows < hi and hi - (bands - 1) * rows >= rows - bands + 1
    assert 1 <= bcols <= wi and tiles == planes * bands * -(-wi // bcols)
    assert threads % 32 == 0 and 32 <= threads <= module.MAX_THREADS
    assert threads * module.COLS_PER_THREAD >= cw or threads == module.MAX_THREADS
    assert rows * module.stored_row(cw) * itemsize <= module.TILE_BYTES
    assert tiles >= min(module.MIN_TILES, planes * hi * -(-wi // bcols)) // 2


@pytest.mark.gpu
@pytest.mark.parametrize("param", GPU_CASES + ["height: 3 width: 6500", "height: 2 width: 3100 pad_beg: -1"])
def test_cpu_gpu_agree_backward_tilings(interp_tiling, param):
    """The backward with every tiling on every case and on very wide rows."""
    assert_cpu_gpu_agree(f'type: "Interp" interp_param {{ {param} }}', [XG], rtol=1e-10, atol=1e-12)
    assert_cpu_gpu_agree(f'type: "Interp" interp_param {{ {param} }}', [XG], dtype=np.float32, rtol=1e-5,
                         atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,param", [((2, 512, 6, 6), "height: 60 width: 60"), ((1, 3, 65, 65), "zoom_factor: 8"),
                                         ((1, 2, 60, 60), "height: 473 width: 473")])
def test_cpu_gpu_agree_benchmark_shapes(shape, param):
    """Shapes of benchmarks/bandwidth.py's Interp cases (PSPNet pool6, DeepLab fc8 x8, PSPNet conv6)."""
    x = np.random.default_rng(7).standard_normal(shape)
    assert_cpu_gpu_agree(f'type: "Interp" interp_param {{ {param} }}', [x], dtype=np.float32, rtol=1e-4,
                         atol=1e-4)


@pytest.mark.gpu
def test_gpu_backward_overwrites_and_is_deterministic():
    """The bottom diff is overwritten (garbage in, zeros outside the window out) and two backward
    passes agree bit for bit (a gather, no atomics)."""
    caffe.set_mode_gpu()
    try:
        layer = make_layer('type: "Interp" interp_param { zoom_factor: 8 pad_beg: -1 pad_end: -1 }', np.float32)
        bottom, top = blobs([XG], np.float32), empty_blobs(1, np.float32)
        layer.setup(bottom, top)
        layer.forward(bottom, top)
        top[0].mutable_cpu_diff()[...] = np.random.default_rng(2).standard_normal(top[0].shape)
        diffs = []
        for _ in range(2):
            bottom[0].mutable_cpu_diff()[...] = np.nan
            layer.backward(top, [True], bottom)
            diffs.append(bottom[0].cpu_diff().copy())
    finally:
        caffe.set_mode_cpu()
    np.testing.assert_array_equal(diffs[0], diffs[1])
    assert not diffs[0][:, :, 0].any() and not diffs[0][:, :, :, -1].any() and np.isfinite(diffs[0]).all()


@pytest.mark.gpu
def test_gpu_passes_replay_in_a_cuda_graph():
    """Forward and backward allocate and copy nothing once reshaped: captured, they replay exactly."""
    from pycaffe_lite.gpu import backend, cuda_graph

    caffe.set_mode_gpu()
    try:
        layer = make_layer('type: "Interp" interp_param { height: 19 width: 23 pad_end: -1 }', np.float32)
        bottom, top = blobs([XG], np.float32), empty_blobs(1, np.float32)
        layer.setup(bottom, top)
        layer.reshape(bottom, top)
        top[0].mutable_cpu_diff()[...] = np.random.default_rng(4).standard_normal(top[0].shape)
        layer.forward(bottom, top)
        layer.backward(top, [True], bottom)
        want = top[0].cpu_data().copy(), bottom[0].cpu_diff().copy()
        backend.memset_zero(top[0].mutable_gpu_data(), top[0].count * 4)
        backend.memset_zero(bottom[0].mutable_gpu_diff(), bottom[0].count * 4)
        recording = cuda_graph.Recording()
        with cuda_graph.capture(recording):
            layer.forward_gpu(bottom, top)
            layer.backward_gpu(top, [True], bottom)
        recording.graph.launch()
        backend.synchronize()
        got = top[0].cpu_data().copy(), bottom[0].cpu_diff().copy()
    finally:
        caffe.set_mode_cpu()
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
