"""pycaffe_lite.gpu.permute's host plan, without a GPU: axis collapsing, the magic-number divisions,
tile choice and shared-memory pitch, which kernel each shape gets, and the launches' arguments
(run through a numpy reading of permute.cu's two kernels over random shapes and orders). The .cu
itself runs on the host in tests/layers/test_permute_kernels_on_host.py (slow)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pycaffe_lite.gpu import permute
from pycaffe_lite.gpu.permute import Axis


def test_collapse_merges_neighbours_and_drops_size_one():
    # NCHW -> NHWC: H and W stay neighbours
    assert permute.collapse((2, 3, 4, 5), (0, 2, 3, 1)) == (Axis(2, 60, 60), Axis(20, 1, 3), Axis(3, 20, 1))
    assert permute.collapse((2, 3, 4), (0, 1, 2)) == (Axis(24, 1, 1),)  # identity: one axis
    assert permute.collapse((2, 1, 3), (0, 2, 1)) == (Axis(6, 1, 1),)  # moving a size-1 axis: a copy
    assert permute.collapse((1, 1), (1, 0)) == ()
    assert permute.collapse((4, 1, 5, 6), (2, 1, 3, 0)) == (Axis(30, 1, 4), Axis(4, 30, 1))
    # ShuffleChannel's (N, g, k, S) -> (N, k, g, S): nothing merges, S is the contiguous run
    assert permute.collapse((2, 3, 4, 5), (0, 2, 1, 3)) == (
        Axis(2, 60, 60), Axis(4, 5, 15), Axis(3, 20, 5), Axis(5, 1, 1))


@pytest.mark.parametrize("order", [(0, 0, 1), (0, 1), (0, 1, 3)])
def test_bad_orders(order):
    with pytest.raises(ValueError, match="not a permutation"):
        permute.plan((2, 3, 4), order)


def _fast_div(n: np.ndarray, d: int) -> np.ndarray:
    m, s = permute.magic(d)
    n = n.astype(np.uint64)
    hi = (n * np.uint64(m)) >> np.uint64(32)
    return ((hi + n) & np.uint64(0xFFFFFFFF)) >> np.uint64(s)


@pytest.mark.parametrize("d", [1, 2, 3, 5, 7, 16, 19, 84, 361, 1444, 12345, 65537, 2**20 + 1, 2**30, 2**31 - 1])
def test_magic_division_is_exact_below_2_31(d):
    rng = np.random.default_rng(d)
    n = np.concatenate([np.arange(0, 5000), rng.integers(0, 2**31, 20000), [2**31 - 1, 2**31 - 2],
                        np.arange(1, 50) * d - 1, np.arange(1, 50) * d])
    n = n[(n >= 0) & (n < 2**31)]
    m, _ = permute.magic(d)
    assert 0 < m < 2**32
    np.testing.assert_array_equal(_fast_div(n, d), n // d)


def test_tile_choice():
    assert permute.choose_tile(16, 1444) == (4, 7)  # SSD mbox_loc forward: 16 x 128
    assert permute.choose_tile(1444, 16) == (7, 4)  # and its backward
    assert permute.choose_tile(84, 1444) == (5, 6)  # 32 x 64: 84 pads to 96 rather than 128
    assert permute.choose_tile(512, 64) == (5, 6)  # CTPN's Transpose: no padding
    for nt, ni in itertools.product([2, 3, 5, 16, 31, 32, 33, 84, 100, 361, 1444, 5000], repeat=2):
        lgt, lgi = permute.choose_tile(nt, ni)
        tt, ti = 1 << lgt, 1 << lgi
        assert tt * ti <= permute.TILE
        for n, side in ((nt, tt), (ni, ti)):
            p2 = 1 << (n - 1).bit_length()
            assert min(32, p2) <= side <= p2
        assert tt * permute.pitch(lgt, lgi) <= permute.SMEM


@pytest.mark.parametrize("lgt,lgi", [(5, 6), (6, 5), (4, 7), (7, 4), (3, 8), (1, 10), (10, 1), (5, 5)])
def test_pitch_spreads_column_reads_over_banks(lgt, lgi):
    """The write half reads the tile with t fastest: a warp's 32 reads hit 32 distinct banks
    (4-byte words) whenever a warp's t's and i's fit the tile."""
    tt, pitch = 1 << lgt, permute.pitch(lgt, lgi)
    lanes = np.arange(32)
    t, i = lanes & (tt - 1), lanes >> lgt
    if i.max() < (1 << lgi):
        assert len(set((t * pitch + i) % 32)) == 32


def _emulate(plan: permute.Plan, x: np.ndarray, vector: bool = False) -> np.ndarray:
    """permute.cu's kernels in numpy, driven by the plan's launch arguments."""
    src, dst = x.ravel(), np.full(x.size, np.nan)
    w = 4 if vector else 1
    for ln in plan.vector if vector else plan.launches:
        if ln.kernel.startswith("permute_gather"):
            n, tail = ln.head[0], ln.tail
            u = np.arange(n)
            off = np.zeros(n, np.int64)
            for k in range(4):
                size, m, s, stride = tail[4 * k:4 * k + 4]
                q = _fast_div(u, size).astype(np.int64)
                off += (u - q * size) * stride
                u = q
            off += u * tail[16]
            for j in range(w):
                dst[ln.dst_off + np.arange(n) * w + j] = src[ln.src_off + off * w + j]
        elif ln.kernel == "permute_quads":
            (n,), (nfast, nslow, t_fast, t_src, i_dst, b_src, b_dst) = ln.head, ln.tail
            assert -(-n // ln.block) == ln.grid and ln.block == permute.QUAD_THREADS
            u = np.arange(n)
            f, s = u % nfast, u // nfast % nslow
            b = u // (nfast * nslow)
            tq, iq = (f, s) if t_fast else (s, f)
            for c in range(4):  # src row 4 tq + c, columns 4 iq + k -> dst row 4 iq + k, column 4 tq + c
                for k in range(4):
                    dst[ln.dst_off + b * b_dst + (4 * iq + k) * i_dst + 4 * tq + c] = \
                        src[ln.src_off + b * b_src + (4 * tq + c) * t_src + 4 * iq + k]
        elif ln.kernel.startswith("permute_narrow"):
            (warps,), (ni, nt, stride, wpp, b_src, b_dst) = ln.head, ln.tail
            assert -(-warps // (ln.block // 32)) == ln.grid and ln.block <= 32 * 4  # PERMUTE_NARROW_WARPS
            for wp in range(warps):
                b, p0 = wp // wpp, wp % wpp * 32
                if ln.kernel.endswith("_t"):  # (p, t) -> dst run; src rows of stride `stride` (t_src)
                    p = np.arange(p0, min(p0 + 32, ni))[:, None]
                    t = np.arange(nt)[None, :]
                    dst[ln.dst_off + b * b_dst + p * nt + t] = src[ln.src_off + b * b_src + t * stride + p]
                else:  # src run (p, i); dst rows of stride `stride` (i_dst)
                    p = np.arange(p0, min(p0 + 32, nt))[:, None]
                    i = np.arange(ni)[None, :]
                    dst[ln.dst_off + b * b_dst + i * stride + p] = src[ln.src_off + b * b_src + p * ni + i]
        else:
            nt, ni, t_src, i_dst, lgt, lgi, _, tiles_i, tiles, *batch = ln.tail
            blocks = np.arange(ln.grid)
            b, tl = blocks // tiles, blocks % tiles
            t0, i0 = (tl // tiles_i) << lgt, (tl % tiles_i) << lgi
            so, do = np.zeros_like(b), np.zeros_like(b)
            for k in range(3):
                size, s, d = batch[3 * k:3 * k + 3]
                so, do, b = so + (b % size) * s, do + (b % size) * d, b // size
            so, do = so + b * batch[9], do + b * batch[10]
            tt, ii = np.meshgrid(np.arange(1 << lgt), np.arange(1 << lgi), indexing="ij")
            for blk in range(ln.grid):
                t, i = t0[blk] + tt, i0[blk] + ii
                ok = (t < nt) & (i < ni)
                dst[ln.dst_off + do[blk] + i[ok] * i_dst + t[ok]] = src[ln.src_off + so[blk] + t[ok] * t_src + i[ok]]
    return dst.reshape(plan.top_shape)


def _random_cases(count: int):
    rng = np.random.default_rng(7)
    for _ in range(count):
        ndim = int(rng.integers(1, 9))
        shape = tuple(int(s) for s in rng.choice([1, 2, 3, 4, 5, 8, 16, 33], size=ndim))
        while np.prod(shape) > 200_000:
            shape = shape[:-1]
        yield shape, tuple(int(o) for o in rng.permutation(len(shape)))


@pytest.mark.slow
def test_launch_arguments_move_every_element_once():
    kinds = set()
    extra = [((2, 3, 4, 24), (0, 2, 1, 3)), ((50, 3, 5), (0, 2, 1)), ((2, 16, 6, 7), (0, 2, 3, 1)),
             ((2, 16, 6, 8), (0, 2, 3, 1)), ((3, 8, 36), (0, 2, 1)), ((12, 40), (1, 0)), ((16, 16), (1, 0))]
    for shape, order in itertools.chain(_random_cases(300), extra):
        plan = permute.plan(shape, order)
        kinds.add(plan.kind)
        x = np.arange(plan.count, dtype=np.float64).reshape(shape)
        if plan.kind in ("copy", "empty"):
            assert not plan.launches
            continue
        np.testing.assert_array_equal(_emulate(plan, x), x.transpose(order), err_msg=f"{shape} {order}")
        if plan.vector:
            np.testing.assert_array_equal(_emulate(plan, x, True), x.transpose(order), err_msg=f"{shape} {order} v4")
        for ln in plan.launches:
            assert 1 <= ln.grid <= 2**31 - 1
            assert all(-(2**31) <= a < 2**32 for a in ln.head + ln.tail)
    assert {"copy", "runs", "gather", "tiles", "narrow"} <= kinds


@pytest.mark.parametrize("shape,order,kind,vector", [
    ((32, 16, 38, 38), (0, 2, 3, 1), "narrow", True),     # SSD conv4_3 mbox_loc: permute_quads
    ((32, 24, 19, 19), (0, 2, 3, 1), "narrow", False),    # fc7 mbox_loc: 361 positions, no quads
    ((32, 84, 38, 38), (0, 2, 3, 1), "tiles", False),
    ((32, 126, 19, 19), (0, 2, 3, 1), "tiles", False),
    ((8, 512, 38, 64), (3, 0, 2, 1), "tiles", False),     # CTPN's Transpose
    ((32, 3, 80, 784), (0, 2, 1, 3), "runs", True),       # ShuffleChannel g3 at 32x240x28x28
    ((32, 3, 160, 196), (0, 2, 1, 3), "runs", True),      # and at 32x480x14x14
    ((32, 3, 5, 7), (0, 1, 2, 3), "copy", False),
])
def test_benchmark_shapes_and_their_gradients(shape, order, kind, vector):
    for plan in (permute.plan(shape, order), permute.plan(shape, order).inverse()):
        assert plan.kind == kind and bool(plan.vector) == vector and len(plan.launches) <= 1
    assert permute.plan(shape, order).inverse().inverse() == permute.plan(shape, order)


def test_quads_take_the_narrow_planes_of_multiples_of_4():
    fwd = permute.plan((32, 16, 38, 38), (0, 2, 3, 1))
    (ln,) = fwd.vector
    assert ln.kernel == "permute_quads" and ln.head == (32 * 4 * 361,)
    assert ln.tail == (4, 361, 1, 1444, 16, 16 * 1444, 16 * 1444)  # t (16 channels) fastest
    (ln,) = fwd.inverse().vector
    assert ln.tail == (4, 361, 0, 16, 1444, 16 * 1444, 16 * 1444)  # i (16 channels) fastest
    assert not permute.plan((2, 16, 6, 7), (0, 2, 3, 1)).vector  # 42 positions
    assert not permute.plan((2, 18, 6, 8), (0, 2, 3, 1)).vector  # 18 channels
    assert permute.plan((12, 40), (1, 0)).vector  # 2 axes


def test_many_axes_loop_on_the_host():
    plan = permute.plan((40, 2, 3, 2, 2, 2, 2, 40), tuple(range(7, -1, -1)))  # 8 axes, none collapse
    assert plan.kind == "tiles" and len(plan.launches) == 2 * 2  # 4 of the 6 batch axes in the kernel
    assert permute.plan((2,) * 8, tuple(range(7, -1, -1))).kind == "gather"  # 2 x 2 planes
    plan = permute.plan((2,) * 7 + (4,), (6, 5, 4, 3, 2, 1, 0, 7))
    assert plan.kind == "runs" and len(plan.launches) == 8  # 5 axes in the kernel
