"""What of the fp16/bf16 tensor-core work can be checked without a GPU:

- the fragment addressing of ``tensorcore16.cu``'s warp step, emulated: ldmatrix.x4 (and .trans)
  handing lanes 8x8 matrices of 16-bit values from the addresses the kernel computes, and the
  matrices mma.sync m16n8k16 then multiplies (its A, B register layouts from the PTX ISA), must be
  exactly the warp's A and B sub-tiles in shared memory, for both B layouts and every tile's warp
  shape; every ldmatrix row address is 16-byte aligned;
- the block's staging covers each (row, k) / (k, col) of a slice exactly once;
- ``supports()`` of every engine on half problems (fake device: no GPU), the TF32 engine refusing;
- blas's cudaDataType_t codes (against the CUDA headers where they are installed);
- ``tensorcore16.cu`` and ``blas_reduce.cu`` compile for all four storage types (slow, nvcc).

The addressing below is the kernel's, written again in Python (``t16_warp_step``, ``t16_core``):
a change there must be made here too, which is the point.
"""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite.conv import registry
from pycaffe_lite.conv import tensorcore16 as tc16
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.gpu import backend, blas

ROOT = Path(__file__).resolve().parents[2]
BK = 32
# tile -> (WM, WN) of each entry point kind, as in the T16_* lines of tensorcore16.cu
WARPS = {"128x128": (32, 64), "64x128": (32, 32), "64x64": (32, 16)}


def _ldmatrix_x4(smem: np.ndarray, addrs: list[int], trans: bool) -> np.ndarray:
    """regs[lane, i, 2]: what ldmatrix.sync.aligned.m8n8.x4(.trans).b16 gives each lane: matrix i's
    rows are the 8 elements at the addresses of lanes 8i..8i+7; without .trans lane l receives row
    l/4, columns 2(l%4) and 2(l%4)+1; with .trans rows 2(l%4), 2(l%4)+1 of column l/4."""
    regs = np.zeros((32, 4, 2), smem.dtype)
    for i in range(4):
        mat = np.stack([smem[addrs[8 * i + r]: addrs[8 * i + r] + 8] for r in range(8)])
        for lane in range(32):
            g, t = lane // 4, lane % 4
            regs[lane, i] = mat[2 * t: 2 * t + 2, g] if trans else mat[g, 2 * t: 2 * t + 2]
    return regs


def _mma_a(regs: np.ndarray) -> np.ndarray:
    """The 16x16 A that m16n8k16 (.row) reads from lanes' registers a0..a3 (two values each):
    a0 = A[g][2t..], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]."""
    a = np.zeros((16, 16), regs.dtype)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for r, (row, col) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            a[row, col: col + 2] = regs[lane, r]
    return a


def _mma_b(b0: np.ndarray, b1: np.ndarray) -> np.ndarray:
    """The 16x8 B (k x n, .col) from b0 = B[2t..][g], b1 = B[2t+8..][g] of each lane."""
    b = np.zeros((16, 8), b0.dtype)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        b[2 * t: 2 * t + 2, g] = b0[lane]
        b[2 * t + 8: 2 * t + 10, g] = b1[lane]
    return b


def _check_aligned(addrs: list[int]) -> None:
    assert all(a * 2 % 16 == 0 for a in addrs), "ldmatrix rows must be 16-byte aligned"


@pytest.mark.parametrize("tile", list(WARPS))
@pytest.mark.parametrize("b_kfast", [False, True])
def test_warp_step_fragments_are_the_warp_subtiles(tile, b_kfast):
    bm, bn = map(int, tile.split("x"))
    wm_size, wn_size = WARPS[tile]
    lda = BK + 8
    ldb = BK + 8 if b_kfast else bn + 8
    As = np.arange(bm * lda, dtype=np.int64)  # distinct values: a wrong address shows
    Bs = np.arange((bn if b_kfast else BK) * ldb, dtype=np.int64) + 10**6
    for warp in range(8):
        wm, wn = warp // (bn // wn_size), warp % (bn // wn_size)
        wa = wm * wm_size * lda
        wb = wn * wn_size * ldb if b_kfast else wn * wn_size
        for kk in range(0, BK, 16):
            a_base, b_base = wa + kk, (wb + kk) if b_kfast else (wb + kk * ldb)
            for i in range(wm_size // 16):
                addrs = [a_base + (i * 16 + lane % 16) * lda + 8 * (lane // 16) for lane in range(32)]
                _check_aligned(addrs)
                got = _mma_a(_ldmatrix_x4(As, addrs, False))
                rows = wm * wm_size + i * 16 + np.arange(16)
                want = As[(rows[:, None] * lda + kk + np.arange(16)[None, :])]
                assert np.array_equal(got, want), (tile, warp, kk, i)
            for j in range(0, wn_size // 8, 2):
                if b_kfast:
                    addrs = [b_base + (j * 8 + lane % 8 + 8 * (lane // 16)) * ldb + 8 * (lane // 8 % 2)
                             for lane in range(32)]
                else:
                    addrs = [b_base + (lane % 8 + 8 * (lane // 8 % 2)) * ldb + j * 8 + 8 * (lane // 16)
                             for lane in range(32)]
                _check_aligned(addrs)
                regs = _ldmatrix_x4(Bs, addrs, trans=not b_kfast)
                for jj, (r0, r1) in ((j, (0, 1)), (j + 1, (2, 3))):
                    got = _mma_b(regs[:, r0], regs[:, r1])
                    cols = wn * wn_size + jj * 8 + np.arange(8)
                    ks = kk + np.arange(16)
                    want = Bs[cols[None, :] * ldb + ks[:, None]] if b_kfast else Bs[ks[:, None] * ldb + cols[None, :]]
                    assert np.array_equal(got, want), (tile, warp, kk, jj)


@pytest.mark.parametrize("tile", list(WARPS))
@pytest.mark.parametrize("b_kfast", [False, True])
def test_block_staging_covers_each_slice_once(tile, b_kfast):
    bm, bn = map(int, tile.split("x"))
    a_per, b_per = bm * BK // 256, bn * BK // 256
    a = [(tid // BK + e * (256 // BK), tid % BK) for tid in range(256) for e in range(a_per)]
    b = [((tid // BK + e * (256 // BK)) if b_kfast else tid % bn, tid % BK if b_kfast else tid // bn + e * (256 // bn))
         for tid in range(256) for e in range(b_per)]
    assert sorted(a) == [(r, k) for r in range(bm) for k in range(BK)]
    assert sorted(b) == [(c, k) for c in range(bn) for k in range(BK)]


@pytest.mark.parametrize("tile", list(WARPS))
def test_sliced_staging_covers_each_slice_once(tile):
    """t16s_core: A by 16-byte copies (row t/4 + 64e, k 8*(t%4)..+8), B one column per thread."""
    bm, bn = map(int, tile.split("x"))
    a = [(t // 4 + 64 * e, 8 * (t % 4) + j) for t in range(256) for e in range(bm // 64) for j in range(8)]
    b = [(t % bn, t // bn + (256 // bn) * e) for t in range(256) for e in range(BK * bn // 256)]
    assert sorted(a) == [(r, k) for r in range(bm) for k in range(BK)]
    assert sorted(b) == [(c, k) for c in range(bn) for k in range(BK)]
    assert (BK + 8) * 2 % 16 == 0 and (bn + 8) * 2 % 16 == 0  # 16-byte aligned rows for cp.async and ldmatrix


class _SlicePos:
    """T16SlicePos: the next slice's first channel and filter tap (r, s), stepped in slice order."""

    def __init__(self) -> None:
        self.c0 = self.r = self.s = 0

    def next(self, channels: int, kw: int) -> None:
        self.c0 += BK
        if self.c0 == channels:
            self.c0 = 0
            self.s += 1
            if self.s == kw:
                self.s, self.r = 0, self.r + 1


def _sliced_forward(prob: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The channel-sliced forward's arithmetic (t16_permute_forward, T16FwdSliced's A rows and B
    columns per slice, summed slice by slice) on the host, for every group and column at once."""
    n, c, h, wd = x.shape
    ho, wo = prob.out_hw
    taps, cg, mg = prob.khkw, prob.cg, prob.mg
    perm = np.empty(prob.num_output * taps * cg)
    for i in range(perm.size):  # t16_permute_forward's index arithmetic
        m, r = divmod(i, taps * cg)
        tap, ch = divmod(r, cg)
        perm[i] = w.ravel()[(m * cg + ch) * taps + tap]
    kg = cg * taps
    cols = np.arange(n * ho * wo)
    img, p = cols // (ho * wo), cols % (ho * wo)
    iy0, ix0 = (p // wo) * prob.stride[0] - prob.pad[0], (p % wo) * prob.stride[1] - prob.pad[1]
    y = np.zeros((n, prob.num_output, ho * wo))
    for g in range(prob.group):
        a_all = perm[g * mg * kg:(g + 1) * mg * kg].reshape(mg, kg)
        xg = x[:, g * cg:(g + 1) * cg].reshape(n, cg * h * wd)
        acc = np.zeros((mg, cols.size))
        at = _SlicePos()
        for sl in range(taps * cg // BK):
            iy, ix = iy0 + at.r, ix0 + at.s
            ok = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < wd)
            base = at.c0 * h * wd + np.where(ok, iy * wd + ix, 0)
            b = np.stack([np.where(ok, xg[img, base + k * h * wd], 0.0) for k in range(BK)])
            acc += a_all[:, sl * BK:(sl + 1) * BK] @ b
            at.next(cg, prob.kernel[1])
        y[:, g * mg:(g + 1) * mg] = acc.reshape(mg, n, ho * wo).transpose(1, 0, 2)
    return y.reshape(n, prob.num_output, ho, wo)


def _sliced_backward_data(prob: ConvProblem, w: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """The channel-sliced data gradient's arithmetic (t16_permute_backward_data, T16BwdDataSliced)."""
    n, _, ho, wo = dy.shape
    h, wd = prob.height, prob.width
    taps, cg, mg = prob.khkw, prob.cg, prob.mg
    perm = np.empty(prob.num_output * taps * cg)
    for i in range(perm.size):
        per = cg * taps * mg
        g, r = divmod(i, per)
        ch, r2 = divmod(r, taps * mg)
        tap, m = divmod(r2, mg)
        perm[i] = w.ravel()[((g * mg + m) * cg + ch) * taps + tap]
    cols = np.arange(n * h * wd)
    img, q = cols // (h * wd), cols % (h * wd)
    ty, tx = q // wd + prob.pad[0], q % wd + prob.pad[1]
    dx = np.zeros((n, prob.channels, h * wd))
    for g in range(prob.group):
        a_all = perm[g * cg * taps * mg:(g + 1) * cg * taps * mg].reshape(cg, taps * mg)
        dyg = dy[:, g * mg:(g + 1) * mg].reshape(n, mg * ho * wo)
        acc = np.zeros((cg, cols.size))
        at = _SlicePos()
        for sl in range(taps * mg // BK):
            mb, oy, ox = at.c0, ty - at.r, tx - at.s
            at.next(mg, prob.kernel[1])
            ok = (oy >= 0) & (ox >= 0) & (oy % prob.stride[0] == 0) & (ox % prob.stride[1] == 0)
            oy, ox = oy // prob.stride[0], ox // prob.stride[1]
            ok &= (oy < ho) & (ox < wo)
            base = mb * ho * wo + np.where(ok, oy * wo + ox, 0)
            b = np.stack([np.where(ok, dyg[img, base + k * ho * wo], 0.0) for k in range(BK)])
            acc += a_all[:, sl * BK:(sl + 1) * BK] @ b
        dx[:, g * cg:(g + 1) * cg] = acc.reshape(cg, n, h * wd).transpose(1, 0, 2)
    return dx.reshape(n, prob.channels, h, wd)


SLICED = [  # (num, C, H, W, M, group, kernel, pad, stride): sliced forward and/or data gradient
    (2, 64, 7, 6, 32, 1, (3, 3), (1, 1), (1, 1)),
    (2, 32, 9, 8, 64, 2, (3, 2), (1, 0), (2, 1)),
    (1, 32, 5, 5, 32, 1, (1, 1), (0, 0), (2, 2)),
]


@pytest.mark.parametrize("shape", SLICED, ids=str)
def test_sliced_kernels_arithmetic_is_the_convolution(shape):
    from pycaffe_lite.conv import cpu as cpu_conv

    n, c, h, w, m, g, k, pad, stride = shape
    prob = ConvProblem(n, c, h, w, m, g, k, pad, stride, (1, 1), "<f2")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, w))
    wt = rng.standard_normal((m, c // g) + k)
    dy = rng.standard_normal((n, m) + prob.out_hw)
    y = np.empty(dy.shape)
    cpu_conv.forward(x, wt, None, k, pad, stride, (1, 1), g, y)
    dx = np.empty(x.shape)
    cpu_conv.backward(x, wt, dy, k, pad, stride, (1, 1), g, dx=dx)
    if tc16.sliced(prob, "forward"):
        np.testing.assert_allclose(_sliced_forward(prob, x, wt), y, rtol=1e-12, atol=1e-12)
    if tc16.sliced(prob, "backward_data"):
        np.testing.assert_allclose(_sliced_backward_data(prob, wt, dy), dx, rtol=1e-12, atol=1e-12)
    assert tc16.sliced(prob, "forward") or tc16.sliced(prob, "backward_data")


def _sliced_weight_gradient(prob: ConvProblem, x: np.ndarray, dy: np.ndarray, tile: str, chunk: int) -> np.ndarray:
    """t16s_backward_weight's arithmetic, thread by thread (T16BwdWeightSliced's init, load with its
    pixel stepping, the core's staging, store), split ``chunk`` pixels a block, then the fp32 sum of
    the splits (t16_reduce_weight)."""
    bm, bn = map(int, tile.split("x"))
    b_cols_per = bn // 8
    n_img, _, h, wd = x.shape
    ho, wo = prob.out_hw
    pl, cg, mg, kh_kw, kw = ho * wo, prob.cg, prob.mg, prob.khkw, prob.kernel[1]
    kg, total = cg * kh_kw, n_img * ho * wo
    splits = -(-total // chunk)
    parts = np.zeros((prob.group, splits, mg, kg))
    for g in range(prob.group):
        xg, dyg = x[:, g * cg:(g + 1) * cg].reshape(n_img, -1), dy[:, g * mg:(g + 1) * mg].reshape(n_img, -1)
        for sp in range(splits):
            k_begin, k_end = sp * chunk, min(sp * chunk + chunk, total)
            for m0 in range(0, mg, bm):
                for n0 in range(0, kg, bn):
                    As, Bs = np.zeros((bm, BK)), np.zeros((bn, BK))
                    acc = np.zeros((bm, bn))
                    state = []
                    for t in range(256):  # init
                        m, col = m0 + t // 32, n0 + b_cols_per * (t // 32)
                        a_rows = (mg - m + 7) // 8 if m < mg else 0
                        b_cols = kg - col if col < kg else 0
                        tap = col // cg if col < kg else 0
                        i = k_begin + t % 32
                        n, pp = divmod(i, pl)
                        state.append([m if m < mg else 0, a_rows, (col - tap * cg) if col < kg else 0, b_cols,
                                      tap // kw, tap % kw, i, n, pp // wo, pp % wo])
                    for _ in range(-(-(k_end - k_begin) // BK)):
                        for t, st in enumerate(state):  # load, then the core's stores to shared memory
                            m, a_rows, c, b_cols, r, s_, i, n, oy, ox = st
                            k = t % 32
                            inside = i < k_end
                            for e in range(bm // 8):
                                ok = inside and e < a_rows
                                As[t // 32 + 8 * e, k] = dyg[n, (m + 8 * e) * pl + oy * wo + ox] if ok else 0.0
                            iy = oy * prob.stride[0] - prob.pad[0] + r
                            ix = ox * prob.stride[1] - prob.pad[1] + s_
                            ok = inside and 0 <= iy < h and 0 <= ix < wd
                            for e in range(b_cols_per):
                                v = xg[n, (c + e) * h * wd + iy * wd + ix] if ok and e < b_cols else 0.0
                                Bs[b_cols_per * (t // 32) + e, k] = v
                            i, ox = i + BK, ox + BK
                            while ox >= wo:
                                ox -= wo
                                oy += 1
                                if oy == ho:
                                    oy, n = 0, n + 1
                            st[6:] = [i, n, oy, ox]
                        acc += As @ Bs.T
                    for mm in range(bm):  # store
                        for cc in range(bn):
                            m, col = m0 + mm, n0 + cc
                            if m < mg and col < kg:
                                tap, c = divmod(col, cg)
                                parts[g, sp].ravel()[m * kg + c * kh_kw + tap] = acc[mm, cc]
    return parts.sum(axis=1).reshape((prob.num_output, cg) + prob.kernel)


@pytest.mark.parametrize(("shape", "tile", "chunk"), [
    ((2, 16, 5, 6, 8, 1, (3, 3), (1, 1), (1, 1)), "64x64", 32),
    ((2, 32, 7, 5, 12, 2, (2, 3), (0, 1), (2, 1)), "128x128", 64),
], ids=str)
def test_sliced_weight_gradient_arithmetic_is_the_convolution(shape, tile, chunk):
    from pycaffe_lite.conv import cpu as cpu_conv

    n, c, h, w, m, g, k, pad, stride = shape
    prob = ConvProblem(n, c, h, w, m, g, k, pad, stride, (1, 1), "<f2")
    assert tc16.sliced(prob, "backward_weight", tile)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, c, h, w))
    dy = rng.standard_normal((n, m) + prob.out_hw)
    dw = np.zeros((m, c // g) + k)
    cpu_conv.backward(x, np.zeros(dw.shape), dy, k, pad, stride, (1, 1), g, dweight=dw)
    np.testing.assert_allclose(_sliced_weight_gradient(prob, x, dy, tile, chunk), dw, rtol=1e-12, atol=1e-12)


def test_tile_table_matches_the_kernel_file():
    """WARPS above and tc16.TILES are the entry points tensorcore16.cu stamps out."""
    text = (ROOT / "pycaffe_lite" / "conv" / "tensorcore16.cu").read_text()
    for kind in ("_FORWARD", "_BACKWARD_DATA", "_BACKWARD_WEIGHT", "S_FORWARD", "S_BACKWARD_DATA",
                 "S_BACKWARD_WEIGHT"):
        found = {m[0]: (int(m[1]), int(m[2])) for m in
                 re.findall(rf"^T16{kind}\(t16s?_\w+_(\d+x\d+), \d+, \d+, (\d+), (\d+), \d\)", text, re.M)}
        assert found == WARPS, kind
    assert set(tc16.TILES) == set(WARPS)


# -- supports() ---------------------------------------------------------------------------------
class _FakeState:
    class device:  # noqa: N801 (pycuda's attribute name)
        cc = (9, 0)

        @classmethod
        def compute_capability(cls):
            return cls.cc


@pytest.fixture
def fake_device(monkeypatch):
    monkeypatch.setattr(backend, "state", lambda: _FakeState)
    monkeypatch.setattr(blas, "tf32_allowed", lambda: True)
    yield _FakeState.device
    _FakeState.device.cc = (9, 0)


HALF_PROBLEMS = [ConvProblem(2, 16, 9, 9, 24, 1, (3, 3), (1, 1), (1, 1), (1, 1), code) for code in ("<f2", "<u2")]


@pytest.mark.parametrize("prob", HALF_PROBLEMS, ids=lambda p: p.dtype)
def test_half_problems_engines(fake_device, prob):
    registry.load_engines()
    ok = {n for n, e in registry.ENGINES.items() if e.supports(prob)}
    # the CUDA-core engines size their tiles and scratch by item size; the TF32 engine stays float32-only
    assert {"gemm", "winograd", "direct"} <= ok
    assert any(n.startswith("implicit") for n in ok)
    assert {f"tensorcore16-{t}" for t in tc16.TILES} <= ok
    assert not any(n.startswith("tensorcore-") for n in ok)
    fake_device.cc = (7, 5)  # no bf16/f16 m16n8k16 before sm_80
    assert not any(registry.ENGINES[f"tensorcore16-{t}"].supports(prob) for t in tc16.TILES)


def test_tensorcore16_refuses_float_types_without_a_device(monkeypatch):
    monkeypatch.setattr(backend, "state", lambda: pytest.fail("supports() touched the device"))
    for code in ("<f4", "<f8"):
        prob = ConvProblem(2, 16, 9, 9, 24, 1, (3, 3), (1, 1), (1, 1), (1, 1), code)
        assert not tc16.supports(prob)


def test_tensorcore16_weight_scratch_is_fp32(monkeypatch):
    """The weight pass's partial sums take 4 bytes an element whatever the storage type; the gathering
    kernels carry a bias column, the sliced ones (C/G a multiple of BN/8) do not."""
    monkeypatch.setattr(tc16, "weight_splits", lambda p, tile, has_bias: (3, 64))
    engine = tc16.TensorCore16Engine("64x64")
    sliced_prob = HALF_PROBLEMS[0]  # C/G = 16, a multiple of 64/8
    gather_prob = ConvProblem(2, 12, 9, 9, 24, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f2")
    assert tc16.sliced(sliced_prob, "backward_weight", "64x64")
    assert not tc16.sliced(gather_prob, "backward_weight", "64x64")
    assert engine.scratch(sliced_prob, "backward_weight", True) == (3 * 24 * 16 * 9 * 4,)
    assert engine.scratch(gather_prob, "backward_weight", True) == (3 * 24 * (12 * 9 + 1) * 4,)
    assert engine.scratch(sliced_prob, "forward", True) == () and engine.scratch(sliced_prob, "backward_data", False) == ()


# -- blas ---------------------------------------------------------------------------------------
def test_blas_half_type_codes():
    assert blas.half_type(np.float16) == blas.CUDA_R_16F == 2
    assert blas.half_type(np.uint16) == blas.CUDA_R_16BF == 14
    assert blas.half_type(np.float32) is None and blas.half_type(np.float64) is None
    assert (blas.CUDA_R_32F, blas.CUBLAS_COMPUTE_32F, blas.CUBLAS_GEMM_DEFAULT) == (0, 68, -1)


@pytest.mark.parametrize(("name", "value"), [("CUDA_R_16F", 2), ("CUDA_R_16BF", 14), ("CUDA_R_32F", 0)])
def test_blas_type_codes_match_the_cuda_headers(name, value):
    headers = sorted(glob.glob("/usr/local/cuda*/include/library_types.h"))
    if not headers:
        pytest.skip("no CUDA headers installed")
    text = Path(headers[0]).read_text()
    assert re.search(rf"\b{name}\s*=\s*{value}\b", text)
    assert getattr(blas, name) == value


# -- the kernels compile ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_new_kernel_files_compile_for_every_type():
    paths = [str(ROOT / "pycaffe_lite" / "conv" / "tensorcore16.cu"), str(ROOT / "pycaffe_lite" / "gpu" / "blas_reduce.cu")]
    cmd = [sys.executable, str(ROOT / "tools" / "check_kernels.py"), "--paths", *paths]
    for dt in ("float", "double", "half", "bfloat16"):
        cmd += ["--dtype", dt]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "8 of 8 compilations succeeded" in r.stdout
