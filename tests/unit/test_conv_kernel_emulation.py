"""The depthwise and direct convolution kernels emulated in Python (CPU, no GPU): each body of
``conv_depthwise.cu`` and ``conv_direct.cu`` transliterated index for index, launched through the real
Python call side (arguments checked against the parsed signatures, pointers mapped to numpy arrays),
compared with cpu_conv. Catches index, argument-order, tiling, chunking and reduction mistakes before
a GPU ever runs them."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite.conv import cpu as cpu_conv
from pycaffe_lite.conv import depthwise as conv_depthwise
from pycaffe_lite.conv import direct as conv_direct
from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu.signatures import check_args, parse_signatures

SIGNATURES = {**parse_signatures(conv_depthwise.KERNELS.read_text()),
              **parse_signatures(conv_direct.KERNELS.read_text())}


class Memory:
    """Device pointers (ints) -> flat float64 arrays."""

    def __init__(self) -> None:
        self.arrays: dict[int, np.ndarray] = {}

    def put(self, a: np.ndarray) -> int:
        ptr = 4096 * (len(self.arrays) + 1)
        self.arrays[ptr] = np.array(a, dtype=np.float64).ravel()
        return ptr


def _geom(g):
    (channels, height, width, mult, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
     height_out, width_out) = g
    return dict(C=channels, H=height, W=width, mult=mult, kh=kernel_h, kw=kernel_w, sh=stride_h, sw=stride_w,
                ph=pad_h, pw=pad_w, dh=dil_h, dw=dil_w, Ho=height_out, Wo=width_out)


def emu_forward(K, S, count, x, w, bias, has_bias, y, *g):
    d = _geom(g)
    kh, kw = (K, K) if K else (d["kh"], d["kw"])
    sh, sw = (S, S) if S else (d["sh"], d["sw"])
    num_output = d["C"] * d["mult"]
    for index in range(count):
        ow = index % d["Wo"]
        t = index // d["Wo"]
        oh = t % d["Ho"]
        plane = t // d["Ho"]
        m = plane % num_output
        xo = (plane // d["mult"]) * d["H"] * d["W"]
        wo = m * kh * kw
        h0, w0 = oh * sh - d["ph"], ow * sw - d["pw"]
        s = 0.0
        for i in range(kh):
            ih = h0 + i * d["dh"]
            if ih < 0 or ih >= d["H"]:
                continue
            for j in range(kw):
                iw = w0 + j * d["dw"]
                if 0 <= iw < d["W"]:
                    s += w[wo + i * kw + j] * x[xo + ih * d["W"] + iw]
        y[index] = s + bias[m] if has_bias else s


def emu_backward_data(K, S, count, dy, w, dx, *g):
    d = _geom(g)
    kh, kw = (K, K) if K else (d["kh"], d["kw"])
    sh, sw = (S, S) if S else (d["sh"], d["sw"])
    out_plane = d["Ho"] * d["Wo"]
    for index in range(count):
        iw = index % d["W"]
        t = index // d["W"]
        ih = t % d["H"]
        plane = t // d["H"]
        c = plane % d["C"]
        s = 0.0
        for r in range(d["mult"]):
            dyo = (plane * d["mult"] + r) * out_plane
            wo = (c * d["mult"] + r) * kh * kw
            for i in range(kh):
                th = ih + d["ph"] - i * d["dh"]
                if th < 0 or th % sh:  # C's % on a non-negative th
                    continue
                oh = th // sh
                if oh >= d["Ho"]:
                    continue
                for j in range(kw):
                    tw = iw + d["pw"] - j * d["dw"]
                    if tw < 0 or tw % sw:
                        continue
                    ow = tw // sw
                    if ow < d["Wo"]:
                        s += w[wo + i * kw + j] * dy[dyo + oh * d["Wo"] + ow]
        dx[index] = s


def emu_backward_weight(K, S, x, dy, num, chunk, chunks, has_bias, part, dw, db, *g, blocks, threads):
    d = _geom(g)
    T = K * K if K else 1
    kh, kw = (K, K) if K else (d["kh"], d["kw"])
    sh, sw = (S, S) if S else (d["sh"], d["sw"])
    taps, num_output = kh * kw, d["C"] * d["mult"]
    out_plane = d["Ho"] * d["Wo"]
    total = num * out_plane
    for b in range(blocks):
        m, s = b // chunks, b % chunks
        e0, e1 = s * chunk, min(total, s * chunk + chunk)
        for t0 in range(0, taps, T):
            red = np.zeros((T + 1, threads))
            for tid in range(threads):
                for e in range(e0 + tid, e1, threads):
                    n, p = e // out_plane, e % out_plane
                    oh, ow = p // d["Wo"], p % d["Wo"]
                    gv = dy[(n * num_output + m) * out_plane + p]
                    xo = (n * d["C"] + m // d["mult"]) * d["H"] * d["W"]
                    red[T, tid] += gv
                    for u in range(T):
                        tap = t0 + u
                        i, j = tap // kw, tap % kw
                        ih, iw = oh * sh - d["ph"] + i * d["dh"], ow * sw - d["pw"] + j * d["dw"]
                        if 0 <= ih < d["H"] and 0 <= iw < d["W"] and tap < taps:
                            red[u, tid] += gv * x[xo + ih * d["W"] + iw]
            emu_reduce_store(red, T, t0, taps, has_bias, chunks, m, s, part, dw, db)


def emu_reduce_store(red, T, t0, taps, has_bias, chunks, m, s, part, dw, db):
    half = red.shape[1] // 2
    while half:
        red[:, :half] += red[:, half:2 * half]
        half //= 2
    for tid in range(T + 1):
        if not (tid < T or (t0 == 0 and has_bias)):
            continue
        tap = t0 + tid if tid < T else taps
        if chunks > 1:
            part[(m * chunks + s) * (taps + 1) + tap] = red[tid, 0]
        elif tap < taps:
            dw[m * taps + tap] += red[tid, 0]
        else:
            db[m] += red[tid, 0]


V = 4  # DW_V


def load_row(row, base, w0, width, span):
    return [row[base + w0 + u] if 0 <= w0 + u < width else 0.0 for u in range(span)]


def emu_forward_rows(S, count, x, w, bias, has_bias, y, *g):
    d = _geom(g)
    span, num_output, quads = (V - 1) * S + 3, d["C"] * d["mult"], -(-d["Wo"] // V)
    for index in range(count):
        q, t = index % quads, index // quads
        oh, plane = t % d["Ho"], t // d["Ho"]
        m = plane % num_output
        xo = (plane // d["mult"]) * d["H"] * d["W"]
        k = [w[m * 9 + u] for u in range(9)]
        ow0 = q * V
        h0, w0 = oh * S - d["ph"], ow0 * S - d["pw"]
        acc = [0.0] * V
        for i in range(3):
            ih = h0 + i
            if ih < 0 or ih >= d["H"]:
                continue
            r = load_row(x, xo + ih * d["W"], w0, d["W"], span)
            for v in range(V):
                for j in range(3):
                    acc[v] += k[i * 3 + j] * r[v * S + j]
        b = bias[m] if has_bias else 0.0
        for v in range(V):
            if ow0 + v < d["Wo"]:
                y[(plane * d["Ho"] + oh) * d["Wo"] + ow0 + v] = acc[v] + b


def emu_backward_data_rows(count, dy, w, dx, *g):
    d = _geom(g)
    quads, out_plane = -(-d["W"] // V), d["Ho"] * d["Wo"]
    for index in range(count):
        q, t = index % quads, index // quads
        ih, plane = t % d["H"], t // d["H"]
        c = plane % d["C"]
        iw0 = q * V
        w0 = iw0 + d["pw"] - 2
        acc = [0.0] * V
        for rr in range(d["mult"]):
            dyo = (plane * d["mult"] + rr) * out_plane
            ko = (c * d["mult"] + rr) * 9
            for i in range(3):
                oh = ih + d["ph"] - i
                if oh < 0 or oh >= d["Ho"]:
                    continue
                r = load_row(dy, dyo + oh * d["Wo"], w0, d["Wo"], V + 2)
                for v in range(V):
                    for j in range(3):
                        acc[v] += w[ko + i * 3 + j] * r[v + 2 - j]
        for v in range(V):
            if iw0 + v < d["W"]:
                dx[(plane * d["H"] + ih) * d["W"] + iw0 + v] = acc[v]


def emu_backward_weight_rows(S, x, dy, num, chunk, chunks, has_bias, part, dw, db, *g, blocks, threads):
    d = _geom(g)
    span, num_output, quads = (V - 1) * S + 3, d["C"] * d["mult"], -(-d["Wo"] // V)
    total = num * d["Ho"] * quads
    for b in range(blocks):
        m, s = b // chunks, b % chunks
        e0, e1 = s * chunk, min(total, s * chunk + chunk)
        red = np.zeros((10, threads))
        for tid in range(threads):
            for e in range(e0 + tid, e1, threads):
                q, t = e % quads, e // quads
                oh, n = t % d["Ho"], t // d["Ho"]
                ow0 = q * V
                dyo = ((n * num_output + m) * d["Ho"] + oh) * d["Wo"]
                gv = [dy[dyo + ow0 + v] if ow0 + v < d["Wo"] else 0.0 for v in range(V)]
                red[9, tid] += sum(gv)
                xo = (n * d["C"] + m // d["mult"]) * d["H"] * d["W"]
                h0, w0 = oh * S - d["ph"], ow0 * S - d["pw"]
                for i in range(3):
                    ih = h0 + i
                    if ih < 0 or ih >= d["H"]:
                        continue
                    r = load_row(x, xo + ih * d["W"], w0, d["W"], span)
                    for j in range(3):
                        red[i * 3 + j, tid] += sum(gv[v] * r[v * S + j] for v in range(V))
        emu_reduce_store(red, 9, 0, 9, has_bias, chunks, m, s, part, dw, db)


def emu_reduce(count, part, chunks, taps, has_bias, dw, db):
    for index in range(count):
        u, m = index % (taps + 1), index // (taps + 1)
        if u == taps and not has_bias:
            continue
        total = sum(part[m * chunks * (taps + 1) + u + s * (taps + 1)] for s in range(chunks))
        if u < taps:
            dw[m * taps + u] += total
        else:
            db[m] += total


def emu_direct_forward(K, S, x, w, bias, has_bias, y, channels, height, width, num_output, pad_h, pad_w,
                       height_out, width_out, grid, block):
    TILE, TM = 16, 8
    assert block == (TILE, 8, 1)
    CK = 4 if K <= 3 else 1
    P = (TILE - 1) * S + K
    KK = K * K
    tiles_w = (width_out + TILE - 1) // TILE
    for bz, by, bx in np.ndindex(grid[2], grid[1], grid[0]):
        oh0, ow0 = (bx // tiles_w) * TILE, (bx % tiles_w) * TILE
        m0, n = by * TM, bz
        h0, w0 = oh0 * S - pad_h, ow0 * S - pad_w
        xn = n * channels * height * width
        acc = np.zeros((8, TILE, 2, TM))  # per thread (ty, tx)
        for c0 in range(0, channels, CK):
            xs, ws = np.full((CK, P, P), np.nan), np.full((TM, CK, KK), np.nan)
            for e in range(CK * P * P):  # all threads' strided loops together
                cl, r = e // (P * P), e % (P * P)
                pr, pc = r // P, r % P
                c, ih, iw = c0 + cl, h0 + pr, w0 + pc
                ok = c < channels and 0 <= ih < height and 0 <= iw < width
                xs[cl, pr, pc] = x[xn + (c * height + ih) * width + iw] if ok else 0.0
            for e in range(TM * CK * KK):
                t, r = e // (CK * KK), e % (CK * KK)
                cl, tap = r // KK, r % KK
                m, c = m0 + t, c0 + cl
                ws[t, cl, tap] = w[(m * channels + c) * KK + tap] if m < num_output and c < channels else 0.0
            for ty, tx in np.ndindex(8, TILE):
                for cl in range(CK):
                    for i in range(K):
                        for j in range(K):
                            x0, x1 = xs[cl, ty * S + i, tx * S + j], xs[cl, (ty + 8) * S + i, tx * S + j]
                            acc[ty, tx, 0] += ws[:, cl, i * K + j] * x0
                            acc[ty, tx, 1] += ws[:, cl, i * K + j] * x1
        for ty, tx in np.ndindex(8, TILE):
            ow = ow0 + tx
            for t in range(TM):
                m = m0 + t
                for r in range(2):
                    oh = oh0 + ty + 8 * r
                    if m < num_output and oh < height_out and ow < width_out:
                        v = acc[ty, tx, r, t]
                        y[((n * num_output + m) * height_out + oh) * width_out + ow] = v + bias[m] if has_bias else v


class FakeKernel:
    def __init__(self, mem: Memory, name: str) -> None:
        self.mem, self.name, self.sig = mem, name, SIGNATURES[name]

    def __call__(self, *args, grid=None, block=256, shared=0):
        check_args(self.sig, args, "conv_depthwise.cu")
        args = [self.mem.arrays[a] if p.kind == "ptr" else a for p, a in zip(self.sig.params, args)]
        base, _, variant = self.name.rpartition("_")
        if self.name == "dw_reduce_weight":
            return emu_reduce(*args)
        if base == "dc_forward":
            k, s = (int(v) for v in variant[1:].split("s"))
            return emu_direct_forward(k, s, *args, grid=grid, block=block)
        assert variant in ("k3s1", "k3s2", "any")
        S = 1 if variant == "k3s1" else 2
        if base == "dw_forward":
            emu_forward(0, 0, *args) if variant == "any" else emu_forward_rows(S, *args)
        elif base == "dw_backward_data":
            {"k3s1": emu_backward_data_rows, "k3s2": lambda *a: emu_backward_data(3, 2, *a),
             "any": lambda *a: emu_backward_data(0, 0, *a)}[variant](*args)
        else:
            assert block == conv_depthwise.THREADS
            if variant == "any":
                emu_backward_weight(0, 0, *args, blocks=grid, threads=block)
            else:
                emu_backward_weight_rows(S, *args, blocks=grid, threads=block)


@pytest.fixture
def mem(monkeypatch):
    mem = Memory()
    monkeypatch.setattr(backend, "kernel", lambda path, name, dtype: FakeKernel(mem, name))
    monkeypatch.setattr(backend, "workspace", lambda *sizes: [mem.put(np.full(s // 8, np.nan)) for s in sizes])
    monkeypatch.setattr(backend, "multiprocessor_count", lambda: 2)
    return mem


# (x shape, num_output, kernel, pad, stride, dilation): 3x3 s1/s2 (unrolled variants), general sizes,
# multiplier 2, odd planes
CASES = [
    ((2, 3, 7, 6), 3, (3, 3), (1, 1), (1, 1), (1, 1)),
    ((1, 2, 7, 7), 2, (3, 3), (1, 1), (2, 2), (1, 1)),
    ((2, 2, 6, 5), 2, (3, 3), (0, 0), (2, 2), (1, 1)),
    ((1, 2, 8, 7), 4, (5, 5), (2, 2), (1, 1), (1, 1)),
    ((2, 2, 9, 8), 2, (3, 3), (2, 2), (1, 1), (2, 2)),
    ((1, 3, 6, 7), 3, (2, 3), (1, 0), (2, 1), (1, 1)),
    ((3, 1, 5, 5), 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    # BVLC's truncating output size: windows overhanging the input read zeros
    ((8, 2, 1, 1), 2, (2, 2), (0, 0), (2, 2), (1, 1)),
    ((4, 3, 2, 5), 3, (3, 3), (0, 0), (2, 2), (1, 1)),
]


def _depthwise_passes(prob, x, w, bias, y, dy, dx, dw, db):
    """Forward, then (when ``dx`` is given) the data gradient, then the weight gradient, through the
    engine runner as a layer calls it (scratch from the workspace)."""
    choice = conv_engines.Choice("depthwise", "depthwise", "depthwise")
    conv_engines.run(prob, choice, "forward", x, w, bias, y)
    if dx is not None:
        conv_engines.run(prob, choice, "backward_data", w, dy, dx)
    conv_engines.run(prob, choice, "backward_weight", x, dy, dw, db)


@pytest.mark.parametrize("min_chunk", [1 << 20, 1])  # one chunk per channel, or several (partials + reduce)
@pytest.mark.parametrize("shape,num_output,kernel,pad,stride,dilation", CASES)
def test_emulated_kernels_match_cpu_conv(mem, monkeypatch, shape, num_output, kernel, pad, stride, dilation,
                                         min_chunk):
    monkeypatch.setattr(conv_depthwise, "MIN_CHUNK", min_chunk)
    n, c, h, w = shape
    prob = ConvProblem(n, c, h, w, num_output, c, kernel, pad, stride, dilation, "<f8")
    assert conv_depthwise.supports(prob)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape)
    wt = rng.standard_normal((num_output, 1) + kernel)
    bias = rng.standard_normal(num_output)
    ho, wo = prob.out_hw
    dy = rng.standard_normal((n, num_output, ho, wo))
    want_y = np.empty((n, num_output, ho, wo))
    cpu_conv.forward(x, wt, bias, kernel, pad, stride, dilation, c, want_y)
    want_dw, want_db, want_dx = np.full(wt.shape, 0.5), np.full(num_output, 0.25), np.empty(shape)
    cpu_conv.backward(x, wt, dy, kernel, pad, stride, dilation, c, dweight=want_dw, dbias=want_db, dx=want_dx)

    px, pw_, pb, pdy = mem.put(x), mem.put(wt), mem.put(bias), mem.put(dy)
    py, pdx = mem.put(np.full(want_y.size, np.nan)), mem.put(np.full(x.size, np.nan))
    pdw, pdb = mem.put(np.full(wt.size, 0.5)), mem.put(np.full(num_output, 0.25))
    _depthwise_passes(prob, px, pw_, pb, py, pdy, pdx, pdw, pdb)
    got = mem.arrays
    np.testing.assert_allclose(got[py].reshape(want_y.shape), want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[pdx].reshape(shape), want_dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[pdw].reshape(wt.shape), want_dw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[pdb], want_db, rtol=1e-12, atol=1e-12)
    chunks = conv_depthwise.chunking(prob)[1]
    assert (chunks > 1) == (min_chunk == 1)

    _depthwise_passes(prob, px, pw_, None, py, pdy, None, pdw, None)  # no bias: weight gradient without the bias sum
    np.testing.assert_allclose(got[py].reshape(want_y.shape), want_y - bias[:, None, None], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[pdw].reshape(wt.shape), 2 * want_dw - 0.5, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[pdb], want_db, rtol=1e-12, atol=1e-12)


def test_chunking_covers_every_position(monkeypatch):
    monkeypatch.setattr(backend, "multiprocessor_count", lambda: 132)
    for n, c, h in ((32, 32, 112), (1, 960, 7), (32, 960, 7), (3, 5, 1)):
        prob = ConvProblem(n, c, h, h, c, c, (3, 3), (1, 1), (1, 1), (1, 1), "<f4")
        chunk, chunks = conv_depthwise.chunking(prob)
        total = n * h * -(-h // conv_depthwise.V)  # row vectors of V outputs (3x3, stride 1)
        assert chunk * chunks >= total > chunk * (chunks - 1)
        assert chunks == 1 or chunk >= conv_depthwise.MIN_CHUNK


def test_supports_only_depthwise():
    def prob(c, m, g):
        return ConvProblem(2, c, 8, 8, m, g, (3, 3), (1, 1), (1, 1), (1, 1), "<f4")

    assert conv_depthwise.supports(prob(4, 4, 4)) and conv_depthwise.supports(prob(4, 8, 4))
    assert not conv_depthwise.supports(prob(4, 4, 2)) and not conv_depthwise.supports(prob(4, 4, 1))


# (x shape, num_output, kernel, pad, stride): several tiles along H and W and over channels, ragged edges
DIRECT_CASES = [
    ((2, 5, 18, 17), 9, 3, 1, 1),
    ((1, 3, 35, 20), 4, 3, 1, 2),
    ((1, 2, 9, 11), 3, 1, 0, 1),
    ((3, 2, 13, 12), 10, 1, 1, 2),
    ((1, 2, 12, 19), 3, 5, 2, 1),
    ((1, 3, 15, 14), 2, 7, 3, 2),
    ((2, 2, 2, 2), 3, 3, 0, 2),  # (2 - 3) / 2 + 1 = 1: the window overhangs the input
]


@pytest.mark.parametrize("shape,num_output,k,pad,stride", DIRECT_CASES)
@pytest.mark.slow
def test_emulated_direct_forward_matches_cpu_conv(mem, shape, num_output, k, pad, stride):
    n, c, h, w = shape
    prob = ConvProblem(n, c, h, w, num_output, 1, (k, k), (pad, pad), (stride, stride), (1, 1), "<f8")
    assert conv_direct.supports(prob)
    rng = np.random.default_rng(4)
    x, wt, bias = rng.standard_normal(shape), rng.standard_normal((num_output, c, k, k)), rng.standard_normal(num_output)
    want = np.empty((n, num_output) + prob.out_hw)
    cpu_conv.forward(x, wt, bias, prob.kernel, prob.pad, prob.stride, prob.dilation, 1, want)
    px, pw_, pb, py = mem.put(x), mem.put(wt), mem.put(bias), mem.put(np.full(want.size, np.nan))
    direct = conv_direct.DirectEngine()
    direct.forward(prob, px, pw_, pb, py, [])
    np.testing.assert_allclose(mem.arrays[py].reshape(want.shape), want, rtol=1e-12, atol=1e-12)
    direct.forward(prob, px, pw_, None, py, [])
    np.testing.assert_allclose(mem.arrays[py].reshape(want.shape), want - bias[:, None, None], rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("change,ok", [({}, True), ({"num": 5}, False), ({"group": 2}, False),
                                       ({"kernel": (3, 5)}, False), ({"kernel": (9, 9)}, False),
                                       ({"stride": (3, 3)}, False), ({"stride": (1, 2)}, False),
                                       ({"dilation": (2, 2)}, False), ({"kernel": (7, 7), "num": 4}, True)])
def test_direct_supports(change, ok):
    args = dict(num=1, channels=4, height=16, width=16, num_output=8, group=1, kernel=(3, 3), pad=(1, 1),
                stride=(1, 1), dilation=(1, 1), dtype="<f4") | change
    assert conv_direct.supports(ConvProblem(**args)) == ok
