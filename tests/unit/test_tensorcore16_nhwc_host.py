"""The NHWC-staged fp16/bf16 tensor-core engines (``tensorcore16-nhwc-*``) on the host, no GPU:

- ``t16n_conv`` emulated in numpy thread by thread and lane by lane from the kernel's own index
  arithmetic (the cp.async chunk each thread copies into the swizzled stage ring, the ldmatrix.x4
  row addresses each lane supplies, the PTX m16n8k16 fragment layouts, the shared-memory epilogue
  and the NCHW write-out) equals the float64 convolution: forward, and the data gradient through
  :func:`phases` (one stride-1 GEMM per stride phase) and the weight permutation; every ldmatrix phase reads 8 distinct bank
  groups; nothing outside the dynamic shared memory is touched;
- the Python side: supports / refusals, scratch sizes, shared memory, the tile table;
- the kernel file compiles for all four storage types (slow, nvcc).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite.conv import cpu as cpu_conv
from pycaffe_lite.conv import registry
from pycaffe_lite.conv import tensorcore16 as tc16
from pycaffe_lite.conv import tensorcore16_nhwc as tc16n
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.errors import CudaError

ROOT = Path(__file__).resolve().parents[2]
BK = 32
THREADS = 256


def _tile_table() -> dict[str, tuple[int, int, int, int, int]]:
    """tile -> (BM, BN, WM, WN, STAGES) from the T16N_CONV lines of the kernel file."""
    text = tc16n.KERNELS.read_text()
    rows = re.findall(r"^T16N_CONV\(t16n_conv_(\d+x\d+), (\d+), (\d+), (\d+), (\d+), (\d+), \d+\)", text, re.M)
    return {name: tuple(int(v) for v in vals) for name, *vals in rows}  # type: ignore[misc]


TABLE = _tile_table()


def _at(r, q):
    """t16n_at: element offset of 16-byte chunk q of stage-tile row r (XOR swizzle)."""
    return r * BK + ((q ^ ((r >> 1) & 3)) << 3)


def _ldmatrix_x4(smem: np.ndarray, addr: np.ndarray, trans: bool = False) -> np.ndarray:
    """ldmatrix.sync.aligned.m8n8.x4(.trans).b16: lane l supplies row l % 8 of matrix l // 8 (8
    halves at addr[l]); lane l receives elements 2(l%4), 2(l%4)+1 of row l//4 of each matrix
    (.trans: element l//4 of rows 2(l%4) and 2(l%4)+1). Checks the 16-byte alignment and that each
    matrix's 8 rows fall in distinct 16-byte bank groups."""
    assert np.all(addr % 8 == 0), "ldmatrix rows must be 16-byte aligned"
    for mat in range(4):
        groups = (addr[mat * 8:(mat + 1) * 8] * 2 // 16) % 8
        assert len(set(groups.tolist())) == 8, f"bank conflict in ldmatrix matrix {mat}: groups {groups}"
    rows = smem[addr[:, None] + np.arange(8)]  # (32 lanes-as-rows, 8)
    lane = np.arange(32)
    out = np.empty((32, 4, 2))
    for mat in range(4):
        for e in range(2):
            if trans:
                out[:, mat, e] = rows[mat * 8 + 2 * (lane % 4) + e, lane // 4]
            else:
                out[:, mat, e] = rows[mat * 8 + lane // 4, 2 * (lane % 4) + e]
    return out


LANE = np.arange(32)
G, T = LANE // 4, LANE % 4


def _a_matrix(a: np.ndarray) -> np.ndarray:
    """The 16 x 16 A operand of m16n8k16 (row) from the lanes' registers a (32, 4, 2)."""
    m = np.full((16, 16), np.nan)
    for reg, (dr, dk) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
        for e in range(2):
            m[G + dr, 2 * T + dk + e] = a[:, reg, e]
    return m


def _b_matrix(b0: np.ndarray, b1: np.ndarray) -> np.ndarray:
    """The 16 x 8 B operand (col) from the lanes' b0, b1 registers (32, 2) each."""
    m = np.full((16, 8), np.nan)
    for e in range(2):
        m[2 * T + e, G] = b0[:, e]
        m[2 * T + 8 + e, G] = b1[:, e]
    return m


class _Block:
    """One block of ``t16n_conv_<tile>`` in float64 (x NHWC and w (rows, kh, kw, chans) flattened)."""

    def __init__(self, x: np.ndarray, w: np.ndarray, geometry: tuple[int, ...], tile: str, blk: int) -> None:
        self.x, self.w, self.geometry = x, w, geometry
        self.bm, self.bn, self.wm, self.wn, self.stages = TABLE[tile]
        num, self.c, self.h, self.wd, self.m_out, self.kh, self.kw = geometry[:7]
        self.p = geometry[11] * geometry[12]
        self.ncols, self.k = num * self.p, self.kh * self.kw * self.c
        self.slices = -(-self.k // BK)  # dense: a slice may span taps
        mtiles = -(-self.m_out // self.bm)
        self.m0, self.n0 = (blk % mtiles) * self.bm, (blk // mtiles) * self.bn
        self.shared = tc16n.shared_bytes(tile) // 2
        self.ring = np.full(self.shared, np.nan)
        self.acc = np.zeros((8, self.wm // 16, self.wn // 8, 32, 4))
        # each thread's chunk of the next slice: k, tap (row, column), channel (T16NhwcSlices)
        q = np.arange(THREADS) & 3
        tap = 8 * q // self.c
        self.next = [8 * q, tap // self.kw, tap % self.kw, 8 * q - tap * self.c]

    def load(self, stage: int) -> None:
        """Every thread's cp.async chunks of the next slice into ``stage`` of the ring."""
        ph, pw, sh, sw, _, wo = self.geometry[7:]
        tid = np.arange(THREADS)
        q, rt = tid & 3, tid >> 2
        k, r, s, c = self.next
        base = stage * (self.bm + self.bn) * BK
        k_ok = k < self.k
        for e in range(self.bm // 64):
            m = self.m0 + rt + 64 * e
            ok = k_ok & (m < self.m_out)
            src = np.where(ok, np.minimum(m, self.m_out - 1) * self.k + k, 0)
            self._copy(base + _at(rt + 64 * e, q), self.w, src, ok)
        for e in range(self.bn // 64):
            col = self.n0 + rt + 64 * e
            in_ = col < self.ncols
            n = np.where(in_, col // self.p, 0)
            pix = np.where(in_, col - n * self.p, 0)
            iy = np.where(in_, (pix // wo) * sh - ph, -(1 << 30)) + r
            ix = np.where(in_, (pix % wo) * sw - pw, 0) + s
            ok = k_ok & (iy >= 0) & (iy < self.h) & (ix >= 0) & (ix < self.wd)
            src = np.where(ok, n * self.h * self.wd * self.c + (iy * self.wd + ix) * self.c + c, 0)
            self._copy(base + self.bm * BK + _at(rt + 64 * e, q), self.x, src, ok)
        k, c = k + BK, c + BK
        while np.any(c >= self.c):  # the kernel's loop: one tap crossed per turn
            cross = c >= self.c
            c = np.where(cross, c - self.c, c)
            s = np.where(cross, s + 1, s)
            r = np.where(cross & (s == self.kw), r + 1, r)
            s = np.where(s == self.kw, 0, s)
        self.next = [k, r, s, c]

    def _copy(self, dst: np.ndarray, src_array: np.ndarray, src: np.ndarray, ok: np.ndarray) -> None:
        assert np.all(dst + 8 <= self.shared)
        for j in range(8):
            self.ring[dst + j] = np.where(ok, src_array[src + j], 0.0)

    def multiply(self, stage: int) -> None:
        """Every warp's ldmatrix.x4 loads and m16n8k16 products of the slice in ``stage``."""
        a_tile = self.ring[stage * (self.bm + self.bn) * BK:]
        b_tile = a_tile[self.bm * BK:]
        for warp in range(8):
            wm, wn = warp // (self.bn // self.wn), warp % (self.bn // self.wn)
            for kk in range(BK // 16):
                a_m = np.stack([_a_matrix(_ldmatrix_x4(a_tile, _at(wm * self.wm + i * 16 + (LANE & 15),
                                                                   2 * kk + (LANE >> 4))))
                                for i in range(self.wm // 16)])
                b_regs = np.empty((self.wn // 8, 32, 2, 2))
                for j in range(0, self.wn // 8, 2):
                    r4 = _ldmatrix_x4(b_tile, _at(wn * self.wn + j * 8 + (LANE & 7) + ((LANE >> 4) << 3),
                                                  2 * kk + ((LANE >> 3) & 1)))
                    b_regs[j, :, 0], b_regs[j, :, 1] = r4[:, 0], r4[:, 1]
                    b_regs[j + 1, :, 0], b_regs[j + 1, :, 1] = r4[:, 2], r4[:, 3]
                b_m = np.stack([_b_matrix(b_regs[j, :, 0], b_regs[j, :, 1]) for j in range(self.wn // 8)])
                prod = np.einsum("iab,jbc->ijac", a_m, b_m)  # (WM/16, WN/8, 16, 8)
                for reg, (dr, dc) in enumerate(((0, 0), (0, 1), (8, 0), (8, 1))):
                    self.acc[warp, :, :, :, reg] += prod[:, :, G + dr, 2 * T + dc]

    def run(self) -> None:
        """The ring: STAGES - 1 slices ahead, the next load into the stage the previous slice used."""
        for st in range(self.stages - 1):
            if st < self.slices:
                self.load(st)
        for sl in range(self.slices):
            if sl + self.stages - 1 < self.slices:
                assert (sl + self.stages - 1) % self.stages != sl % self.stages
                self.load((sl + self.stages - 1) % self.stages)
            self.multiply(sl % self.stages)

    def epilogue(self, bias: np.ndarray, flags: int, y: np.ndarray, out: tuple[int, ...], vec_out: bool) -> None:
        """Bias and ReLU into the shared tile (rows of BN + 8), then each thread's column of NCHW rows
        (planes out_h x out_w, row out_y0 + out_sy*oy, column out_x0 + out_sx*ox), or with vec_out
        each thread's 8 columns of a row in one 16-byte store."""
        out_h, out_w, out_sy, out_sx, out_y0, out_x0 = out
        wo = self.geometry[12]
        lde = self.bn + 8
        assert self.bm * lde <= self.shared
        es = np.full(self.shared, np.nan)
        for warp in range(8):
            wm, wn = warp // (self.bn // self.wn), warp % (self.bn // self.wn)
            for i, hh, j, e in np.ndindex(self.wm // 16, 2, self.wn // 8, 2):
                row = wm * self.wm + i * 16 + G + 8 * hh
                m = self.m0 + row
                v = self.acc[warp, i, j, :, 2 * hh + e]
                if flags & 1:
                    v = v + bias[np.minimum(m, self.m_out - 1)]
                if flags & 2:
                    v = np.where(v > 0, v, v * 0.0)
                es[row * lde + wn * self.wn + j * 8 + 2 * T + e] = np.where(m < self.m_out, v, 0.0)
        rows = min(self.m_out - self.m0, self.bm)
        if vec_out:
            self._store8(es, lde, rows, y)
            return
        for t_ in range(THREADS):
            col = self.n0 + t_ % self.bn
            if col >= self.ncols:
                continue
            n, pix = divmod(col, self.p)
            oy, ox = divmod(pix, wo)
            plane = out_h * out_w
            for row in range(t_ // self.bn, rows, THREADS // self.bn):
                at = n * self.m_out * plane + (out_y0 + out_sy * oy) * out_w + out_x0 + out_sx * ox + (self.m0 + row) * plane
                assert np.isnan(y[at])  # each element written once
                y[at] = es[row * lde + t_ % self.bn]


    def _store8(self, es: np.ndarray, lde: int, rows: int, y: np.ndarray) -> None:
        assert self.p % 8 == 0 and lde % 8 == 0
        for t_ in range(THREADS):
            c8 = 8 * (t_ % (self.bn // 8))
            col = self.n0 + c8
            if col >= self.ncols:
                continue
            n, pix = divmod(col, self.p)
            assert pix + 8 <= self.p  # the 8 columns share an image
            for row in range(t_ // (self.bn // 8), rows, THREADS // (self.bn // 8)):
                at = n * self.m_out * self.p + (self.m0 + row) * self.p + pix
                assert at % 8 == 0 and np.all(np.isnan(y[at:at + 8]))  # aligned, each element once
                y[at:at + 8] = es[row * lde + c8:row * lde + c8 + 8]


def emulate_conv(x: np.ndarray, w: np.ndarray, bias: np.ndarray, epilogue: int, phase: tc16n.Phase, tile: str,
                 y: np.ndarray) -> None:
    """``t16n_conv_<tile>`` of one :class:`Phase` over its whole grid into y (NCHW, flattened)."""
    geometry = phase.geometry
    num, m_out, ho, wo = geometry[0], geometry[4], geometry[11], geometry[12]
    bm, bn = TABLE[tile][:2]
    for blk in range(-(-m_out // bm) * -(-num * ho * wo // bn)):
        block = _Block(x, w, geometry, tile, blk)
        block.run()
        block.epilogue(bias, epilogue, y, phase.out, phase.dense)


def _kat(k, q, chunks):
    """t16n_kat: element offset of chunk q of row k of a k-major stage tile (XOR with k & 7)."""
    return (k * chunks + (q ^ (k & 7))) << 3


class _WeightBlock:
    """One block (m/column tile ``blk``, split ``z``) of ``t16n_wgrad_<tile>`` in float64."""

    def __init__(self, dy: np.ndarray, x: np.ndarray, geometry: tuple[int, ...], tile: str, blk: int, z: int,
                 chunk: int, dw_channels: int) -> None:
        self.dy, self.x, self.geometry, self.dw_c = dy, x, geometry, dw_channels
        self.bm, self.bn, self.wm, self.wn, self.stages = TABLE[tile]
        num, self.c, self.h, self.wd, self.m_out, kh, self.kw = geometry[:7]
        self.p = geometry[11] * geometry[12]
        self.kg = kh * self.kw * self.c
        mtiles = -(-self.m_out // self.bm)
        self.m0, self.n0 = (blk % mtiles) * self.bm, (blk // mtiles) * self.bn
        self.t_begin = z * chunk
        self.t_end = min(self.t_begin + chunk, num * self.p)
        self.slices = -(-(self.t_end - self.t_begin) // BK)
        self.shared = tc16n.shared_bytes(tile) // 2
        self.ring = np.full(self.shared, np.nan)
        self.acc = np.zeros((8, self.wm // 16, self.wn // 8, 32, 4))
        # each thread's B-row pixels (image, row, column), divided once, then stepped by BK a slice
        kb = np.arange(THREADS) // (self.bn // 8)
        t = self.t_begin + kb[None, :] + np.arange(self.bn * BK // 8 // THREADS)[:, None] * (THREADS // (self.bn // 8))
        self.pix = [t // self.p, t % self.p // geometry[12], t % self.p % geometry[12]]

    def _step(self) -> None:
        """The kernel's stepping: ox += BK, then carry into rows and images one output row at a time."""
        n, oy, ox = self.pix
        ho, wo = self.geometry[11], self.geometry[12]
        ox = ox + BK
        while np.any(ox >= wo):
            wrap = ox >= wo
            ox = np.where(wrap, ox - wo, ox)
            oy = np.where(wrap, oy + 1, oy)
            n = np.where(oy == ho, n + 1, n)
            oy = np.where(oy == ho, 0, oy)
        self.pix = [n, oy, ox]

    def _copy(self, dst, src_array, src, ok) -> None:
        assert np.all(dst + 8 <= self.shared)
        for j in range(8):
            self.ring[dst + j] = np.where(ok, src_array[src + j], 0.0)

    def load(self, stage: int, sl: int) -> None:
        ph, pw, sh, sw, _, wo = self.geometry[7:]
        tid = np.arange(THREADS)
        a_q, b_q = self.bm // 8, self.bn // 8
        qa, ka, qb, kb = tid % a_q, tid // a_q, tid % b_q, tid // b_q
        base = stage * (self.bm + self.bn) * BK
        t0 = self.t_begin + sl * BK
        m = self.m0 + 8 * qa
        for e in range(self.bm * BK // 8 // THREADS):
            k = ka + e * (THREADS // a_q)
            t = t0 + k
            ok = (m < self.m_out) & (t < self.t_end)
            self._copy(base + _kat(k, qa, a_q), self.dy, np.where(ok, t * self.m_out + m, 0), ok)
        col = self.n0 + 8 * qb
        col_ok = col < self.kg
        tap = np.where(col_ok, col // self.c, 0)
        c = np.where(col_ok, col - tap * self.c, 0)
        r, s = tap // self.kw, tap % self.kw
        for e in range(self.bn * BK // 8 // THREADS):
            k = kb + e * (THREADS // b_q)
            t = t0 + k
            n, oy, ox = (a[e] for a in self.pix)
            assert np.all(n * self.p + oy * wo + ox == t)  # the stepped pixel is the row's
            iy, ix = oy * sh - ph + r, ox * sw - pw + s
            ok = col_ok & (t < self.t_end) & (iy >= 0) & (iy < self.h) & (ix >= 0) & (ix < self.wd)
            src = np.where(ok, ((n * self.h + iy) * self.wd + ix) * self.c + c, 0)
            self._copy(base + self.bm * BK + _kat(k, qb, b_q), self.x, src, ok)
        self._step()

    def multiply(self, stage: int) -> None:
        a_tile = self.ring[stage * (self.bm + self.bn) * BK:]
        b_tile = a_tile[self.bm * BK:]
        for warp in range(8):
            wm, wn = warp // (self.bn // self.wn), warp % (self.bn // self.wn)
            for kk in range(BK // 16):
                a_m = np.stack([_a_matrix(_ldmatrix_x4(
                    a_tile, _kat(16 * kk + (LANE & 7) + ((LANE >> 4) << 3), (wm * self.wm + i * 16) // 8
                                 + ((LANE >> 3) & 1), self.bm // 8), trans=True)) for i in range(self.wm // 16)])
                b_regs = np.empty((self.wn // 8, 32, 2, 2))
                for j in range(0, self.wn // 8, 2):
                    r4 = _ldmatrix_x4(b_tile, _kat(16 * kk + (LANE & 7) + (((LANE >> 3) & 1) << 3),
                                                   (wn * self.wn + j * 8) // 8 + (LANE >> 4), self.bn // 8), trans=True)
                    b_regs[j, :, 0], b_regs[j, :, 1] = r4[:, 0], r4[:, 1]
                    b_regs[j + 1, :, 0], b_regs[j + 1, :, 1] = r4[:, 2], r4[:, 3]
                b_m = np.stack([_b_matrix(b_regs[j, :, 0], b_regs[j, :, 1]) for j in range(self.wn // 8)])
                prod = np.einsum("iab,jbc->ijac", a_m, b_m)
                for reg, (dr, dc) in enumerate(((0, 0), (0, 1), (8, 0), (8, 1))):
                    self.acc[warp, :, :, :, reg] += prod[:, :, G + dr, 2 * T + dc]

    def run(self, part: np.ndarray) -> None:
        for st in range(self.stages - 1):
            if st < self.slices:
                self.load(st, st)
        for sl in range(self.slices):
            if sl + self.stages - 1 < self.slices:
                self.load((sl + self.stages - 1) % self.stages, sl + self.stages - 1)
            self.multiply(sl % self.stages)
        taps = self.kg // self.c
        cols = taps * self.dw_c  # a row of the partial sums: the weights' own channels only
        for warp in range(8):
            wm, wn = warp // (self.bn // self.wn), warp % (self.bn // self.wn)
            for i, hh, j, e in np.ndindex(self.wm // 16, 2, self.wn // 8, 2):
                mm = self.m0 + wm * self.wm + i * 16 + G + 8 * hh
                col = self.n0 + wn * self.wn + j * 8 + 2 * T + e
                ok = (mm < self.m_out) & (col < self.kg) & (col % self.c < self.dw_c)
                off = (col % self.c) * taps + col // self.c
                at = mm[ok] * cols + off[ok]
                assert np.all(np.isnan(part[at]))  # each partial sum written once
                part[at] = self.acc[warp, i, j, ok, 2 * hh + e]


def emulate_wgrad(dy: np.ndarray, x: np.ndarray, geometry: tuple[int, ...], tile: str, chunk: int,
                  dw_channels: int) -> np.ndarray:
    """``t16n_wgrad_<tile>`` over its grid (x staged with geometry[1] >= dw_channels channels), then
    t16_reduce_weight's split-order sum: dW (M, dw_channels*kh*kw)."""
    num, c, m_out, kh, kw, ho, wo = (geometry[i] for i in (0, 1, 4, 5, 6, 11, 12))
    bm, bn = TABLE[tile][:2]
    kg, total = kh * kw * c, num * ho * wo
    splits = -(-total // chunk)
    part = np.full((splits, m_out * kh * kw * dw_channels), np.nan)
    for z in range(splits):
        for blk in range(-(-m_out // bm) * -(-kg // bn)):
            _WeightBlock(dy, x, geometry, tile, blk, z, chunk, dw_channels).run(part[z])
    assert not np.any(np.isnan(part)), "partial sums the kernel leaves unwritten"
    return part.sum(axis=0).reshape(m_out, -1)


def staged_input(prob: ConvProblem, x: np.ndarray) -> np.ndarray:
    """x as the forward and weight gradient read it: the pixels (oy*sh, ox*sw) where subsampled."""
    if not tc16n.subsampled(prob):
        return x
    (ho, wo), (sh, sw) = prob.out_hw, prob.stride
    return x[:, :, :sh * ho:sh, :sw * wo:sw]


def stage_nhwc(image: np.ndarray, channels: int) -> np.ndarray:
    """An NCHW image as the engine stages it: NHWC with ``channels`` >= C, zeros past C, flattened."""
    num, c, h, w = image.shape
    out = np.zeros((num, h, w, channels))
    out[..., :c] = image.transpose(0, 2, 3, 1)
    return out.ravel()


def permute_weights(w: np.ndarray, args: tuple[int, ...]) -> np.ndarray:
    """``t16n_permute_weights`` on the host from the kernel's index formula: w (M, C, kh, kw) and a
    :attr:`Phase.permute` (count, rows, chans, kh, kw, uh, uw, i0, j0, sh, sw, data_grad, wchans)."""
    n, rows, chans, kh, kw, uh, uw, i0, j0, sh, sw, data_grad, wchans = args
    flat, i = np.append(w.ravel(), 0.0), np.arange(n)
    c, rest = i % chans, i // chans
    v, rest2 = rest % uw, rest // uw
    u, o = rest2 % uh if uh else rest2, rest2 // uh if uh else rest2
    if data_grad:
        src = ((c * rows + o) * kh + i0 + sh * (uh - 1 - u)) * kw + j0 + sw * (uw - 1 - v)
    else:
        src = np.where(c < wchans, ((o * wchans + np.minimum(c, wchans - 1)) * kh + u) * kw + v, w.size)  # zeros
    return flat[src]


def emulate_pass(prob: ConvProblem, pass_: str, image: np.ndarray, w: np.ndarray, bias: np.ndarray, epilogue: int,
                 tile: str) -> np.ndarray:
    """The forward (image x) or data gradient (image dy) as the engine runs it: the image staged
    NHWC, then per phase the weights permuted and the GEMM; the output NCHW, NaN where nothing wrote."""
    out_shape = (prob.num, prob.num_output) + prob.out_hw if pass_ == "forward" else \
        (prob.num, prob.channels, prob.height, prob.width)
    y = np.full(int(np.prod(out_shape)), np.nan)
    staged = stage_nhwc(staged_input(prob, image), tc16n.staged_channels(prob)) if pass_ == "forward" else \
        stage_nhwc(image, image.shape[1])
    every = tc16n.phases(prob, pass_)
    launched = [ph for ph in every if ph.geometry[5] * ph.geometry[6]]  # as tensorcore16_nhwc.plan keeps them
    for phase in launched:
        emulate_conv(staged, permute_weights(w, phase.permute), bias, epilogue, phase, tile, y)
    if len(launched) < len(every):  # the memset before the phases: what no phase wrote is 0
        y[np.isnan(y)] = 0.0
    return y


FORWARD = [  # (num, C, H, W, M, kernel, pad, stride), tile
    ((2, 40, 5, 6, 70, (3, 3), (1, 1), (1, 1)), "64x64"),  # a partial channel slice, ragged M and columns
    ((2, 40, 5, 6, 70, (3, 3), (1, 1), (1, 1)), "128x128"),
    ((3, 16, 7, 7, 20, (1, 1), (0, 0), (2, 2)), "128x64"),  # 1x1 stride 2
    ((2, 8, 6, 5, 24, (5, 3), (2, 1), (2, 1)), "64x128"),  # non-square kernel, mixed strides, C = 8
    ((1, 64, 4, 4, 130, (3, 3), (0, 0), (1, 1)), "128x64"),  # two row tiles, no padding
    ((3, 24, 8, 8, 40, (3, 3), (1, 1), (1, 1)), "128x128"),  # 64 pixels: 16-byte stores, a half column tile
    ((5, 16, 6, 4, 72, (1, 1), (0, 0), (1, 1)), "64x64"),  # 24 pixels: 16-byte stores, images across tiles
    ((2, 3, 11, 10, 16, (7, 7), (3, 3), (2, 2)), "64x128"),  # an RGB stem: C padded to 8, 4 taps a slice
    ((2, 12, 5, 5, 8, (3, 3), (1, 1), (1, 1)), "128x64"),  # C padded to 16: slices of 2 taps
]


@pytest.mark.parametrize("case", FORWARD, ids=str)
@pytest.mark.parametrize("epilogue", [0, 3])
def test_emulated_forward_is_the_convolution(case, epilogue):
    (num, c, h, w_, m, kernel, pad, stride), tile = case
    prob = ConvProblem(num, c, h, w_, m, 1, kernel, pad, stride, (1, 1), "<f2")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((num, c, h, w_))
    w = rng.standard_normal((m, c) + kernel)
    bias = rng.standard_normal(m)
    ref = np.empty((num, m) + prob.out_hw)
    cpu_conv.forward(x, w, bias if epilogue & 1 else None, kernel, pad, stride, (1, 1), 1, ref)
    if epilogue & 2:
        ref = np.maximum(ref, 0)
    got = emulate_pass(prob, "forward", x, w, bias, epilogue, tile)
    assert not np.any(np.isnan(got)), "elements the kernel leaves unwritten"
    np.testing.assert_allclose(got, ref.ravel(), rtol=1e-12, atol=1e-10)


DATA = [  # (num, C, H, W, M, kernel, pad, stride), tile
    ((2, 24, 5, 5, 16, (3, 3), (0, 0), (1, 1)), "64x64"),  # no padding: the GEMM pads by 2
    ((2, 16, 6, 7, 40, (3, 1), (1, 0), (1, 1)), "128x64"),
    ((1, 8, 4, 4, 8, (1, 1), (0, 0), (1, 1)), "64x128"),
    ((2, 16, 7, 8, 24, (1, 1), (0, 0), (2, 2)), "64x64"),  # 1x1 stride 2: three phases without taps (zeros)
    ((2, 8, 9, 8, 16, (3, 3), (1, 1), (2, 2)), "128x128"),  # 3x3 stride 2: phases of 1, 2 and 4 taps
    ((1, 16, 10, 7, 8, (5, 3), (2, 0), (3, 2)), "64x128"),  # mixed strides, ragged phases
    ((2, 8, 2, 3, 8, (3, 3), (1, 1), (4, 4)), "64x64"),  # stride above the image: fewer phases
]


@pytest.mark.parametrize("case", DATA, ids=str)
def test_emulated_data_gradient_is_the_transposed_convolution(case):
    (num, c, h, w_, m, kernel, pad, stride), tile = case
    prob = ConvProblem(num, c, h, w_, m, 1, kernel, pad, stride, (1, 1), "<f2")
    assert tc16n.own_data_gradient(prob)
    assert len(tc16n.phases(prob, "backward_data")) == min(stride[0], h) * min(stride[1], w_)
    rng = np.random.default_rng(2)
    w = rng.standard_normal((m, c) + kernel)
    dy = rng.standard_normal((num, m) + prob.out_hw)
    x = np.zeros((num, c, h, w_))
    dx = np.empty_like(x)
    cpu_conv.backward(x, w, dy, kernel, pad, stride, (1, 1), 1, dx=dx)
    got = emulate_pass(prob, "backward_data", dy, w, np.zeros(c), 0, tile)
    assert not np.any(np.isnan(got)), "elements no phase writes"
    np.testing.assert_allclose(got, dx.ravel(), rtol=1e-12, atol=1e-10)


def test_tile_table_matches_the_kernel_file():
    assert tuple(TABLE) == tc16n.TILES
    for tile, (bm, bn, wm, wn, stages) in TABLE.items():
        assert (bm, bn) == tuple(int(v) for v in tile.split("x"))
        assert (bm // wm) * (bn // wn) == 8 and stages == tc16n.STAGES
        assert tc16n.shared_bytes(tile) <= 227 * 1024  # sm_90's opt-in per-block limit
    assert tc16n.BK == BK


@pytest.fixture
def sm(monkeypatch):
    cc = {"value": (9, 0)}
    monkeypatch.setattr(tc16, "compute_capability", lambda: cc["value"])
    return cc


def test_supports_and_refusals(sm):
    ok = ConvProblem(2, 64, 14, 14, 36, 1, (3, 3), (1, 1), (2, 2), (1, 1), "<f2")
    assert tc16n.supports(ok) and tc16n.supports(ConvProblem(2, 64, 14, 14, 36, 1, (3, 3), (1, 1), (2, 2), (1, 1),
                                                             "<u2"))
    refused = [
        ConvProblem(2, 64, 14, 14, 36, 1, (3, 3), (1, 1), (2, 2), (1, 1), "<f4"),  # float32
        ConvProblem(2, 64, 14, 14, 36, 2, (3, 3), (1, 1), (2, 2), (1, 1), "<f2"),  # groups
        ConvProblem(2, 64, 14, 14, 36, 1, (3, 3), (2, 2), (1, 1), (2, 2), "<f2"),  # dilation
    ]
    for prob in refused:
        assert not tc16n.supports(prob), prob
    for c, padded in ((60, 64), (3, 8)):  # staged zero-padded to a multiple of 8 (the RGB stem)
        prob = ConvProblem(2, c, 224, 224, 64, 1, (7, 7), (3, 3), (2, 2), (1, 1), "<f2")
        assert tc16n.supports(prob) and tc16n.staged_channels(prob) == padded
        assert tc16n.conv_geometry(prob)[1] == padded
        assert tc16n.staged_counts(prob, "forward") == (2 * padded * 224 * 224, 64 * 49 * padded)
    names = [f"tensorcore16-nhwc-{t}" for t in tc16n.TILES]
    registry.load_engines()
    assert all(registry.ENGINES[n].supports(ok) for n in names)
    assert not any(registry.ENGINES[n].supports(refused[0]) for n in names)
    sm["value"] = (7, 5)
    assert not tc16n.supports(ok)


def test_float_problems_are_refused_without_a_device(monkeypatch):
    def no_device():
        raise AssertionError("asked the device")
    monkeypatch.setattr(tc16, "compute_capability", no_device)
    assert not tc16n.supports(ConvProblem(2, 64, 8, 8, 8, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f4"))


def test_data_gradient_own_or_delegated_and_scratch(sm):
    s1 = ConvProblem(3, 64, 9, 7, 40, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f2")
    s2 = ConvProblem(3, 64, 9, 7, 40, 1, (3, 3), (1, 1), (2, 2), (1, 1), "<u2")
    m_odd = ConvProblem(3, 64, 9, 7, 20, 1, (3, 3), (1, 1), (2, 2), (1, 1), "<f2")
    assert tc16n.own_data_gradient(s1) and tc16n.own_data_gradient(s2)
    assert not tc16n.own_data_gradient(m_odd)
    assert not tc16n.own_data_gradient(ConvProblem(3, 64, 9, 7, 36, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f2"))
    for tile in tc16n.TILES:
        engine = registry.ENGINES[f"tensorcore16-nhwc-{tile}"]
        assert engine.passes == ("forward", "backward_data", "backward_weight")
        assert engine.scratch(s1, "forward", True) == (3 * 64 * 63 * 2, 40 * 64 * 9 * 2)
        assert engine.scratch(s1, "backward_data", False) == (3 * 40 * 63 * 2, 40 * 64 * 9 * 2)
        assert engine.scratch(s2, "backward_data", False) == (3 * 40 * 5 * 4 * 2, 40 * 64 * 9 * 2)
        delegate = tc16.TensorCore16Engine(tc16n.delegate_tile(tile))
        assert engine.scratch(m_odd, "backward_data", False) == delegate.scratch(m_odd, "backward_data", False)
        assert tc16n.delegate_tile(tile) in tc16.TILES


def test_data_gradient_phases():
    """Stride 1: one phase, the stride-1 convolution of dy padded k - 1 - pad into dx; stride 2 on a
    3x3 kernel: four phases whose taps partition the filter's, each writing every other row/column."""
    prob = ConvProblem(3, 64, 9, 7, 40, 1, (3, 5), (0, 2), (1, 1), (1, 1), "<f2")
    ho, wo = prob.out_hw
    (one,) = tc16n.phases(prob, "backward_data")
    assert one.geometry == (3, 40, ho, wo, 64, 3, 5, 2, 2, 1, 1, 9, 7)
    assert one.out == (9, 7, 1, 1, 0, 0)
    assert (ho + 2 * one.geometry[7] - 3 + 1, wo + 2 * one.geometry[8] - 5 + 1) == (9, 7)
    s2 = ConvProblem(2, 16, 9, 8, 24, 1, (3, 3), (1, 1), (2, 2), (1, 1), "<f2")
    four = tc16n.phases(s2, "backward_data")
    assert [p.out[4:] for p in four] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert sum(p.geometry[5] * p.geometry[6] for p in four) == 9  # the taps, each once
    assert sum(p.geometry[11] * p.geometry[12] for p in four) == 9 * 8  # dx positions, each once
    assert max(p.permute[0] for p in four) <= s2.num_output * s2.kg  # the weight scratch holds any phase
    (fwd,) = tc16n.phases(s2, "forward")
    assert fwd.geometry == tc16n.conv_geometry(s2) and fwd.out == s2.out_hw + (1, 1, 0, 0)


@pytest.mark.slow
def test_kernel_file_compiles_for_every_type():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "check_kernels.py"), "--paths", str(tc16n.KERNELS),
                           "--dtype", "float", "--dtype", "double", "--dtype", "half", "--dtype", "bfloat16"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("case", [((2, 16, 5, 6, 24, (3, 3), (1, 1), (1, 1)), "64x64", 32),  # 3 splits, ragged
                                  ((3, 8, 7, 7, 16, (1, 1), (0, 0), (2, 2)), "128x64", 64),  # 1x1 stride 2
                                  ((1, 24, 6, 5, 72, (3, 2), (0, 1), (2, 1)), "64x128", 32),  # 2 row tiles
                                  ((2, 64, 3, 3, 8, (3, 3), (1, 1), (1, 1)), "128x128", 96),  # Kg = 576: 5 column tiles
                                  ((2, 3, 9, 8, 16, (7, 7), (3, 3), (2, 2)), "64x64", 32)],  # RGB stem: x padded to 8
                         ids=str)
def test_emulated_weight_gradient_is_the_convolutions(case):
    (num, c, h, w_, m, kernel, pad, stride), tile, chunk = case
    prob = ConvProblem(num, c, h, w_, m, 1, kernel, pad, stride, (1, 1), "<f2")
    assert tc16n.own_weight_gradient(prob)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((num, c, h, w_))
    dy = rng.standard_normal((num, m) + prob.out_hw)
    dw = np.zeros((m, c) + kernel)
    cpu_conv.backward(x, np.zeros_like(dw), dy, kernel, pad, stride, (1, 1), 1, dweight=dw)
    got = emulate_wgrad(dy.transpose(0, 2, 3, 1).ravel(), stage_nhwc(staged_input(prob, x), tc16n.staged_channels(prob)),
                        tc16n.conv_geometry(prob), tile, chunk, c)
    np.testing.assert_allclose(got, dw.reshape(m, -1), rtol=1e-12, atol=1e-10)


def test_weight_gradient_scratch_and_delegation(sm, monkeypatch):
    from pycaffe_lite.conv import tiling

    monkeypatch.setattr(tc16n, "weight_splits", lambda prob, tile: (3, 64))
    prob = ConvProblem(3, 64, 9, 7, 40, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f2")
    odd = ConvProblem(3, 64, 9, 7, 36, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<u2")
    assert tc16n.owns(prob, "backward_weight") and not tc16n.owns(odd, "backward_weight")
    assert tc16n.owns(odd, "forward")
    for tile in tc16n.TILES:
        engine = registry.ENGINES[f"tensorcore16-nhwc-{tile}"]
        assert engine.scratch(prob, "backward_weight", True) == (3 * 40 * 63 * 2, 3 * 64 * 63 * 2, 3 * 40 * 576 * 4)
        monkeypatch.setattr(tiling, "split_contraction", lambda *a: (2, 96))
        monkeypatch.setattr(tc16, "_weight_kernel", lambda *a: type("K", (), {"resident_blocks": lambda s, t: 2})())
        delegate = tc16.TensorCore16Engine(tc16n.delegate_tile(tile))
        assert engine.scratch(odd, "backward_weight", True) == delegate.scratch(odd, "backward_weight", True)


def emulate_to_nhwc(src: np.ndarray, grid: tuple[int, int, int], channels: int, plane: int, out_w: int,
                    in_plane: int, in_w: int, sh: int, sw: int) -> np.ndarray:
    """``t16n_to_nhwc`` over ``grid`` from its index arithmetic: every block's loads (pixel p from the
    source pixel (p // out_w) * sh * in_w + (p % out_w) * sw) into the [channel][pixel] tile (rows of
    TT + 2) and its 8-channel stores; dst NaN where nothing wrote."""
    tt, tp = tc16n.TRANSPOSE_TILE, tc16n.TRANSPOSE_TILE + 2
    dst = np.full(grid[1] * channels * plane, np.nan)
    tid = np.arange(THREADS)
    ctiles = -(-channels // tt)
    for bx, by in np.ndindex(grid[0], grid[1]):
        c0, p0 = (bx % ctiles) * tt, (bx // ctiles) * tt
        image = by * channels * plane
        pix = p0 + tid % tt
        sp = (pix // out_w) * sh * in_w + (pix % out_w) * sw
        tile = np.full(tt * tp, np.nan)
        for k in range(tt * tt // THREADS):
            l_ = tid + k * THREADS
            p, c = l_ % tt, l_ // tt
            ok = (pix < plane) & (c0 + c < channels)
            at = by * channels * in_plane + np.where(ok, (c0 + c) * in_plane + sp, 0)
            tile[c * tp + p] = np.where(ok, src[at], 0.0)
        for k in range(tt * tt // 8 // THREADS):
            u = tid + k * THREADS
            q, p = u % (tt // 8), u // (tt // 8)
            for t_ in np.nonzero((p0 + p < plane) & (c0 + 8 * q < channels))[0]:
                at = image + (p0 + p[t_]) * channels + c0 + 8 * q[t_]
                assert at % 8 == 0  # 16-byte aligned stores
                assert np.all(np.isnan(dst[at:at + 8]))
                dst[at:at + 8] = tile[(8 * q[t_] + np.arange(8)) * tp + p[t_]]
    return dst


@pytest.mark.parametrize("shape", [(2, 24, 49), (1, 136, 196), (3, 8, 5), (1, 64, 64)], ids=str)
def test_emulated_nhwc_staging_is_the_transpose(shape, monkeypatch):
    monkeypatch.setattr(tc16n.backend, "kernel", lambda path, name, dtype: name)
    num, c, plane = shape
    stage = tc16n.stage_plan(ConvProblem(num, c, plane, 1, 8, 1, (1, 1), (0, 0), (1, 1), (1, 1), "<f2"), num, c, plane)
    assert stage.kernel == "t16n_to_nhwc" and stage.grid[1] == num and stage.tail[:2] == (c, plane)
    src = np.random.default_rng(4).standard_normal(shape)
    got = emulate_to_nhwc(src.ravel(), stage.grid, *stage.tail)
    np.testing.assert_array_equal(got, src.transpose(0, 2, 1).ravel())


@pytest.mark.parametrize("case", [((2, 16, 9, 8), (2, 2)), ((1, 72, 15, 15), (3, 2))], ids=str)
def test_emulated_subsampled_staging_takes_the_strided_pixels(case, monkeypatch):
    """A 1x1 convolution at stride 2 or 3 without padding stages only the pixels it reads."""
    monkeypatch.setattr(tc16n.backend, "kernel", lambda path, name, dtype: name)
    (num, c, h, w_), stride = case
    prob = ConvProblem(num, c, h, w_, 8, 1, (1, 1), (0, 0), stride, (1, 1), "<f2")
    assert tc16n.subsampled(prob)
    stage = tc16n.input_stage(prob)
    (ho, wo) = prob.out_hw
    assert stage.tail == (c, ho * wo, wo, h * w_, w_, *stride)
    assert tc16n.staged_counts(prob, "forward")[0] == num * c * ho * wo
    src = np.random.default_rng(7).standard_normal((num, c, h, w_))
    got = emulate_to_nhwc(src.ravel(), stage.grid, *stage.tail)
    np.testing.assert_array_equal(got, stage_nhwc(staged_input(prob, src), c))
    assert not tc16n.subsampled(ConvProblem(num, c, h, w_, 8, 1, (1, 1), (1, 1), stride, (1, 1), "<f2"))  # padded
    assert not tc16n.subsampled(ConvProblem(num, 3, h, w_, 8, 1, (1, 1), (0, 0), stride, (1, 1), "<f2"))  # narrow


@pytest.mark.parametrize("shape", [(2, 3, 49), (1, 12, 30), (3, 1, 5)], ids=str)
def test_emulated_narrow_staging_pads_the_channels(shape, monkeypatch):
    """t16n_to_nhwc_narrow from its index arithmetic: every (image, 8-channel group, pixel) once,
    zeros past C, 16-byte aligned stores."""
    monkeypatch.setattr(tc16n.backend, "kernel", lambda path, name, dtype: name)
    num, c, plane = shape
    stage = tc16n.stage_plan(ConvProblem(num, c, plane, 1, 8, 1, (1, 1), (0, 0), (1, 1), (1, 1), "<f2"), num, c, plane)
    (count,), (channels, padded, plane_) = stage.head, stage.tail
    assert stage.kernel == "t16n_to_nhwc_narrow" and (channels, plane_) == (c, plane) and padded % 8 == 0
    assert stage.grid[0] * THREADS >= count == num * plane * padded // 8
    src = np.random.default_rng(5).standard_normal(shape).ravel()
    dst = np.full(num * plane * padded, np.nan)
    for i in range(count):
        p, rest = i % plane, i // plane
        g, n = rest % (padded // 8), rest // (padded // 8)
        at = (n * plane + p) * padded + 8 * g
        assert at % 8 == 0 and np.all(np.isnan(dst[at:at + 8]))
        dst[at:at + 8] = [src[(n * c + 8 * g + j) * plane + p] if 8 * g + j < c else 0.0 for j in range(8)]
    np.testing.assert_array_equal(dst, stage_nhwc(src.reshape(num, c, plane, 1), padded))


def test_nhwc_staging_refuses_too_many_images():
    with pytest.raises(CudaError, match="images"):
        tc16n.stage_plan(ConvProblem(2, 16, 5, 5, 8, 1, (1, 1), (0, 0), (1, 1), (1, 1), "<f2"), 1 << 20, 16, 25)


def test_vectorised_stores_only_for_dense_outputs():
    dense = ConvProblem(2, 16, 8, 8, 24, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f2")  # 64 pixels
    assert tc16n.phases(dense, "forward")[0].dense and tc16n.phases(dense, "backward_data")[0].dense
    ragged = ConvProblem(2, 16, 7, 7, 24, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f2")  # 49 pixels
    assert not tc16n.phases(ragged, "forward")[0].dense
    strided = ConvProblem(2, 16, 16, 16, 24, 1, (1, 1), (0, 0), (2, 2), (1, 1), "<f2")
    assert tc16n.phases(strided, "forward")[0].dense  # 8 x 8 output
    assert not any(p.dense for p in tc16n.phases(strided, "backward_data"))  # every other row and column
